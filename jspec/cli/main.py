"""The `jspec` command (and `python -m jspec`): `jspec generate ...`, `jspec calibrate ...`, `jspec --version`."""

from __future__ import annotations

import sys

import jspec

USAGE = """usage: jspec {generate,calibrate} [ARGS ...] | jspec --version

  jspec generate "def fibonacci(n):"     generate text (jspec generate --help)
  jspec calibrate --model DIR_OR_GGUF    fit a model's OSCAR KV rotations (jspec calibrate --help)
"""


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand; returns its exit status (generate exits the process itself: cli.generate.run)."""
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command in ("--version", "-V"):
        print(f"jspec {jspec.__version__}")
        return 0
    if command == "generate":
        from jspec.cli import generate

        generate.run(rest)
    if command == "calibrate":
        from jspec.cli import calibrate

        return calibrate.main(rest)
    if command in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    print(USAGE + (f"error: unknown command {command!r}\n" if command else "error: give a command\n"), end="",
          file=sys.stderr)
    return 2


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
