"""The store behind JAX's persistent compilation cache (jax._src.lru_cache.LRUCache), with what JAX 0.10.2 lacks.

A patch of JAX internals, kept here alone: JAX offers no hook for its store but the module function
jax._src.compilation_cache.get_file_cache, which `install` replaces (where JAX's internals are not those this was
written against, nothing is replaced and JAX's own store runs). Why it is needed:

- A torn entry is never replaced. JAX writes an entry in place, so a process killed (or a disk filled) while
  writing leaves half a file; every later read of it fails (a warning, then a compile), and the write after that
  compile is skipped because the key's file exists. Store replaces an entry it handed to JAX when JAX writes the
  same key again in this process: JAX writes a key only after compiling it, so only when the entry it read could
  not be used (torn, or unreadable otherwise). No entry is read twice to check it.
- Warnings: JAX warns in two lines per program (a torn entry, a failed write). Store says at most one `warning:`
  line per process, and JAX's own "Error reading persistent compilation cache entry" is silenced (Store reports
  the outcome: the entry replaced).
- A directory this process cannot write (os.access) is read without writing anything: compile_cache configures
  JAX so (no size bound: no write lock to read, no access-time files), and Store skips the writes JAX still asks
  for (a program the cache lacks), saying so once.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings

import jax

try:
    from jax._src import compilation_cache as _jax
    from jax._src.lru_cache import LRUCache
except ImportError:  # another JAX: its own store as it is
    _jax, LRUCache = None, object

CACHE, ATIME = "-cache", "-atime"  # the suffixes of an entry's two files (jax._src.lru_cache)


def writable(path) -> bool:
    """Whether this process may add entries to the cache directory `path` (os.access: root may write anywhere)."""
    return os.access(path, os.W_OK)


def install() -> bool:
    """Has JAX build its cache store as a Store (idempotent); False where JAX's internals differ (JAX's store is
    kept)."""
    if _jax is None or not callable(getattr(_jax, "get_file_cache", None)):
        return False
    if _jax.get_file_cache is not _file_cache:
        _jax.get_file_cache = _file_cache
        warnings.filterwarnings("ignore", message="Error reading persistent compilation cache entry",
                                module=r"jax\._src\.compiler")
    return True


def _file_cache(path: str):
    """jax._src.compilation_cache.get_file_cache, with a Store."""
    store = Store(path, max_size=jax.config.jax_compilation_cache_max_size)
    return (_jax.VerificationCache(store) if jax.config.jax_compilation_cache_check_contents else store), path


class Store(LRUCache):
    """JAX's store; an entry JAX could not use is replaced, a read-only directory only read, one warning line."""

    def __init__(self, path: str, *, max_size: int, **kwargs):
        self.writable = writable(path)
        super().__init__(path, max_size=max_size if self.writable else -1, **kwargs)  # -1: no lock, no atime files
        self._served: set[str] = set()  # keys whose entry this process handed to JAX
        self._said = threading.Lock()  # held for good once a line is printed

    def get(self, key: str) -> bytes | None:
        try:
            value = super().get(key)
        except OSError as e:  # unreadable, or the write lock timed out (filelock.Timeout is an OSError)
            self._warn(f"could not be read ({e}); compiling the programs instead")
            return None
        if value is not None:
            self._served.add(key)
        return value

    def put(self, key: str, value: bytes) -> None:
        damaged = key in self._served  # read in this process, yet compiled again: JAX could not use the entry
        self._served.discard(key)
        if not self.writable:
            self._warn("is read-only: compiling the programs it lacks " +
                       ("(it holds a damaged one) " if damaged else "") + "without keeping them")
            return
        if self.eviction_enabled and len(value) > self.max_size:
            self._warn(f"is smaller than a program of {len(value) / 2**30:.1f} GiB: not kept (--compile-cache-gib)")
            return
        try:
            if damaged:
                with self.lock.acquire(timeout=self.lock_timeout_secs) if self.eviction_enabled else \
                        contextlib.nullcontext():
                    (self.path / f"{key}{CACHE}").unlink(missing_ok=True)
            super().put(key, value)
        except OSError as e:
            self._warn(f"could not be written ({e}); the programs are compiled again next time")
            return
        if damaged:
            self._warn(f"held a damaged entry ({key}): compiled again and replaced")

    def _warn(self, what: str) -> None:
        if self._said.acquire(blocking=False):
            print(f"warning: the compile cache {self.path} {what}", file=sys.stderr)
