"""`python -m jspec.generate`, kept beside `jspec generate`: the command line is jspec.cli.generate."""

from jspec.cli.generate import run

if __name__ == "__main__":
    run()
