"""`python -m jspec.calibrate`, kept beside `jspec calibrate`: the command line is jspec.model.calibrate."""

import sys

from jspec.model.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
