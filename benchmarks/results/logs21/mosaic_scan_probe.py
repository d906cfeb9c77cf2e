"""Issue 14, prepared in session 21 for the next (not run on a GPU): inside a loop over stacked layers, does the
Mosaic INT2 kernel read its layer of a stacked cache in place? jaxlib's Mosaic call is an FFI custom call; XLA's
dynamic-slice fusion (xla_gpu_enable_dynamic_slice_fusion) can hand a custom call a sub-buffer where its operand is
a contiguous dynamic slice, as one layer of a stacked cache [L, B, H, ...] is. If it does, the scan needs no change
to the kernel; if not, XLA copies every layer's codes and scales (0.6 GB per layer at 128K: more than the kernel
reads) and the kernel must take the stack and a row base instead. 32 layers of decode (M = 4 rows per KV head,
Hkv 8, D 128) at B 1 / 128K and B 8 / 32K: the layers unrolled over a tuple of caches (today) against a fori_loop
over the stack with default flags and with the fusion on. Prints ms per 32 calls, the INT2 bytes read per ms, and
the copy ops in the compiled HLO.

    python mosaic_scan_probe.py [--cases 1:131072,8:32768] [--small]   # --small: CPU, the jnp reference, tiny shapes
"""
import argparse, json, time

import jax
import jax.numpy as jnp

from jspec.pallas import int2_mosaic
from jspec.pallas.int2_attention import int2_attention_reference

ap = argparse.ArgumentParser()
ap.add_argument("--cases", default="1:131072,8:32768", help="batch:context,...")
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--small", action="store_true")
a = ap.parse_args()
H, M, D, L = 8, 4, 128, a.layers
if a.small:
    H, D = 2, 64
attn = (lambda *x: int2_attention_reference(*x)[0]) if a.small else \
    (lambda *x: int2_attention_mosaic_merged(*x))


def int2_attention_mosaic_merged(q, codes, qparams, lo, hi):
    return int2_mosaic.int2_attention_mosaic(q, codes, qparams, lo, hi)[0]


def unrolled(q, lo, hi, cs, ps):  # cs, ps: tuples of per-layer codes [B, H, 2, T, D/4] and qparams [B, H, 4, T, 1]
    acc = jnp.zeros(q.shape, jnp.float32)
    for i in range(L):
        acc = acc + attn(q, cs[i], ps[i], lo, hi)
    return acc


def looped(q, lo, hi, C, P):  # C, P: [L, ...] stacked
    def body(i, acc):
        c, p = (jax.lax.dynamic_index_in_dim(x, i, keepdims=False) for x in (C, P))
        return acc + attn(q, c, p, lo, hi)
    return jax.lax.fori_loop(0, L, body, jnp.zeros(q.shape, jnp.float32))


key = jax.random.PRNGKey(0)
for case in a.cases.split(","):
    B, T = map(int, case.split(":"))
    T = 256 if a.small else T
    q = jax.random.normal(key, (B, H, M, D), jnp.bfloat16)
    lo, hi = jnp.full((B, M), 64, jnp.int32), jnp.full((B, M), T - 256 if not a.small else T - 16, jnp.int32)
    code_shape, par_shape = (B, H, 2, T, D // 4), (B, H, 4, T, 1)
    nbytes = L * B * H * T * (2 * D // 4 + 4 * 2)
    for name, fn, opts, stacked in (("unrolled", unrolled, None, False), ("loop", looped, None, True),
                                    ("loop-dsfusion", looped, {"xla_gpu_enable_dynamic_slice_fusion": True}, True)):
        row = dict(B=B, T=T, variant=name)
        try:
            mk = lambda shape, dt: jax.random.randint(key, shape, 0, 255 if dt == jnp.uint8 else 2).astype(dt)
            if stacked:
                C, P = mk((L, *code_shape), jnp.uint8), mk((L, *par_shape), jnp.bfloat16)
            else:
                C = tuple(mk(code_shape, jnp.uint8) for _ in range(L))
                P = tuple(mk(par_shape, jnp.bfloat16) for _ in range(L))
            c = jax.jit(fn).lower(q, lo, hi, C, P).compile(compiler_options=opts)
            text = c.as_text()
            row.update(copies=text.count(" copy(") + text.count(" copy-start("),
                       dynamic_slices=text.count("dynamic-slice("))
            out = c(q, lo, hi, C, P).block_until_ready()
            row["finite"] = bool(jnp.isfinite(out).all())
            reps = 10
            t0 = time.perf_counter()
            for _ in range(reps):
                out = c(q, lo, hi, C, P)
            out.block_until_ready()
            dt = (time.perf_counter() - t0) / reps
            row.update(ms=round(dt * 1e3, 3), int2_TBps=round(nbytes / dt / 1e12, 2))
            del C, P
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:300]
        print(json.dumps(row), flush=True)
