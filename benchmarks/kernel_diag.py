"""Where the Mosaic INT2 kernel's time goes: the same kernel with one stage of its block body left out.

Each variant (int2_mosaic.ABLATIONS) is timed like benchmarks/kernel_mosaic.py (median per call, rotating
buffers, merge=False) at a few points; the difference to the full kernel is that stage's cost (stages
overlap, so the differences need not add up). The results of an ablated kernel are wrong by design.

    PYTHONPATH=.:benchmarks python benchmarks/kernel_diag.py --out DIR      # on the GPU

A/B of block bodies (or any option sets) in one run, kernel time from a trace; each row's difference is
to the first variant at its point:

    PYTHONPATH=.:benchmarks python benchmarks/kernel_diag.py --trace --variants body=warp,body=lean \
        --points 64:32768:1,8:131072:1,8:32768:1,1:131072:1 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import attention as ab  # benchmarks/attention.py: copy ceiling, inputs, timer
import jax
import jax.profiler
import jax.numpy as jnp

from jspec.kernels.hopper import attention as im

POINTS = [(64, 32768, 1), (8, 131072, 1), (8, 32768, 1), (1, 131072, 1), (64, 32768, 5)]


def parse_variant(v: str) -> dict:
    """'base', or ablations and key=value options joined by '+': 'empty+stages=8' -> kernel options."""
    opts, ablate = {}, []
    for part in v.split("+"):
        if part in im.ABLATIONS:
            ablate.append(part)
        elif "=" in part:
            k, x = part.split("=")
            opts[k] = x == "True" if x in ("True", "False") else int(x) if x.isdigit() else x
        elif part != "base":
            raise ValueError(f"variant part {part!r}: an ablation {im.ABLATIONS} or key=value")
    return dict(opts, ablate=tuple(ablate)) if ablate else opts


def kernel_share(fn, args, trace_dir) -> dict:
    """GPU time of one traced call of fn(*args): the Mosaic kernel's and the rest's (XLA fusions around it)."""
    from profile_step import gpu_kernels  # benchmarks/profile_step.py

    jax.block_until_ready(fn(*args))
    jax.profiler.start_trace(trace_dir)
    jax.block_until_ready(fn(*args))
    jax.profiler.stop_trace()
    ev = gpu_kernels(trace_dir)
    mine = sum(d for name, _, d, _ in ev if "int2" in name) * 1e-6
    # the kernel's launch as the profiler saw it: registers, shared memory, grid, theoretical occupancy
    details = next(({k: str(v) for k, v in st.items() if "occupancy" in k or k == "kernel_details"}
                    for name, _, _, st in ev if "int2" in name), {})
    return dict(kernel_ms=mine, other_ms=sum(d for _, _, d, _ in ev) * 1e-6 - mine, events=len(ev), details=details)


def splits_s14(B: int, H: int, T: int, BT: int) -> int:
    """Decode's grid rule of session 14 (int2_mosaic.decode_splits until session 15): about 1056 CTAs, none
    shorter than 4096 tokens unless that leaves fewer than 264 CTAs, at least 4 blocks each; for A/B runs."""
    heads = max(1, B * H)
    want = min(max(1, round(1056 / heads)), max(T // 4096, -(-264 // heads)))
    return max(1, min(want, T // (4 * BT)))


def mosaic_call(B, T, n, **opts):
    lo = jnp.zeros((B, n * ab.G), jnp.int32)  # the wrapper's default splits for the options' block size
    hi = jnp.full((B, n * ab.G), T, jnp.int32)
    # num_splits "ceil": 528 CTAs rounded up (decode's rule before session 14, every body's before session 10);
    # "s14": session 14's rule (splits_s14); "wN": decode_splits in waves of N CTAs.
    rule = str(opts.get("num_splits", ""))
    if rule in ("ceil", "s14") or rule.startswith("w"):
        body = opts.get("body", "auto")
        warp = body in ("warp", "lean", "lean8") or (body == "auto" and n * ab.G <= im.WARP_MAX_ROWS)
        BT = opts.get("block_t") or (im.WARP_BLOCK_T if warp else im.BLOCK_T)
        if rule == "ceil":
            opts["num_splits"] = im.default_splits(B, ab.HKV, T, BT, round_down=False)
        elif rule == "s14":
            opts["num_splits"] = splits_s14(B, ab.HKV, T, BT)
        else:
            opts["num_splits"] = im.decode_splits(B, ab.HKV, T, BT, wave=int(rule[1:]))
    return lambda q, codes, qp: im.int2_attention_mosaic(q, codes, qp, lo, hi, merge=False, **opts)


def time_point(B, T, n, variants, reps, copy_gbps, deadline, trace=False):
    nbytes = ab.int2_bytes(B, T, n)
    qs, bufs = ab.int2_inputs(B, T, n, ab._n_buffers(nbytes), False)
    rows = []
    for name, opts in variants:
        if time.time() > deadline:
            break
        row = dict(B=B, T=T, n=n, variant=name)
        try:
            attn = mosaic_call(B, T, n, **opts)
            t = ab._time_calls(attn, qs, bufs, reps)
            row.update(ms=t * 1e3, frac_copy=nbytes / t / 1e9 / copy_gbps)
            if trace:  # per call: the kernel alone, and the XLA work around it
                k = kernel_share(jax.jit(attn), (qs[0], *bufs[0]), f"/tmp/trace_{B}_{T}_{n}_{len(rows)}")
                row.update(k, kernel_frac_copy=nbytes / (k["kernel_ms"] * 1e-3) / 1e9 / copy_gbps)
        except Exception as e:  # one failing variant must not lose the run
            row["error"] = repr(e)[:400]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--points", default=",".join(f"{B}:{T}:{n}" for B, T, n in POINTS))
    ap.add_argument("--variants", default="base," + ",".join(im.ABLATIONS),
                    help="base, ablations, or key=value option sets joined by '+' (e.g. stages=2+block_t=128)")
    ap.add_argument("--trace", action="store_true", help="also the kernel's own GPU time (jax.profiler)")
    args = ap.parse_args(argv)
    deadline = time.time() + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    variants = [(v, parse_variant(v)) for v in args.variants.split(",")]
    report = dict(device=str(jax.devices()[0]), jax=jax.__version__, copy=ab.copy_bandwidth(1.0, 10), rows=[])
    copy = report["copy"]["copy_GBps"]
    print("copy", report["copy"], flush=True)
    for p in args.points.split(","):
        B, T, n = map(int, p.split(":"))
        report["rows"] += time_point(B, T, n, variants, args.reps, copy, deadline, args.trace)
        json.dump(report, open(os.path.join(args.out, "kernel_diag.json"), "w"), indent=1)
    first = {}  # the first variant's row at each point: the others' differences are to it
    for r in report["rows"]:
        first.setdefault((r["B"], r["T"], r["n"]), r)
    print(f"copy {copy:.0f} GB/s")
    for r in report["rows"]:
        f = first[r["B"], r["T"], r["n"]]
        d = f"{r['ms'] - f['ms']:+8.4f}" if f is not r and "ms" in r and "ms" in f else ""
        if "kernel_ms" in r and "kernel_ms" in f and f is not r:
            d += f" (kernel x{f['kernel_ms'] / r['kernel_ms']:.3f})"
        print(f"B={r['B']:>3} T={r['T']:>6} n={r['n']} {r['variant']:>12}: "
              + (f"{r['ms']:8.4f} ms {100 * r['frac_copy']:5.1f}% copy {d}" if "ms" in r else r["error"][:120])
              + (f" | kernel {r['kernel_ms']:.4f} ms {100 * r['kernel_frac_copy']:5.1f}% + other {r['other_ms']:.4f}"
                 if "kernel_ms" in r else ""))


if __name__ == "__main__":
    sys.exit(main())
