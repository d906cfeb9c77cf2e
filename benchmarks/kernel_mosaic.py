"""INT2 history kernel alone on the H200: Mosaic GPU (wgmma) vs Pallas-Triton vs a device copy.

Llama-3-8B attention shapes (32 query / 8 KV heads, D = 128): decode (1 position, M = 4 rows per KV
head) and verification of K = 4 (5 positions, M = 20), batch 1/8/64, contexts 32K/128K. Both kernels
return the splits' partials (merge=False, as the split attention path calls them). Each figure: the
median time of one call (8 calls per jit over rotating buffers), the bytes the call must read (codes,
scales, queries) over that time, and that bandwidth as a fraction of a device copy measured in the
same run; beside it the kernel alone (its GPU time in a jax.profiler trace of the same calls, without the
XLA kernels that prepare its inputs and finish its partials, and the gaps between launches). First a
correctness check of the Mosaic kernel on a masked, unaligned input.

    PYTHONPATH=. python benchmarks/kernel_mosaic.py --out DIR     # on the GPU; JSON only with --out
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

import attention as ab  # benchmarks/attention.py: copy ceiling, inputs, timer (sets PREALLOCATE=false)
import jax
import jax.numpy as jnp

from jspec.kernels import int2_triton as ia
from jspec.kernels.hopper import attention as im
from jspec.kernels.hopper.verify import verify_splits
from jspec.kernels.reference import int2_attention_reference

POINTS = [(8, 32768, 1), (8, 32768, 5), (1, 131072, 1), (1, 131072, 5), (64, 32768, 1), (64, 32768, 5),
          (8, 131072, 1), (8, 131072, 5), (1, 32768, 1), (1, 32768, 5), (64, 131072, 1), (64, 131072, 5)]
SWEEP = [dict(block_t=bt, stages=s, target=t) for bt, s, t in [
    (64, 4, 528), (128, 4, 528), (128, 2, 528), (128, 4, 264), (128, 4, 1056)]]


def config(n, **fields):
    """The body the entry picks for n positions (decode or verification), its fields set."""
    body = im.DecodeConfig if n * ab.G <= im.DECODE_MAX_ROWS else im.VerifyConfig
    return body(**fields)


def mosaic_call(B, T, n, **sweep):
    """The Mosaic kernel for n positions: the entry's default body and grid, or a SWEEP setting."""
    cfg = config(n)
    if sweep:
        ns = verify_splits(B, ab.HKV, T, sweep["block_t"], target=sweep["target"], round_down=False)
        cfg = config(n, block_t=sweep["block_t"], stages=sweep["stages"], num_splits=ns)
    lo = jnp.zeros((B, n * ab.G), jnp.int32)
    hi = jnp.full((B, n * ab.G), T, jnp.int32)
    return lambda q, codes, qp: im.int2_attention_mosaic(q, codes, qp, lo, hi, config=cfg, merge=False)


def triton_call(B, T, n):
    lo = jnp.zeros((B, n * ab.G), jnp.int32)
    hi = jnp.full((B, n * ab.G), T, jnp.int32)
    return lambda q, codes, qp: ia.int2_attention(q, codes, qp, lo, hi, merge=False)


def check(B, T, n, block_t):
    """Mosaic vs the f32 reference on a masked, unaligned range: relative error of out, max |d lse|."""
    qs, bufs = ab.int2_inputs(B, T, n, 1, False)
    lo = jnp.full((B, n * ab.G), 64, jnp.int32)
    hi = jnp.full((B, n * ab.G), T - 200, jnp.int32)
    out, lse = im.int2_attention_mosaic(qs[0], *bufs[0], lo, hi, config=config(n, block_t=block_t))
    ref, ref_lse = int2_attention_reference(qs[0], *bufs[0], lo, hi)
    return dict(rel=float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref)),
                lse=float(jnp.max(jnp.abs(lse - ref_lse))))


def kernel_seconds(attn, qs, bufs, names=("int2_attention",), reps: int = 3) -> float:
    """Seconds of GPU time per call of the kernels whose names hold one of names, from a jax.profiler trace of
    reps runs of the CALLS calls (ab._time_calls' program)."""
    from jax.profiler import ProfileData

    many = jax.jit(lambda qs, bufs: [attn(q, *bufs[i % len(bufs)]) for i, q in enumerate(qs)])
    jax.block_until_ready(many(qs, bufs))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(reps):
                jax.block_until_ready(many(qs, bufs))
        path = sorted(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True))[-1]
        planes = ProfileData.from_file(path).planes
        ns = sum(ev.duration_ns for plane in planes if plane.name.startswith("/device:GPU") for line in plane.lines
                 if "stream" in line.name.lower() for ev in line.events if any(k in ev.name for k in names))
    return ns / 1e9 / (reps * len(qs))


def measure(name, make, B, T, n, reps, copy_gbps, kernel=False):
    nbytes = ab.int2_bytes(B, T, n)
    try:
        nb = ab._n_buffers(nbytes)
        qs, bufs = ab.int2_inputs(B, T, n, nb, False)
        attn = make()
        t = ab._time_calls(attn, qs, bufs, reps)
        tk = kernel_seconds(attn, qs, bufs) if kernel else None
        del qs, bufs
        gbps = nbytes / t / 1e9
        row = dict(ms=t * 1e3, GBps=gbps, frac_copy=gbps / copy_gbps)
        if tk:
            row.update(kernel_ms=tk * 1e3, kernel_frac_copy=nbytes / tk / 1e9 / copy_gbps)
        return row
    except Exception as e:  # keep going: one failing variant must not lose the run
        return dict(error=repr(e)[:400])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="folder for kernel_mosaic.json (none: print only)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting new points after this")
    ap.add_argument("--no-sweep", action="store_true", help="the entry's default body and grid at every point")
    ap.add_argument("--smoke", action="store_true", help="a quick check of the script on a GPU: no sweep, two "
                    "points at batch 1 / 4K (Mosaic GPU has no interpret mode: nothing of it runs on a CPU)")
    args = ap.parse_args(argv)
    points = [(1, 4096, 1), (1, 4096, 5)] if args.smoke else POINTS
    args.no_sweep = args.no_sweep or args.smoke
    t0 = time.time()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    report = dict(device=str(jax.devices()[0]), jax=jax.__version__, checks={}, sweep=[], results=[])

    def dump():
        if args.out:
            with open(os.path.join(args.out, "kernel_mosaic.json"), "w") as f:
                json.dump(report, f, indent=1)

    report["copy"] = ab.copy_bandwidth(1 / 16 if args.smoke else 1.0, 10)
    copy = report["copy"]["copy_GBps"]
    print("copy", report["copy"], flush=True)
    for B, T, n, bt in [(2, 3001, 1, 64), (2, 3001, 5, 128), (1, 20000, 1, 128)]:
        try:
            report["checks"][f"B={B} T={T} n={n}"] = check(B, T, n, block_t=bt)
        except Exception as e:
            report["checks"][f"B={B} T={T} n={n}"] = repr(e)[:600]
        print("check", B, T, n, report["checks"][f"B={B} T={T} n={n}"], flush=True)
    dump()
    if not args.no_sweep:
        for o in SWEEP:
            for B, T, n in [(8, 32768, 1), (1, 131072, 1)]:
                r = dict(B=B, T=T, n=n, **o, **measure("mosaic", lambda: mosaic_call(B, T, n, **o), B, T, n,
                                                       args.reps, copy))
                report["sweep"].append(r)
                print("sweep", json.dumps(r), flush=True)
        dump()
    ok = [r for r in report["sweep"] if "ms" in r]
    best = {}
    if ok:  # the setting with the lowest mean time relative to the best at each point
        rel = {}
        for r in ok:
            key = tuple(r[k] for k in ("block_t", "stages", "target"))
            rel.setdefault(key, []).append(r["ms"] / min(x["ms"] for x in ok if x["B"] == r["B"] and x["T"] == r["T"]))
        full = [(sum(v) / len(v), k) for k, v in rel.items() if len(v) == 2]
        if full:
            best = dict(zip(("block_t", "stages", "target"), min(full)[1]))
    report["choice"] = best
    for B, T, n in points:
        if time.time() - t0 > args.budget_s:
            print("budget reached: skipping", B, T, n, flush=True)
            continue
        row = dict(B=B, T=T, n=n, bytes=ab.int2_bytes(B, T, n))
        row["mosaic"] = measure("mosaic", lambda: mosaic_call(B, T, n, **best), B, T, n, args.reps, copy, kernel=True)
        row["triton"] = measure("triton", lambda: triton_call(B, T, n), B, T, n, args.reps, copy, kernel=True)
        if "ms" in row["mosaic"] and "ms" in row["triton"]:
            row["speedup"] = row["triton"]["ms"] / row["mosaic"]["ms"]
        report["results"].append(row)
        print("point", json.dumps(row), flush=True)
        dump()
    print(f"copy {copy:.0f} GB/s; choice {best}; total {time.time() - t0:.0f} s")
    g = lambda r, k, f: r[k].get(f, float("nan"))
    print(f"{'B':>3} {'T':>7} {'n':>2} | {'mosaic ms':>9} {'%copy':>5} {'kernel':>7} {'%copy':>5} | {'triton ms':>9} "
          f"{'%copy':>5} {'kernel':>7} {'%copy':>5} | {'x':>5}")
    for r in report["results"]:
        cols = lambda k: (f"{g(r, k, 'ms'):9.4f} {100 * g(r, k, 'frac_copy'):5.1f} {g(r, k, 'kernel_ms'):7.4f} "
                          f"{100 * g(r, k, 'kernel_frac_copy'):5.1f}")
        print(f"{r['B']:>3} {r['T']:>7} {r['n']:>2} | {cols('mosaic')} | {cols('triton')} | "
              f"{r.get('speedup', float('nan')):5.2f}")
    for r in report["results"]:
        for k in ("mosaic", "triton"):
            if "error" in r[k]:
                print("error", r["B"], r["T"], r["n"], k, r[k]["error"][:200])


if __name__ == "__main__":
    sys.exit(main())
