"""Issue 14, session 24: can an unrolled program read its weights as static slices of the stacked [L, K, N] arrays
without copying them? Then one copy of the weights (stacked) could serve a scanned prefill (compile-light, its GEMMs
compute-bound) and unrolled decode rounds (XLA's autotuned Triton GEMMs). 32 layers of session 23's gemm_probe layer
(norms, the 8B layer's four GEMMs, residual adds) at M rows: unrolled over separate arrays (today's programs),
unrolled over static slices w[i] of the stacks (default options, and under model.SCAN_OPTIONS), and the scan over
the stacks under SCAN_OPTIONS (today's --scan-layers). A copy of each layer's weights shows as ~3x the time.

    python slice_probe.py --out DIR [--rows 1,8] [--small]
"""
import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jspec import model

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rows", default="1,8")
ap.add_argument("--small", action="store_true")
a = ap.parse_args()
E, F, QKV, L = (4096, 14336, 6144, 32) if not a.small else (256, 512, 384, 4)
ks = jax.random.split(jax.random.PRNGKey(0), 4)
stack = lambda k, *s: (jax.random.normal(k, (L, *s), jnp.float32) * 0.02).astype(jnp.bfloat16)
W = dict(wqkv=stack(ks[0], E, QKV), wo=stack(ks[1], E, E), w_gu=stack(ks[2], E, 2 * F), w_down=stack(ks[3], F, E))
LISTS = {name: [w[i] for i in range(L)] for name, w in W.items()}
GB = sum(w.size for w in W.values()) * 2 / 1e9
SCAN = dict(model.SCAN_OPTIONS)


def norm(x):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype)


def layer(x, w, i):
    a = (norm(x) @ w["wqkv"][i])[:, :E]  # stands in for attention's output
    x = x + a @ w["wo"][i]
    y = norm(x) @ w["w_gu"][i]
    return x + (jax.nn.silu(y[:, :F]) * y[:, F:]) @ w["w_down"][i]


def unrolled(x, w):
    for i in range(L):
        x = layer(x, w, i)
    return x


def scanned(x, w):
    return jax.lax.fori_loop(0, L, lambda i, x: layer(x, w, i), x)


res = []
for M in map(int, a.rows.split(",")):
    x = jnp.ones((M, E), jnp.bfloat16)
    ref = None
    for name, fn, args, opts in [("unrolled, separate arrays", unrolled, (x, LISTS), None),
                                 ("unrolled, static slices of the stacks", unrolled, (x, W), None),
                                 ("unrolled, static slices, SCAN_OPTIONS", unrolled, (x, W), SCAN),
                                 ("scan over the stacks, SCAN_OPTIONS", scanned, (x, W), SCAN)]:
        t = time.perf_counter()
        c = jax.jit(fn).lower(*args).compile(compiler_options=opts)
        cs = time.perf_counter() - t
        out = c(*args).block_until_ready()
        ref = out if ref is None else ref
        for _ in range(3):
            c(*args)
        t = time.perf_counter()
        for _ in range(20):
            out = c(*args)
        out.block_until_ready()
        dt = (time.perf_counter() - t) / 20
        text = c.as_text()
        r = dict(rows=M, variant=name, ms=dt * 1e3, TBps=GB / dt / 1e3, compile_s=cs, copies=text.count(" copy("),
                 triton_gemms=text.count("__triton_gemm"), cublas=text.count("__cublas"),
                 max_diff=float(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)).max()))
        print(f"{M} rows, {name}: {r['ms']:.3f} ms, {r['TBps']:.2f} TB/s, compile {cs:.1f} s, copies {r['copies']}, "
              f"triton {r['triton_gemms']}, cublas {r['cublas']}, diff {r['max_diff']:.3g}", flush=True)
        res.append(r)
Path(a.out, "slice_probe.json").write_text(json.dumps(res, indent=1))
