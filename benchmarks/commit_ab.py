"""The fused INT2 commit (jspec/pallas/int2_commit.py) alone, at the 8B shape: GPU time per call of each
Triton warp count, from a trace (session 15 measured one program per row for both keys and values too; their
own programs won, now the only layout).

In the 8B step at batch 1 / 128K the commit was 32 calls of ~7.8 us (0.25 ms per step, session 14's profile):
latency, not bytes. The cache buffers are donated
so that the kernel writes them in place, as in the step.

    PYTHONPATH=.:benchmarks python benchmarks/commit_ab.py --out DIR    # on the GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jspec.cache import kvcache
from jspec.kernels import int2_commit
from profile_step import gpu_kernels  # benchmarks/profile_step.py

H, D, WINDOW, T = 8, 128, 64 + 256, 131072 + 512
VARIANTS = {"default": {}, "warps2": dict(warps=2), "warps4": dict(warps=4)}


def time_variant(B: int, n: int, opts: dict, calls: int = 16) -> float:
    """Median GPU microseconds of one commit call (each call a kernel of its own in one traced program)."""
    rng = np.random.default_rng(0)
    bufs = (jnp.zeros((B, H, WINDOW, D), jnp.bfloat16), jnp.zeros((B, H, WINDOW, D), jnp.bfloat16),
            jnp.zeros((B, H, 2, T, D // 4), jnp.uint8), jnp.zeros((B, H, 4, T, 1), jnp.bfloat16))
    k, v = (jnp.asarray(rng.normal(size=(B, n, H, D)), jnp.bfloat16) for _ in range(2))
    slot = jnp.tile(jnp.arange(n, dtype=jnp.int32) + 70, (B, 1))
    hist = jnp.tile(jnp.arange(n, dtype=jnp.int32) + 131000, (B, 1))

    def many(bufs, k, v, slot, hist):
        for i in range(calls):
            (bufs,) = int2_commit.commit_int2((bufs,), k[None], v[None], slot + i % 2, hist + i, clip_k=0.96,
                                              clip_v=0.96, planes=kvcache.INT2_PLANES, **opts)
        return bufs

    many = jax.jit(many, donate_argnums=0)
    bufs = jax.block_until_ready(many(bufs, k, v, slot, hist))
    trace = f"/tmp/commit_trace_{B}_{n}_{'_'.join(f'{a}{b}' for a, b in opts.items())}"
    jax.profiler.start_trace(trace)
    for _ in range(4):
        bufs = jax.block_until_ready(many(bufs, k, v, slot, hist))
    jax.profiler.stop_trace()
    durs = [d for name, _, d, _ in gpu_kernels(trace) if "copy" not in name.lower()]
    return float(np.median(durs)) * 1e-3


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--points", default="1:1,8:1,1:5,64:1")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    rows = []
    for p in args.points.split(","):
        B, n = map(int, p.split(":"))
        for name in args.variants.split(","):
            try:
                rows.append(dict(B=B, n=n, variant=name, us=time_variant(B, n, VARIANTS[name])))
            except Exception as e:  # one failing variant must not lose the run
                rows.append(dict(B=B, n=n, variant=name, error=repr(e)[:300]))
            r = rows[-1]
            print(f"B {B:>3} n {n}  {name:>16}: " + (f"{r['us']:7.2f} us" if "us" in r else r["error"]), flush=True)
    json.dump(dict(device=str(jax.devices()[0]), rows=rows), open(os.path.join(args.out, "commit_ab.json"), "w"),
              indent=1)


if __name__ == "__main__":
    sys.exit(main())
