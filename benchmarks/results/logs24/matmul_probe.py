# Run at commit c1b57af, whose jspec/pallas/stacked_matmul.py was taken out after call 4 (no gain in the step).
"""Issue 14, session 24: the stacked step's GEMMs in a Pallas (Triton) kernel that reads the [L, K, N] stack in place at
the loop's layer index (jspec/pallas/stacked_matmul.py), against XLA's GEMMs.

Part 1, per weight (the 8B layer's wqkv, wo, w_gu, w_down) and rows M: 32 layers of x @ w[i] summed into an f32
carry, (a) unrolled over 32 separate arrays (XLA's Triton GEMMs, autotuned: the default program's), (b) a fori_loop
over the stack under model.SCAN_OPTIONS (cuBLAS in dynamic-slice fusions: today's stacked program), (c) the same loop
with the Pallas kernel, for each tiling of a sweep. Part 2: session 23's gemm_probe layer (norms, the four GEMMs,
residual adds) over 32 layers: unrolled, scanned with cuBLAS, scanned with the kernel at part 1's best tiling per
weight and at the default tiling.

    python matmul_probe.py --out DIR [--rows 1,8,40] [--small]
"""
import argparse
import itertools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jspec import model
from jspec.pallas import stacked_matmul as sm

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rows", default="1,8,40")
ap.add_argument("--sweep-rows", default="8")
ap.add_argument("--small", action="store_true")
a = ap.parse_args()
E, F, QKV, L = (4096, 14336, 6144, 32) if not a.small else (256, 512, 384, 4)
INTERPRET = jax.default_backend() != "gpu"
ks = jax.random.split(jax.random.PRNGKey(0), 4)
stack = lambda k, *s: (jax.random.normal(k, (L, *s), jnp.float32) * 0.02).astype(jnp.bfloat16)
W = dict(wqkv=stack(ks[0], E, QKV), wo=stack(ks[1], E, E), w_gu=stack(ks[2], E, 2 * F), w_down=stack(ks[3], F, E))
LISTS = {name: [w[i] for i in range(L)] for name, w in W.items()}
SCAN = dict(model.SCAN_OPTIONS)
res = dict(part1=[], part2=[])


def timed(fn, args, opts, reps=20):
    t = time.perf_counter()
    c = jax.jit(fn).lower(*args).compile(compiler_options=opts)
    compile_s = time.perf_counter() - t
    out = c(*args)
    jax.block_until_ready(out)
    for _ in range(3):
        out = c(*args)
    jax.block_until_ready(out)
    t = time.perf_counter()
    for _ in range(reps):
        out = c(*args)
    jax.block_until_ready(out)
    return out, (time.perf_counter() - t) / reps, compile_s


def pallas_mm(t):
    return lambda x, w, i: sm.matmul(x, w, i, t, interpret=INTERPRET)


def cublas_mm(x, w, i):
    return x @ w[i]


def one_weight(name, M):
    w, ws = W[name], LISTS[name]
    K, N = w.shape[1:]
    x = jnp.ones((M, K), jnp.bfloat16) * 0.1
    gb = w.size * 2 / 1e9

    def unrolled(x, ws):
        return sum((x @ wi).astype(jnp.float32) for wi in ws)

    def looped(mm):
        def fn(x, w):
            return jax.lax.fori_loop(0, L, lambda i, acc: acc + mm(x, w, i).astype(jnp.float32),
                                     jnp.zeros((M, N), jnp.float32))
        return fn

    ref, dt, cs = timed(unrolled, (x, ws), None)
    rows = [dict(weight=name, rows=M, variant="unrolled", ms=dt * 1e3, TBps=gb / dt / 1e3, compile_s=cs)]
    _, dt, cs = timed(looped(cublas_mm), (x, w), SCAN)
    rows.append(dict(weight=name, rows=M, variant="loop-cublas", ms=dt * 1e3, TBps=gb / dt / 1e3, compile_s=cs))
    sweep = [sm.tiling(K, N)] + [sm.Tiling(bn, bk, s, warps, st) for bn, bk, s, warps, st in itertools.product(
        (64, 128), (32, 64, 128), (1, 2, 4, 8), (2, 4), (3, 4, 5))]
    for t in dict.fromkeys(sweep):
        if not sm.supported(M, K, N, t) or (K // (t.splits * t.bk)) < 2 or N // t.bn * t.splits < (1 if a.small else 66):
            continue
        try:
            out, dt, cs = timed(looped(pallas_mm(t)), (x, w), None)
            rows.append(dict(weight=name, rows=M, variant="loop-pallas", tiling=list(t), ms=dt * 1e3,
                             TBps=gb / dt / 1e3, compile_s=cs,
                             max_diff=float(jnp.abs(out - ref).max() / jnp.abs(ref).max())))
        except Exception as e:  # a tiling Triton cannot compile: keep going
            rows.append(dict(weight=name, rows=M, variant="loop-pallas", tiling=list(t), error=str(e)[:200]))
    ok = [r for r in rows if r["variant"] == "loop-pallas" and "ms" in r]
    if not ok:
        raise RuntimeError(f"no tiling compiled: {rows[-1]['error']}")
    best = min(ok, key=lambda r: r["ms"])
    for r in rows[:2] + [best]:
        print(name, M, r["variant"], r.get("tiling", ""), f"{r['ms']:.3f} ms {r['TBps']:.2f} TB/s", flush=True)
    res["part1"] += rows
    return sm.Tiling(*best["tiling"])


def norm(x):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype)


def layer(x, w, i, mms):
    a = mms["wqkv"](norm(x), w["wqkv"], i)[:, :E]  # stands in for attention's output
    x = x + mms["wo"](a, w["wo"], i)
    y = mms["w_gu"](norm(x), w["w_gu"], i)
    return x + mms["w_down"](jax.nn.silu(y[:, :F]) * y[:, F:], w["w_down"], i)


def whole(M, best):
    x = jnp.ones((M, E), jnp.bfloat16)
    gb = sum(w.size for w in W.values()) * 2 / 1e9
    variants = {"unrolled": (_unrolled, (x, LISTS), None),
                "scan-cublas": (looped({k: cublas_mm for k in W}), (x, W), SCAN),
                "scan-pallas-default": (looped({k: pallas_mm(None) for k in W}), (x, W), None)}
    if best:
        variants["scan-pallas-best"] = (looped({k: pallas_mm(best[k]) for k in W}), (x, W), None)
    ref = None
    for name, (fn, args, opts) in variants.items():
        try:
            out, dt, cs = timed(fn, args, opts)
        except Exception as e:  # a tiling past shared memory at these rows
            print("layer", M, name, "failed:", str(e)[:200], flush=True)
            continue
        ref = out if ref is None else ref
        r = dict(rows=M, variant=name, ms=dt * 1e3, TBps=gb / dt / 1e3, compile_s=cs,
                 max_diff=float(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)).max()))
        print("layer", M, name, f"{r['ms']:.3f} ms {r['TBps']:.2f} TB/s diff {r['max_diff']:.3g}", flush=True)
        res["part2"].append(r)


def _unrolled(x, ws):
    mms = {k: (lambda x, w, i: x @ w[i]) for k in W}
    for i in range(L):
        x = layer(x, ws, i, mms)
    return x


def looped(mms):
    return lambda x, w: jax.lax.fori_loop(0, L, lambda i, x: layer(x, w, i, mms), x)


best = {}
for M in map(int, a.sweep_rows.split(",")):
    best[M] = {name: one_weight(name, M) for name in W}
for M in map(int, a.rows.split(",")):
    whole(M, best.get(M) or best[max(best)])
res["best"] = {M: {k: list(t) for k, t in b.items()} for M, b in best.items()}
Path(a.out, "matmul_probe.json").write_text(json.dumps(res, indent=1))
