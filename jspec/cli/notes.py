"""What the CLI says on stderr while it works: a slow phase as it starts, and with -v the library's log (the
"jspec" logger). Both go through tqdm.write, which lifts a job's progress bar off the line and draws it again below,
so a note never lands inside the bar."""

from __future__ import annotations

import logging
import sys


def say(phase: str) -> None:
    """A slow phase, as it starts: one line on stderr."""
    _write(f"jspec: {phase} ...")


def verbose() -> None:
    """Turns on the library's log (INFO, one line per phase) on stderr; once per process."""
    log = logging.getLogger("jspec")
    if not any(isinstance(h, _Handler) for h in log.handlers):
        handler = _Handler()
        handler.setFormatter(logging.Formatter("jspec: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write(self.format(record))
        except Exception:  # noqa: BLE001  logging's rule: a record that cannot be written never ends the run
            self.handleError(record)


def _write(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
    sys.stderr.flush()
