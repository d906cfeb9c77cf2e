"""Memory left to this process, host and device, and the check that a model's weights fit it before they are read
(for every checkpoint format: io/checkpoint, io/gguf)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from jspec.io.layout import CheckpointError


def check_memory(need: int, host: int | None, device: int | None, dtype, what: str) -> None:
    """CheckpointError when `need` bytes of weights in `dtype` exceed the free host or device memory (None:
    unknown): read anyway, they would take the memory until the process is killed. Says what would fit."""
    gib = lambda n: f"{n / 2**30:.1f} GiB"
    for where, free in (("host", host), ("device", device)):
        if free is not None and need > free:
            hint = " (--dtype bfloat16 halves it)" if np.dtype(dtype).itemsize > 2 else ""
            raise CheckpointError(
                f"{what}: its weights take {gib(need)} in {np.dtype(dtype).name}{hint}, more than the {gib(free)} of "
                f"{where} memory available: a model of at most {free / np.dtype(dtype).itemsize / 1e9:.2f}B "
                f"parameters fits")


def host_available() -> int | None:
    """Bytes of host memory this process may still take: MemAvailable, capped by a cgroup v2 limit (a container's);
    None where neither can be read."""
    free = []
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        free.append(int(info["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(free) if free else None


def device_available() -> int | None:
    """Bytes free on the default device where JAX reports them (memory_stats: GPUs), else None (the CPU's
    memory is the host's)."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001  a backend without memory statistics
        return None
    if "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
