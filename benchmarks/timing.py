"""Timing shared by the benchmark scripts: warm up, then the median of synchronized runs."""

import statistics
import time

import jax


def median_time(fn, iters: int = 10, warmup: int = 2) -> float:
    """Median seconds of fn() over iters runs, each waited for with block_until_ready."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
