"""JAX's persistent compilation cache as jspec runs it: size-bounded (or only read, where this process cannot
write), every program kept, torn entries replaced (jax_cache), and seeded with the shipped XLA autotuning
results of this jaxlib."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path

import jax

from jspec.files import atomic_write
from jspec.paths import AUTOTUNE_DIR
from jspec.runtime.startup import jax_cache, jax_patch


def use_compile_cache(path: str | Path, max_gib: float = 4.0) -> None:
    """Turns on JAX's persistent compilation cache in directory `path` for this process: a later process
    that needs a program of the same shapes loads it from there instead of compiling it. Every program
    is kept, the small ones too (the weight fold, the cache allocation), which would otherwise cost a
    compile each (a tenth of a second on GPU) at every start. Past max_gib, JAX evicts the least recently
    used programs. An entry that cannot be read (torn) is compiled again and replaced, and the cache's
    troubles are one warning line (jax_cache.Store). Mosaic GPU kernels lowered from now on are named by their
    content (jax_patch), so a later process finds the programs that hold them.

    Always with a size bound where this process may write: JAX's evicting cache keeps an access-time file
    beside each entry and fails every later write in a directory where an entry lacks one (as an unbounded
    cache writes them), so every writer of a directory must bound it. Entries an unbounded cache left
    (earlier jspec versions) get an access time now. A directory this process cannot write (jax_cache.writable)
    is only read: unbounded (a bounded cache takes a write lock even to read, which fails there) and never
    written (jax_cache.Store skips the writes; without it, a compile-time threshold no program reaches). A directory that cannot be created is one warning line, and no cache."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"warning: no compile cache: {e}; compiling every program", file=sys.stderr)
        return
    store = jax_cache.install()
    jax_patch.install()  # a Mosaic GPU kernel keyed by its content, whatever the process lowered before
    writable = jax_cache.writable(path)
    if writable:
        _stamp_entries(path)
        seed_autotune(path)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0 if writable or store else NEVER_S)
    jax.config.update("jax_compilation_cache_max_size", int(max_gib * 2**30) if writable else -1)


NEVER_S = 1e9  # a compile time no program reaches: JAX writes no entry


# XLA's GEMM autotuning results for the shipped pair's programs (the README command's) and the 8B-shaped
# benchmark program (benchmarks/startup.py's "8b+draft") on an H200, the files XLA's per-fusion autotune cache
# wrote (one small proto per fusion, in a subfolder per GPU kind, named by a hash of the fusion's HLO), packed
# as one JSON of base64 contents per jaxlib version. Autotuning is most of a cold compile: with them in place
# the cold README command took 22.1-22.6 s against 33.9 s, the 8B program's compile 14.9 s against 22.9 s (H200,
# docs/results.md). On another GPU or jaxlib no file matches and XLA autotunes as usual.
PER_FUSION = "xla_gpu_per_fusion_autotune_cache_dir"  # where JAX points XLA's autotune cache in its cache dir


def seed_autotune(path: Path, source: Path | None = None) -> int:
    """Writes the shipped autotuning results of this jaxlib (source: a JSON of relative path -> base64
    contents) into the per-fusion autotune folder of the compilation cache at `path`, keeping files that
    are there already. Returns the number of files written."""
    import jaxlib

    source = source or AUTOTUNE_DIR / f"jaxlib-{jaxlib.__version__}.json"
    written = 0
    try:
        files = json.loads(source.read_text()) if source.is_file() else {}
        for name, data in files.items():
            dst = path / PER_FUSION / name
            if not dst.exists():  # XLA never reads half a file
                atomic_write(dst, base64.b64decode(data))
                written += 1
    except (OSError, ValueError):  # an unwritable cache or a damaged file: XLA autotunes as without them
        pass
    return written


def _stamp_entries(path: Path) -> None:
    """Gives each `<key>-cache` entry without a `<key>-atime` file one (now, as 8 little-endian bytes of
    nanoseconds: the format of jax._src.lru_cache). Unwritable directories are left alone."""
    try:
        for entry in path.glob("*-cache"):
            atime = entry.with_name(entry.name.removesuffix("-cache") + "-atime")
            if not atime.exists():
                atime.write_bytes(time.time_ns().to_bytes(8, "little"))
    except OSError:
        pass
