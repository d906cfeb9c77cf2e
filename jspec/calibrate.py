"""`python -m jspec.calibrate`, kept beside `jspec calibrate`: the command line is jspec.cli.calibrate."""

import sys

from jspec.cli.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
