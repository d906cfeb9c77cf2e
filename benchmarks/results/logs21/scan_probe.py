"""Issue 14, session 21: can a lax.scan over stacked layers read each layer's weights in place? Session 7's scan
cost 2x per decode step: XLA sliced every layer's weights out of the stack (a copy) before each GEMM. XLA has a
dynamic-slice fusion (xla_gpu_enable_dynamic_slice_fusion) that hands the GEMM an address inside the stack
instead (cuBLAS calls; the -cublas variants turn XLA's Triton GEMMs off). 32 layers of an 8B-shaped MLP at one token (w_gu [E, 2F], w_down [F, E]: 13.5 GB of bf16 weights read
per pass), the layers unrolled (the default today), scanned with default flags, scanned with the fusion on; each with Triton GEMMs off; time
per pass, its weight bandwidth, and the compiled executable's serialized size and load time.

    python scan_probe.py [--layers 32] [--small]
"""
import argparse, json, time

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--small", action="store_true")
a = ap.parse_args()
E, F = (4096, 14336) if not a.small else (64, 128)
L = a.layers
k1, k2 = jax.random.split(jax.random.PRNGKey(0))
w_gu = (jax.random.normal(k1, (L, E, 2 * F), jnp.bfloat16) * 0.02)
w_down = (jax.random.normal(k2, (L, F, E), jnp.bfloat16) * 0.02)
x0 = jnp.ones((1, E), jnp.bfloat16)


def layer(x, wg, wd):
    h = (x.astype(jnp.float32) * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32))) + 1e-6)).astype(x.dtype)
    y = h @ wg
    return x + (jax.nn.silu(y[:, :F]) * y[:, F:]) @ wd


def unrolled(x, wg, wd):
    for i in range(L):
        x = layer(x, wg[i], wd[i])
    return x


def scanned(x, wg, wd):
    return jax.lax.scan(lambda x, w: (layer(x, *w), None), x, (wg, wd))[0]


variants = {"unrolled": (unrolled, {}), "scan": (scanned, {}),
            "scan-dsfusion": (scanned, {"xla_gpu_enable_dynamic_slice_fusion": True}),
            "unrolled-cublas": (unrolled, {"xla_gpu_enable_triton_gemm": False}),
            "scan-dsfusion-cublas": (scanned, {"xla_gpu_enable_dynamic_slice_fusion": True,
                                               "xla_gpu_enable_triton_gemm": False})}
byts = (w_gu.size + w_down.size) * 2
ref = None
for name, (fn, opts) in variants.items():
    row = dict(variant=name)
    try:
        t = time.perf_counter()
        c = jax.jit(fn).lower(x0, w_gu, w_down).compile(compiler_options=opts or None)
        row["compile_s"] = round(time.perf_counter() - t, 2)
        out = c(x0, w_gu, w_down).block_until_ready()
        ref = out if ref is None else ref
        row["max_diff_vs_unrolled"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
        reps = 20
        t = time.perf_counter()
        for _ in range(reps):
            out = c(x0, w_gu, w_down)
        out.block_until_ready()
        dt = (time.perf_counter() - t) / reps
        row.update(ms=round(dt * 1e3, 3), weight_TBps=round(byts / dt / 1e12, 2))
        text = c.as_text()
        row["hlo_chars"], row["copies"] = len(text), text.count(" copy(") + text.count("copy-start")
        row["dynamic_slices"] = text.count("dynamic-slice(")
        try:
            from jax.experimental import serialize_executable as se
            payload = se.serialize(c)
            t = time.perf_counter()
            se.deserialize_and_load(*payload)
            row.update(serialized_MB=round(len(payload[0]) / 1e6, 2), load_s=round(time.perf_counter() - t, 3))
        except Exception as e:  # noqa: BLE001
            row["load_error"] = repr(e)[:200]
    except Exception as e:  # noqa: BLE001
        row["error"] = repr(e)[:300]
    print(json.dumps(row), flush=True)
