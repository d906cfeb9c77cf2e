"""Decode-step time of an 8B-shaped target: BF16 KV vs INT2 mixed KV (Pallas kernel), on one GPU.

    PYTHONPATH=. python benchmarks/decode.py --out $OUT/decode.json

    JAX_PLATFORMS=cpu PYTHONPATH=. python benchmarks/decode.py --smoke   # CPU check: tiny shapes, seconds

Random bf16 weights with Llama-3-8B shapes. A step = one target forward over one token per row plus
the commit of its K/V rows, jitted with the cache donated. Every figure is compared with the step
floor (weight bytes + KV bytes read) / the bandwidth the device really moves, measured in the same run:
the highest of a device copy (torch's where it runs, else XLA's x + 1, which understates it) and XLA's
own GEMV streaming a weight matrix, the pass a decode step makes over its weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig
from jspec.model import decoder as model, rotation
from jspec.runtime import sharding
from timing import median_time  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

LLAMA3_8B = ModelConfig("llama", 128256, 4096, 14336, 32, 32, 8, 128, rms_eps=1e-5, rope_theta=500000.0,
                        max_position=140000)


def copy_bandwidth(gib: float = 2.0) -> dict:
    """Device-to-device copy bandwidth in GB/s (bytes read + written per second), attention.copy_bandwidth's
    dict: torch's copy where torch runs on the GPU (about 4.1-4.3 TB/s on an H200; measured in a child process,
    so this one's GPU memory holds no torch context), else only XLA's x + 1 (2.6-2.9 TB/s there: floors judged
    against it come out above 100%)."""
    code = f"import json, attention; print(json.dumps(attention.copy_bandwidth({gib}, 10)))"
    here = Path(__file__).resolve().parent
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=os.pathsep.join([str(here.parent), str(here)]))
    err = "timed out"
    try:
        p = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True, timeout=120)
        err = p.stderr.strip()[-300:]
        copy = json.loads(p.stdout.strip().splitlines()[-1])
        if "torch_error" in copy:
            print("copy bandwidth without torch:", copy["torch_error"], flush=True)
        return copy
    except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError):
        print(f"copy bandwidth: no figure from the child ({err}); XLA's x + 1 in this process", flush=True)
        return xla_copy_bandwidth(gib)


def xla_copy_bandwidth(gib: float) -> dict:
    """XLA's x + 1 over `gib` GiB of bf16 in this process (bytes read + written per second, GB/s)."""
    x = jnp.ones((int(gib * 2**30) // 2,), jnp.bfloat16)
    f = jax.jit(lambda x: x + 1)
    gbps = 2 * x.nbytes / median_time(lambda: f(x)) / 1e9
    return dict(jax_elementwise_GBps=gbps, copy_GBps=gbps)


def stream_bandwidth(gib: float = 2.0) -> float:
    """GB/s of XLA's GEMV over a bf16 matrix of `gib` GiB (batch 1: the matrix's bytes read once, as a decode
    step reads its weights), the median of 10 calls."""
    w = jnp.ones((int(gib * 2**30) // (2 * 4096), 4096), jnp.bfloat16)
    x = jnp.ones((1, w.shape[0]), jnp.bfloat16)
    f = jax.jit(lambda x, w: x @ w)
    return w.nbytes / median_time(lambda: f(x, w)) / 1e9


def floor_bandwidth(gib: float = 2.0, torch: bool = True) -> dict:
    """The bandwidths measured (GB/s) and floor_GBps, the highest: what the device really moves (a lower one
    would put steps above 100% of their floor). torch=False: XLA's copy only (no child process)."""
    copy = copy_bandwidth(gib) if torch else xla_copy_bandwidth(gib)
    bw = dict(copy, xla_gemv_GBps=stream_bandwidth(gib))
    bw["floor_GBps"] = max(v for k, v in bw.items() if k.endswith("_GBps"))
    return bw


def kv_read_bytes(cfg: ModelConfig, kv: KVConfig, B: int, ctx: int) -> int:
    """KV bytes one decode step reads at context ctx (all layers)."""
    per_head = cfg.head_dim * 2  # bf16 bytes of one row
    if kv.int2:
        G = kv.group(cfg.head_dim)
        scale = 2 if kv.scale_dtype == "bfloat16" else 4
        int2_row = cfg.head_dim // 4 + 2 * (cfg.head_dim // G) * scale
        rows = kv.sink + kv.recent
        per_token = (ctx - rows) * int2_row + rows * per_head
    else:
        per_token = ctx * per_head
    return 2 * cfg.num_layers * B * cfg.num_kv_heads * per_token  # K and V


def kv_modes(params, cfg: ModelConfig) -> dict:
    """{"bf16": (KVConfig, attention impl, params), "int2": (...)}: the two caches the scripts compare.
    INT2 runs pay for the real R_K rotation of q and k (R_V is folded into the weights: free)."""
    rotated = rotation.apply_rotations(params, cfg, *rotation.hadamard_rotations(cfg))
    return {"bf16": (KVConfig("bf16"), "reference", params), "int2": (KVConfig("int2"), "pallas", rotated)}


def weight_bytes(params) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(params))


def make_step(cfg: ModelConfig, impl: str, n: int = 1, steps: int = 1, options: dict | None = None):
    """`steps` steps in one jitted call (a lax.fori_loop when > 1, as in the engine's decode loop), each
    a forward over n tokens per row (decode: 1; verification: K + 1) and the commit of all n rows.
    options: XLA's compiler options (model.compile_options, as the engine compiles with)."""
    def one(params, cache, tok):
        logits, (k, v) = model.forward(params, cfg, jnp.broadcast_to(tok[:, None], (tok.shape[0], n)), cache,
                                       attn_impl=impl)
        cache = kvcache.commit(cache, k, v, jnp.full_like(tok, n))
        return jnp.argmax(logits[:, -1], -1).astype(jnp.int32), cache

    def step(params, cache, tok):
        if steps == 1:
            return one(params, cache, tok)
        return jax.lax.fori_loop(0, steps, lambda i, c: one(params, c[1], c[0]), (tok, cache))

    return jax.jit(step, donate_argnums=1, compiler_options=options)


def capacity(ctx: int, n: int = 1, steps: int = 1) -> int:
    """Cache capacity for timing at context ctx: room for the 10 timed calls' commits (+ 64 spare)."""
    return ctx + 10 * steps * n + 64


def time_step(params, cfg, kv: KVConfig, B: int, ctx: int, impl: str, n: int = 1, steps: int = 1,
              mesh=None) -> float:
    """Median seconds per step (make_step) at context ctx; the commits advance it by 10 * steps * n.

    mesh: a jspec.runtime.sharding mesh; params (already placed) and the cache are sharded as the engine does."""
    cache = kvcache.init_cache(cfg, kv, B, capacity(ctx, n, steps), jnp.bfloat16)
    cache = cache.replace(length=jnp.full((B,), ctx, jnp.int32))
    tok = jnp.zeros((B,), jnp.int32)
    if mesh is not None:
        cache, tok = sharding.shard_cache(cache, mesh), sharding.shard_batch(tok, mesh)
    step = make_step(cfg, impl, n, steps, model.compile_options())
    state = {"cache": cache, "tok": tok}

    def run():
        with sharding.context(mesh):  # traced under the mesh: the Pallas kernel runs per shard
            state["tok"], state["cache"] = step(params, state["cache"], state["tok"])
        return state["tok"]

    return median_time(run, iters=8) / steps  # 2 warm-up + 8 timed calls; the cache is freed on return


def max_batch(cfg: ModelConfig, kv: KVConfig, ctx: int, free_bytes: int, steps: int = 1) -> int:
    """Largest batch whose cache fits in free_bytes (allocation size of init_cache, per row)."""
    one = jax.eval_shape(lambda: kvcache.init_cache(cfg, kv, 1, capacity(ctx, 1, steps), jnp.bfloat16))
    per_row = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(one.layers))
    return int(free_bytes // per_row)


SMOKE = ModelConfig("llama", 512, 256, 512, 2, 4, 2, 64, max_position=140000)  # --smoke: a CPU check of the script
NO_STATS_FREE = 2**30  # a device without memory stats (the CPU): the batches fit in 1 GiB of cache


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(default_out("decode.json")), help="JSON path (default: a scratch folder)")
    ap.add_argument("--contexts", default="8192,32768,65536,131072")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--time-budget", type=float, default=300, help="skip the remaining sizes after this")
    ap.add_argument("--steps", type=int, default=8, help="decode steps per jitted call (a fori_loop, as in "
                    "the engine); 1 times one dispatched call per step")
    ap.add_argument("--triton", action="store_true", help="also time INT2 with the Triton kernel (int2_triton); "
                    "int2 runs the kernel --attn pallas picks (Mosaic GPU on Hopper)")
    ap.add_argument("--smoke", action="store_true", help="a CPU check of the script: a tiny model, context 512, "
                    "batches 1 and 2, 2 steps per call")
    args = ap.parse_args(argv)
    if args.smoke:
        args.contexts, args.batches, args.steps = "512", "1,2", 2
    t_start = time.perf_counter()
    contexts = [int(c) for c in args.contexts.split(",")]
    # Contexts past Llama-3-8B's own are timing points only (1M: the INT2 history a 1M-token context
    # would hold, zeros written straight into the cache; a 1M-token prefill is not the point).
    base = SMOKE if args.smoke else LLAMA3_8B
    cfg = dataclasses.replace(base, max_position=max(base.max_position, max(contexts) + 1024))
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    wbytes = weight_bytes(params)
    bws = floor_bandwidth(1 / 32, torch=False) if args.smoke else floor_bandwidth()
    bw = bws["floor_GBps"] * 1e9
    print("bandwidth (GB/s)", {k: round(v) for k, v in bws.items() if k.endswith("_GBps")}, flush=True)
    stats = jax.devices()[0].memory_stats()
    free = stats["bytes_limit"] - stats["bytes_in_use"] - 4 * 2**30 if stats else NO_STATS_FREE  # 4 GiB workspace
    modes = kv_modes(params, cfg)
    if args.triton:
        modes["int2_triton"] = (modes["int2"][0], "triton", modes["int2"][2])
    rows = []
    # At 32K also each mode's largest batch: the throughput of a full GPU.
    max_32k = sorted({max_batch(cfg, kv, 32768, free, args.steps) for kv, _, _ in modes.values()})
    for ctx in contexts:
        batches = {int(b) for b in args.batches.split(",")} | (set(max_32k) if ctx == 32768 else set())
        if ctx > LLAMA3_8B.max_position:  # past the model's context: also the largest INT2 batch that fits
            batches.add(max(1, max_batch(cfg, modes["int2"][0], ctx, free, args.steps)))
        batches = sorted(batches)
        for B in batches:
            for name, (kv, impl, p) in modes.items():
                if max_batch(cfg, kv, ctx, free, args.steps) < B or time.perf_counter() - t_start > args.time_budget:
                    continue
                try:
                    t = time_step(p, cfg, kv, B, ctx, impl, steps=args.steps)
                except jax.errors.JaxRuntimeError as e:  # out of memory beside the computed fit: say so
                    rows.append(dict(ctx=ctx, batch=B, kv=name, error=str(e).splitlines()[0][:200]))
                    print(f"ctx {ctx:>6} B {B:>3} {name}: failed ({rows[-1]['error']})", flush=True)
                    continue
                floor = (wbytes + kv_read_bytes(cfg, kv, B, ctx)) / bw
                rows.append(dict(ctx=ctx, batch=B, kv=name, ms=t * 1e3, tok_s=B / t, floor_ms=floor * 1e3,
                                 floor_frac=floor / t))
                print(f"ctx {ctx:>6} B {B:>3} {name}: {t * 1e3:8.2f} ms  {B / t:8.0f} tok/s  "
                      f"floor {floor * 1e3:7.2f} ms ({floor / t:.0%})", flush=True)
                # after every row: a timeout loses nothing
                save(args.out, cfg, modes, bws, wbytes, free, rows, args.steps)
    above = [r for r in rows if r.get("floor_frac", 0) > 1]
    if above:  # a step faster than its floor: the bandwidth measured understates what the device moves
        print(f"warning: {len(above)} rows above their floor (floor bandwidth {bws['floor_GBps']:.0f} GB/s)")


def save(path, cfg, modes, bws, wbytes, free, rows, steps):
    fits = {f"{name}@{ctx}": max_batch(cfg, kv, ctx, free, steps) for ctx in (32768, 131072)
            for name, (kv, _, _) in modes.items()}
    result = dict(device=str(jax.devices()[0]), jax=jax.__version__, copy_bw_gbs=bws["copy_GBps"],
                  floor_bw_gbs=bws["floor_GBps"], bandwidths_gbs=bws, weight_bytes=wbytes, free_bytes=free,
                  steps_per_call=steps, max_batch=fits, rows=rows)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
