"""`python -m jspec.calibrate`, kept beside `jspec calibrate`: the command line is jspec.train.calibrate."""

import sys

from jspec.train.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
