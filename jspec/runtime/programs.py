"""Compiled programs kept on disk under a key known before tracing, so a warm start skips trace and lower.

JAX's persistent compilation cache keys a program by its lowered module: a process that finds it there
has still traced and lowered the whole program (2 s of a 6 s warm start of the README command on an
H200 host), only to learn the key. This store keys the serialized executable
(jax.experimental.serialize_executable) by what decides the program before tracing: jspec's own source,
the JAX and jaxlib versions, the devices, the XLA flags, and the arguments' tree (static fields
included: configs, lookahead, attention path) with each leaf's shape, dtype and sharding. It lives
beside JAX's cache, in `<jax_compilation_cache_dir>/jspec-programs` (so it is on when JAX's is, on GPUs:
compile_cache.use_compile_cache, the CLI's --compile-cache; see `directory`), bounded like it: past JAX's size
limit the least recently used programs go. An entry that cannot be read back (a torn write, another
jaxlib) is compiled again and replaced.

Whether a build was a compile or a cache read is counted here (cache_counts: JAX's monitoring events and this
store's reads), and a program built once is marked in the cache directory by its pre-trace key (seen, mark_seen),
so that a later process can say before tracing whether it expects to compile or to read the program back.

Entries are pickles (JAX's serialized executables are pickles themselves), and unpickling runs code: as ssh
does with keys, an entry is read only when it and its directory belong to this user and nobody else may write
them (else compiled again, with one warning line per directory); the store is written owner-only.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import pickle
import stat
import sys
import threading
from pathlib import Path

import jax
import jaxlib
from jax.experimental import serialize_executable

from jspec.config import default_platform
from jspec.files import atomic_write
from jspec.runtime.startup import mosaic_keys
from jspec.paths import PACKAGE

SUFFIX = ".program"
SEEN = "jspec-seen"  # the cache directory's folder of marks: one empty file per program key built (mark_seen)
_REQUESTS, _HITS = "/jax/compilation_cache/compile_requests_use_cache", "/jax/compilation_cache/cache_hits"
_counts = {"requests": 0, "hits": 0}
_counting = threading.Lock()  # the listener runs in each compiling thread (compile_all)


def _count(event: str, hit: bool = False, **_) -> None:
    """A compile that asked a compilation cache (JAX's events; this store's reads with hit=True) and its hits."""
    if event in (_REQUESTS, _HITS):
        with _counting:
            _counts["requests" if event == _REQUESTS else "hits"] += 1
            _counts["hits"] += hit


jax.monitoring.register_event_listener(_count)


def cache_counts() -> tuple[int, int]:
    """(compiles that asked a compilation cache, those it answered) so far in this process: a build whose deltas
    are equal and non-zero was read back whole, not compiled."""
    with _counting:
        return _counts["requests"], _counts["hits"]


def _marks() -> Path | None:
    root = jax.config.jax_compilation_cache_dir
    return Path(root) / SEEN if root else None


def seen(args, options: dict | None = None) -> bool:
    """Whether a program of these arguments was built and marked (mark_seen) with the current compilation cache: a
    guess that it will be read back (the cache may have evicted it since)."""
    where = _marks()
    return where is not None and (where / key((args, options))).exists()


def mark_seen(args, options: dict | None = None) -> None:
    """Marks the program of these arguments as built with the current compilation cache (nothing if it is off or
    cannot be written)."""
    where = _marks()
    if where is None or not os.access(where.parent, os.W_OK):
        return
    try:
        where.mkdir(exist_ok=True)
        (where / key((args, options))).touch()
    except OSError:
        pass


def directory() -> Path | None:
    """Where programs are kept: beside JAX's persistent cache when it is on, on GPUs only, else None.

    Not on the CPU: there a program read back in the process that wrote it failed when run (`NOT_FOUND:
    Function slice_convert_fusion.11 not found`): XLA:CPU links its programs into one
    in-process JIT, where two copies of a program clash. A GPU program is a module of its own."""
    root = jax.config.jax_compilation_cache_dir
    return Path(root) / "jspec-programs" if root and default_platform() == "gpu" else None


@functools.cache
def source_digest(*parts: str) -> str:
    """A digest of jspec's source files (those of the package's top-level `parts`, files or folders, if given): a
    program compiled by other code is never read back."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE)
        if not parts or name.parts[0] in parts:
            h.update(name.as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def key(args) -> str:
    """The program key of jitted-function arguments `args` (any pytree of arrays and static fields)."""
    leaves, tree = jax.tree.flatten(args)
    parts = [source_digest(), jax.__version__, jaxlib.__version__, os.environ.get("XLA_FLAGS", ""),
             str(jax.config.jax_enable_x64), str(jax.config.jax_default_matmul_precision),
             repr([(d.platform, d.device_kind, d.id) for d in jax.devices()]), str(tree)]
    parts += [f"{x.shape}{x.dtype}{getattr(x, 'weak_type', False)}{getattr(x, 'sharding', None)}"
              if hasattr(x, "shape") else repr(x) for x in leaves]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def compiled(jitted, *args, options: dict | None = None):
    """jitted compiled for args: read from the store when it holds the program (no trace, no lower),
    else lowered, compiled and kept there. Without a store (JAX's cache off, or not a GPU), compiled as usual.
    options: XLA's compiler options (model.compile_options)."""
    [program] = compiled_together([args], lambda: [jitted.lower(*args)], options)
    return program


def compiled_together(keys: list, lower, options: dict | None = None):
    """The programs keyed by the arguments in `keys` (key): each read from the store when it holds it (side
    by side, as compile_all: loading a program onto the GPU also takes seconds for an 8B one); when any is
    missing, lower() gives all of them lowered (in the order of keys) and the missing ones are compiled side
    by side (compile_all) with the compiler options and kept."""
    where = directory()
    paths = [None if where is None else where / f"{key((k, options))}{SUFFIX}" for k in keys]
    found = _side_by_side(_read, paths)
    if all(p is not None for p in found):
        return found
    lowered = lower()
    missing = [i for i, p in enumerate(found) if p is None]
    for i, program in zip(missing, compile_all([lowered[i] for i in missing], [options] * len(missing))):
        found[i] = program
        if paths[i] is not None:
            _keep(paths[i], program)
    return found


def compile_all(lowered: list, options: list | None = None) -> list:
    """The lowered programs compiled (each with its compiler options, if any), side by side in threads when there
    are several: XLA compiles without the GIL, and its passes over one program run on one thread. The Mosaic GPU
    kernels they call are compiled first, each alone (mosaic_keys.prime): else a kernel waits for every other
    XLA compile in the process to end."""
    mosaic_keys.prime()
    compile = lambda x, opts: x.compile() if opts is None else x.compile(compiler_options=opts)
    return _side_by_side(lambda x: compile(*x), list(zip(lowered, options or [None] * len(lowered))))


def _side_by_side(fn, items: list) -> list:
    """[fn(x) for x in items], in threads when there are several (fn releases the GIL: XLA's compile, load)."""
    if len(items) < 2:
        return [fn(x) for x in items]
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


def _read(path: Path | None):
    """The program kept at path, or None: absent, torn or from another runtime (a store never breaks a run)."""
    if path is None or not path.exists():
        return None
    problem = untrusted(path)
    if problem:
        _warn_untrusted(path.parent, problem)
        return None
    try:
        program = serialize_executable.deserialize_and_load(*pickle.loads(path.read_bytes()))
        os.utime(path)  # recently used
        _count(_REQUESTS, hit=True)
        return program
    except Exception:  # noqa: BLE001
        return None


def untrusted(path: Path) -> str | None:
    """Why an entry must not be unpickled (None: it may be): the file or its directory is not this user's, the
    file is not a regular one (a link), or either is writable by group or others."""
    try:
        for p, kind in ((path, "file"), (path.parent, "directory")):
            st = p.lstat() if kind == "file" else p.stat()
            if kind == "file" and not stat.S_ISREG(st.st_mode):
                return f"{p} is not a regular file"
            if st.st_uid != os.getuid():
                return f"{kind} {p} is owned by another user"
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return f"{kind} {p} is writable by other users (chmod go-w)"
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    return None


@functools.cache
def _warn_untrusted(directory: Path, problem: str) -> None:
    print(f"warning: not reading compiled programs from {directory}: {problem}; compiling them instead",
          file=sys.stderr)


def _keep(path: Path, program) -> None:
    try:
        blob = pickle.dumps(serialize_executable.serialize(program))
    except Exception:  # noqa: BLE001  a program this runtime cannot serialize is not kept (JAX's cache still is)
        return
    _write(path, blob)


def _write(path: Path, blob: bytes) -> None:
    """Written atomically (another process may read it), then the oldest programs evicted past JAX's
    cache size limit; a store that cannot be written is skipped."""
    try:
        atomic_write(path, blob, private=True)
        limit = jax.config.jax_compilation_cache_max_size
        entries = sorted(path.parent.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True)
        total = 0
        for entry in entries:
            total += entry.stat().st_size
            if 0 < limit < total and entry != path:
                entry.unlink(missing_ok=True)
    except OSError:
        pass
