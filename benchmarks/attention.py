"""Decode/verify attention on the H200: the INT2 history kernel vs BF16 attention (cuDNN and XLA).

Llama-3-8B attention shapes (32 query / 8 KV heads, D = 128), 1 query position (decode) and 5 (K = 4
verification), contexts 4K..128K, batch 1/8/32. Each figure is the median time of one call, the
bandwidth over the bytes that implementation must read, and that bandwidth as a fraction of a
device-to-device copy measured in the same run. The BF16 baselines attend all 5 queries to the whole
context (no mask): the same bytes as the masked verify step.

    PYTHONPATH=. python benchmarks/attention.py --sweep --out DIR     # on the GPU
    PYTHONPATH=. python benchmarks/attention.py --v3 --reps 10 --budget-s 150 --out DIR  # v3 sweep + table
    PYTHONPATH=. python benchmarks/attention.py --smoke               # CPU: tiny, interpret mode
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the process

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from timing import median_time  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from jspec.kernels import int2_triton as ia
from jspec.kernels.reference import int2_attention_reference
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

HQ, HKV, D = 32, 8, 128
G = HQ // HKV
L2_BYTES = 60e6
CALLS = 8  # attention calls per timed jit: amortises dispatch, rotates buffers past L2


def copy_bandwidth(gib: float = 2.0, reps: int = 20) -> dict:
    """Device-to-device copy (read + write bytes / time): torch copy_ if present, and a JAX x + 1."""
    res = {}
    n = int(gib * 2**30) // 2
    try:
        import torch

        a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        ts = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            b.copy_(a)
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1) / 1e3)
        res["torch_copy_GBps"] = 2 * a.numel() * 2 / statistics.median(ts) / 1e9
        del a, b
        torch.cuda.empty_cache()
    except Exception as e:  # no torch / no CUDA: fall back to the JAX figure
        res["torch_error"] = repr(e)[:200]
    x = jax.random.normal(jax.random.key(0), (n,), jnp.bfloat16)
    f = jax.jit(lambda x: x + 1)
    t = median_time(lambda: f(x), reps)
    res["jax_elementwise_GBps"] = 2 * x.size * 2 / t / 1e9
    res["copy_GBps"] = res.get("torch_copy_GBps", res["jax_elementwise_GBps"])
    return res


def _n_buffers(nbytes: int) -> int:
    return max(1, min(CALLS, math.ceil(4 * L2_BYTES / nbytes)))


def _time_calls(attn, qs, bufs, reps: int) -> float:
    """Median seconds per attention call: CALLS calls in one jit, call i reads buffer set i % nb."""

    @jax.jit
    def many(qs, bufs):
        return [attn(q, *bufs[i % len(bufs)]) for i, q in enumerate(qs)]

    return median_time(lambda: many(qs, bufs), reps) / len(qs)


def _keys(seed, shape, dtype=jnp.bfloat16):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def int2_inputs(B, T, n, nb, words):
    """nb buffer sets of packed K/V history for B rows of T tokens; queries rows [B, Hkv, n*G, D]."""
    def one(seed):  # the cache's layout: codes [B, H, 2, T, D/4], qparams [B, H, 4, T, 1]
        kc, ks, kz = jax.random.split(jax.random.key(seed), 3)
        codes = jax.random.bits(kc, (B, HKV, 2, T, D // 4), jnp.uint8)
        scale = jax.random.uniform(ks, (B, HKV, 2, 1, T, 1), jnp.float32, 0.05, 0.5)
        zero = jax.random.uniform(kz, (B, HKV, 2, 1, T, 1), jnp.float32, 0, 3)
        qparams = jnp.concatenate([scale, zero], 3).reshape(B, HKV, 4, T, 1).astype(jnp.bfloat16)
        return (ia.as_words(codes) if words else codes), qparams

    bufs = [one(100 + i) for i in range(nb)]
    qs = [_keys(i, (B, HKV, n * G, D)) for i in range(CALLS)]
    return qs, bufs


def int2_bytes(B, T, n):
    return B * HKV * T * (2 * D // 4 + 4 * 2) + 2 * B * n * HQ * D * 2


def bf16_bytes(B, T, n):
    return 2 * B * T * HKV * D * 2 + 2 * B * n * HQ * D * 2


_INPUTS = {}  # (B, T, n, stored words) -> (qs, bufs, nb): reused across sweep variants


def time_int2(B, T, n, reps, words=False, interpret=False, words_in_jit=False, **opts):
    """words: codes stored as uint32; words_in_jit: stored uint8, viewed as uint32 inside the jit."""
    key = (B, T, n, words and not words_in_jit)
    if key not in _INPUTS:
        _INPUTS.clear()  # one input set alive at a time
        nb = _n_buffers(int2_bytes(B, T, n))
        _INPUTS[key] = (*int2_inputs(B, T, n, nb, key[3]), nb)
    qs, bufs, nb = _INPUTS[key]
    lo = jnp.zeros((B, n * G), jnp.int32)
    hi = jnp.full((B, n * G), T, jnp.int32)
    view = ia.as_words if words_in_jit else (lambda c: c)
    config = ia.config_for(n * G, **opts)  # TritonConfig fields: block_t, min_rows, num_warps, ...

    def attn(q, codes, qparams):
        return ia.int2_attention(q, view(codes), qparams, lo, hi, config=config, words=words, interpret=interpret)

    return _time_calls(attn, qs, bufs, reps), nb


def time_bf16(B, T, n, reps, implementation):
    nb = _n_buffers(bf16_bytes(B, T, n))
    bufs = [(_keys(100 + 2 * i, (B, T, HKV, D)), _keys(101 + 2 * i, (B, T, HKV, D))) for i in range(nb)]
    qs = [_keys(i, (B, n, HQ, D)) for i in range(CALLS)]
    attn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation=implementation)
    return _time_calls(attn, qs, bufs, reps), nb


def check_int2(B, T, n, words, interpret=False, **opts):
    """Compiled kernel vs the f32 reference on one random input: relative error."""
    qs, bufs = int2_inputs(B, T, n, 1, words)
    lo = jnp.full((B, n * G), 64, jnp.int32)
    hi = jnp.full((B, n * G), T - 200, jnp.int32)
    out, _ = ia.int2_attention(qs[0], *bufs[0], lo, hi, config=ia.config_for(n * G, **opts), words=words,
                               interpret=interpret)
    ref, _ = int2_attention_reference(qs[0], *bufs[0], lo, hi)
    return float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))


SWEEP = [dict(block_t=bt, num_warps=w, num_stages=s) for bt, w, s in
         [(64, 4, 3), (128, 4, 3), (256, 4, 3), (64, 2, 3)]]


def sweep(B, T, reps) -> list[dict]:
    rows = []
    for n in (1, 5):
        for words in (False, True):
            for opts in SWEEP:
                try:
                    t, _ = time_int2(B, T, n, reps, words=words, **opts)
                    rows.append(dict(B=B, T=T, n=n, words=words, **opts, ms=t * 1e3,
                                     GBps=int2_bytes(B, T, n) / t / 1e9))
                except Exception as e:
                    rows.append(dict(B=B, T=T, n=n, words=words, **opts, error=repr(e)[:300]))
                print("sweep", rows[-1], flush=True)
    return rows


def best_opts(rows, n):
    ok = [r for r in rows if r["n"] == n and "ms" in r]
    if not ok:
        return False, {}
    r = min(ok, key=lambda r: r["ms"])
    return r["words"], dict(block_t=r["block_t"], num_warps=r["num_warps"], num_stages=r["num_stages"])


def bench(contexts, batches, reps, choice, copy_gbps, deadline, results, dump, impls=("int2", "cudnn", "xla"),
          points=None):
    points = points or [(T, B, n) for T in contexts for B in batches for n in (1, 5)]
    for T, B, n in points:
        if time.time() > deadline:
            print("deadline reached: skipping the rest", flush=True)
            return
        row = dict(B=B, T=T, n=n)
        words, opts = choice[n]
        run = [("int2", lambda: time_int2(B, T, n, reps, words=words, **opts), int2_bytes(B, T, n)),
               ("cudnn", lambda: time_bf16(B, T, n, reps, "cudnn"), bf16_bytes(B, T, n)),
               ("xla", lambda: time_bf16(B, T, n, reps, "xla"), bf16_bytes(B, T, n))]
        for name, fn, nbytes in [x for x in run if x[0] in impls]:
            try:
                t, nb = fn()
                gbps = nbytes / t / 1e9
                row[name] = dict(ms=t * 1e3, GBps=gbps, frac_copy=gbps / copy_gbps, bytes=nbytes,
                                 buffers=nb, l2_resident=nb * nbytes < 2 * L2_BYTES)
            except Exception as e:
                row[name] = dict(error=repr(e)[:300])
        if "ms" in row["int2"] and "ms" in row.get("cudnn", {}):
            row["speedup_vs_cudnn"] = row["cudnn"]["ms"] / row["int2"]["ms"]
        if "ms" in row["int2"] and "ms" in row.get("xla", {}):
            row["speedup_vs_xla"] = row["xla"]["ms"] / row["int2"]["ms"]
        results.append(row)
        print("bench", json.dumps(row), flush=True)
        dump()


def table(results) -> str:
    lines = [f"{'B':>3} {'T':>7} {'n':>2} | {'int2 ms':>8} {'GB/s':>6} {'%copy':>5} | {'cudnn ms':>8} "
             f"{'%copy':>5} | {'xla ms':>8} | {'x cudnn':>7} {'x xla':>6}"]
    g = lambda r, k, f: r.get(k, {}).get(f, float("nan"))
    for r in sorted(results, key=lambda r: (r["n"], r["B"], r["T"])):
        lines.append(
            f"{r['B']:>3} {r['T']:>7} {r['n']:>2} | {g(r, 'int2', 'ms'):8.3f} {g(r, 'int2', 'GBps'):6.0f} "
            f"{100 * g(r, 'int2', 'frac_copy'):5.1f} | {g(r, 'cudnn', 'ms'):8.3f} {100 * g(r, 'cudnn', 'frac_copy'):5.1f}"
            f" | {g(r, 'xla', 'ms'):8.3f} | {r.get('speedup_vs_cudnn', float('nan')):7.2f} "
            f"{r.get('speedup_vs_xla', float('nan')):6.2f}")
    return "\n".join(lines)


# v3: decode row tiles below 16 rows, warps, block sizes, stages, u8 vs words, then splits at B=1.
V3_N1 = [dict(min_rows=r, block_t=bt, num_warps=w, num_stages=st, words=wd) for r, bt, w, st, wd in [
    (16, 64, 4, 3, True), (8, 64, 4, 3, True), (8, 64, 2, 3, True), (8, 64, 1, 3, True), (4, 64, 1, 3, True),
    (4, 64, 2, 3, True), (8, 128, 2, 3, True), (8, 128, 4, 3, True), (8, 256, 4, 3, True), (8, 64, 2, 3, False),
    (8, 64, 2, 4, True)]]
V3_N5 = [dict(min_rows=16, block_t=bt, num_warps=w, num_stages=st, words=True) for bt, w, st in [
    (64, 2, 3), (64, 1, 3), (32, 2, 3), (128, 2, 3), (64, 4, 3), (64, 2, 4)]]
V3_SPLITS = [dict(target_programs=t, min_blocks=mb) for t, mb in [(528, 4), (264, 4), (1056, 4), (2112, 2)]]
# Table order: the headline points first (the run stops at its deadline).
V3_POINTS = [(32768, 8, 1), (32768, 8, 5), (131072, 8, 1), (131072, 8, 5), (131072, 1, 1), (131072, 1, 5),
             (32768, 1, 1), (32768, 1, 5), (32768, 32, 1), (131072, 32, 1), (32768, 32, 5), (131072, 32, 5),
             (65536, 8, 1), (65536, 8, 5)]
V3_DEADLINES = dict(n1=55, n5=80, splits=105)  # seconds since start; the table runs to --budget-s


def _measure(B, T, n, reps, opts, tag, rows):
    opts = dict(opts)
    words = opts.pop("words", True)
    try:
        t, _ = time_int2(B, T, n, reps, words=words, **opts)
        row = dict(tag=tag, B=B, T=T, n=n, words=words, **opts, ms=t * 1e3, GBps=int2_bytes(B, T, n) / t / 1e9)
    except Exception as e:
        row = dict(tag=tag, B=B, T=T, n=n, words=words, **opts, error=repr(e)[:300])
    rows.append(row)
    print("sweep", json.dumps(row), flush=True)
    return row


def v3(args, report, dump, t_start):
    report["version"] = "v3"
    report["copy"] = copy_bandwidth(1.0, 10)
    copy_gbps = report["copy"]["copy_GBps"]
    print("copy", report["copy"], flush=True)
    rows = report["sweep"]
    budget = lambda: time.time() - t_start
    best = {}
    for n, variants in ((1, V3_N1), (5, V3_N5)):  # stage 1: B=8, T=32K
        for i, o in enumerate(variants):
            if budget() > V3_DEADLINES[f"n{n}"]:
                print("stage-1 deadline", n, i, flush=True)
                break
            _measure(8, 32768, n, 10, o, "tile", rows)
        ok = sorted((r for r in rows if r["n"] == n and "ms" in r), key=lambda r: r["ms"])
        for r in ok:  # the fastest variant that is also correct on an unaligned, masked input
            o = {k: r[k] for k in ("min_rows", "block_t", "num_warps", "num_stages")}
            try:
                err = check_int2(2, 3001, n, r["words"], **o)
            except Exception as e:
                err = repr(e)[:200]
            report["checks"][f"n={n} {o}"] = err
            print("check", n, o, err, flush=True)
            if isinstance(err, float) and err <= 1e-2:
                best[n] = dict(words=r["words"], **o)
                break
        dump()
    if 1 in best:  # stage 2: splits at B=1, n=1 (the grid is B x 8 heads x splits); n=5 takes the same
        for T in (131072, 32768):
            for o in V3_SPLITS:
                if budget() < V3_DEADLINES["splits"]:
                    _measure(1, T, 1, 10, {**best[1], **o}, "splits", rows)
        sp = [r for r in rows if r["tag"] == "splits" and "ms" in r]
        tot = {}
        for r in sp:  # mean time relative to the best at the same T, over both contexts
            tot.setdefault((r["target_programs"], r["min_blocks"]), []).append(
                r["ms"] / min(x["ms"] for x in sp if x["T"] == r["T"]))
        full = [(sum(v) / len(v), k) for k, v in tot.items() if len(v) == 2]
        if full:
            tp, mb = min(full)[1]
            for b in best.values():
                b.update(target_programs=tp, min_blocks=mb)
        dump()
    report["choice"] = {str(n): b for n, b in best.items()}
    print("choice", report["choice"], flush=True)
    choice = {n: (b.pop("words"), b) for n, b in ((n, dict(b)) for n, b in best.items())}
    for n in (1, 5):
        choice.setdefault(n, (True, {}))
    bench(None, None, args.reps, choice, copy_gbps, t_start + args.budget_s, report["results"], dump,
          impls=("int2", "cudnn"), points=V3_POINTS)
    dump()
    print(f"copy {copy_gbps:.0f} GB/s; total {budget():.0f} s")
    for r in rows:
        print(r.get("tag"), r.get("n"), r.get("B"), r.get("T"), r.get("min_rows"), r.get("block_t"),
              r.get("num_warps"), r.get("num_stages"), r.get("words"), r.get("target_programs"),
              r.get("min_blocks"), round(r.get("ms", -1), 4), r.get("error", "")[:60])
    print(table(report["results"]))


# v3 confirmation: split targets at B=8/32 with the v3 decode tile, repeats for the spread.
V3_CONFIRM = [(8, 32768, 1, dict(target_programs=528)), (8, 32768, 1, dict(target_programs=1056)),
              (8, 32768, 1, dict(target_programs=2112)), (8, 32768, 1, dict(target_programs=528)),
              (8, 32768, 1, dict(target_programs=528, num_stages=4)), (8, 32768, 1, dict(target_programs=528, block_t=128)),
              (8, 32768, 1, dict(target_programs=528, block_t=32)), (32, 32768, 1, dict(target_programs=528)),
              (32, 32768, 1, dict(target_programs=1056)), (8, 131072, 1, dict(target_programs=528)),
              (8, 131072, 1, dict(target_programs=1056)), (8, 32768, 5, dict(target_programs=528)),
              (8, 32768, 5, dict(target_programs=1056)), (8, 32768, 5, dict(target_programs=2112)),
              (8, 32768, 5, dict(target_programs=528))]
V3_TILE = {1: dict(min_rows=4, block_t=64, num_warps=1, num_stages=3, min_blocks=4),
           5: dict(min_rows=16, block_t=64, num_warps=2, num_stages=3, min_blocks=4)}


def v3_confirm(out, budget_s=60.0):
    t0, rows = time.time(), []
    for B, T, n, o in V3_CONFIRM:
        if time.time() - t0 < budget_s:
            _measure(B, T, n, 10, {**V3_TILE[n], **o}, "confirm", rows)
    json.dump(rows, open(os.path.join(out, "confirm.json"), "w"), indent=1)
    for r in rows:
        print(r["B"], r["T"], r["n"], r.get("target_programs"), r.get("block_t"), r.get("num_stages"),
              round(r.get("ms", -1), 4), r.get("error", "")[:60])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(default_out()), help="folder for attention.json (default: a scratch folder)")
    ap.add_argument("--sweep", action="store_true", help="tune block sizes / warps first")
    ap.add_argument("--sweep-only", action="store_true", help="sweep + the cost of viewing uint8 as words")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the script: tiny, interpret mode")
    ap.add_argument("--v3", action="store_true", help="v3: staged sweep (rows/warps/blocks/splits) + table")
    ap.add_argument("--v3-confirm", action="store_true", help="v3: split targets at B=8/32, repeats")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting new configs after this")
    args = ap.parse_args(argv)
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "attention.json")
    info = dict(device=str(jax.devices()[0]), jax=jax.__version__, heads=(HQ, HKV), head_dim=D, calls_per_jit=CALLS)
    report = dict(info=info, copy={}, checks={}, sweep=[], choice={}, results=[])
    dump = lambda: json.dump(report, open(path, "w"), indent=1)

    if args.v3_confirm:
        return v3_confirm(args.out)
    if args.v3:
        return v3(args, report, dump, t_start)
    if args.smoke:  # the int2 kernel in interpret mode and XLA's BF16 attention at one tiny point, the JSON written
        report["copy"] = copy_bandwidth(1 / 32, 3)
        report["checks"]["words=False"] = check_int2(1, 512, 5, False, interpret=True, block_t=64)
        choice = {n: (False, dict(interpret=True, block_t=64, min_rows=4)) for n in (1, 5)}
        bench([], [], 2, choice, report["copy"]["copy_GBps"], t_start + args.budget_s, report["results"], dump,
              impls=("int2", "xla"), points=[(256, 1, 5)])
        print(table(report["results"]))
        return

    report["copy"] = copy_bandwidth()
    copy_gbps = report["copy"]["copy_GBps"]
    print("copy", report["copy"], flush=True)
    for words in (False, True):
        report["checks"][f"words={words}"] = check_int2(4, 5000, 5, words)
    print("checks", report["checks"], flush=True)
    if args.sweep or args.sweep_only:
        report["sweep"] = sweep(8, 32768, 10)
        dump()
    if args.sweep_only:
        for n in (1, 5):
            words, opts = best_opts(report["sweep"], n)
            t, _ = time_int2(8, 32768, n, 10, words=True, words_in_jit=True, **opts)
            report["words_in_jit"] = report.get("words_in_jit", []) + [dict(n=n, **opts, ms=t * 1e3)]
            print("words_in_jit", report["words_in_jit"][-1], flush=True)
        dump()
        for r in report["sweep"]:
            print(r.get("n"), r.get("words"), r.get("block_t"), r.get("num_warps"), r.get("num_stages"),
                  round(r.get("ms", -1), 3), round(r.get("GBps", -1)), r.get("error", "")[:80])
        return
    choice = {n: best_opts(report["sweep"], n) if args.sweep else (False, {}) for n in (1, 5)}
    report["choice"] = {str(n): dict(words=w, **o) for n, (w, o) in choice.items()}
    print("choice", report["choice"], flush=True)
    deadline = t_start + args.budget_s
    bench([131072, 32768, 65536, 16384, 4096], [1, 8, 32], args.reps, choice, copy_gbps, deadline,
          report["results"], dump)
    dump()
    print(f"copy {copy_gbps:.0f} GB/s (torch copy_ read+write); JAX elementwise "
          f"{report['copy']['jax_elementwise_GBps']:.0f} GB/s; total {time.time() - t_start:.0f} s")
    print(table(report["results"]))


if __name__ == "__main__":
    sys.exit(main())
