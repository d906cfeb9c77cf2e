"""`python -m jspec`: the `jspec` command (jspec.cli.main)."""

from jspec.cli.main import run

if __name__ == "__main__":
    run()
