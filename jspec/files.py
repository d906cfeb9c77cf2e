"""Files: what a path is, and files other processes may read while they are written."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def atomic_write(path: Path, data: bytes | str, private: bool = False) -> None:
    """Writes path whole or not at all: a reader sees the old file or the new one, never half of either (written
    beside it, then renamed over it). private: the directory made 0700 and the file 0600, never through a
    symbolic link (what is read back from it must be this user's alone). OSError is the caller's to handle."""
    path.parent.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name[:128]}.{os.getpid()}.tmp")  # cut: a name near NAME_MAX still has a temp name
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        with os.fdopen(os.open(tmp, flags, 0o600 if private else 0o666), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(path: Path) -> str:
    """What path is, in words: "a regular file", "a directory", "a pipe", "a character device", ..., "a symbolic
    link loop", or "missing" (a dangling symbolic link included)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return "a symbolic link loop" if e.errno == errno.ELOOP else "missing"
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def require(path: Path, what: str, *kinds: str) -> str:
    """path's kind (kind), which must be one of kinds ("a regular file" if none given): FileNotFoundError when it
    is missing, ValueError naming what it is otherwise ("--rotations '/dev/null' is a character device ...")."""
    found, want = kind(path), kinds or ("a regular file",)
    if found == "missing":
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    if found not in want:
        raise ValueError(f"{what} {str(path)!r} is {found}, not {' or '.join(want)}")
    return found


def same(a: Path, b: Path) -> bool:
    """Whether a and b name one file in any spelling: the same device and inode where both exist (symbolic and hard
    links), else the same path with every symbolic link resolved."""
    try:
        sa, sb = os.stat(a), os.stat(b)
        return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
    except OSError:
        try:
            return Path(a).resolve() == Path(b).resolve()
        except (OSError, RuntimeError):  # a symbolic link loop: not a file to compare
            return False
