"""Files other processes may read while they are written."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes | str, private: bool = False) -> None:
    """Writes path whole or not at all: a reader sees the old file or the new one, never half of either (written
    beside it, then renamed over it). private: the directory made 0700 and the file 0600, never through a
    symbolic link (what is read back from it must be this user's alone). OSError is the caller's to handle."""
    path.parent.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        with os.fdopen(os.open(tmp, flags, 0o600 if private else 0o666), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
