"""Issue 14, session 22: the stacked 8B step (compiled with model.SCAN_OPTIONS: XLA's Triton GEMMs off) spent
0.75 ms converting the bf16 lm_head [4096, 128256] to f32 and 0.50 ms in an f32 cuBLAS gemv, every step (call 1's
profile). Which way of writing the head's bf16 x bf16 -> f32 dot keeps bf16 operands under those options? Each
variant: the optimised HLO's converts of the weight, time per call, max |diff| against the f32 reference.

    python head_probe.py [--small]
"""
import argparse, json, time

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--small", action="store_true")
a = ap.parse_args()
E, V = (4096, 128256) if not a.small else (64, 256)
w = jax.random.normal(jax.random.key(0), (E, V), jnp.bfloat16) * 0.02
f32 = jnp.float32
OPTS = {"xla_gpu_enable_dynamic_slice_fusion": True, "xla_gpu_enable_triton_gemm": False}


def pad_rows(x, w):  # [B, n, E] as >= 2 rows, so the dot is a matrix product, not a vector one
    B, n, _ = x.shape
    rows = x.reshape(B * n, E)
    rows = jnp.concatenate([rows, jnp.zeros((1, E), x.dtype)]) if B * n == 1 else rows
    return jnp.dot(rows, w, preferred_element_type=f32)[: B * n].reshape(B, n, V)


variants = {
    "einsum_f32": lambda x, w: jnp.einsum("bne,ev->bnv", x, w, preferred_element_type=f32),
    "preset_bf16_bf16_f32": lambda x, w: jnp.einsum("bne,ev->bnv", x, w, preferred_element_type=f32,
                                                    precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32),
    "pad_rows": pad_rows,
    "bf16_out": lambda x, w: jnp.einsum("bne,ev->bnv", x, w).astype(f32),
}
for B, n in ((1, 1), (8, 1), (1, 5)):
    x = jax.random.normal(jax.random.key(1), (B, n, E), jnp.bfloat16)
    ref = jnp.einsum("bne,ev->bnv", x.astype(f32), w.astype(f32), precision="highest")
    for opts_name, opts in (("default", None), ("scan_options", OPTS)):
        for name, fn in variants.items():
            row = dict(B=B, n=n, options=opts_name, variant=name)
            try:
                c = jax.jit(fn).lower(x, w).compile(compiler_options=opts)
                hlo = c.as_text()
                row["weight_converts"] = hlo.count(f"f32[{E},{V}]")
                out = c(x, w).block_until_ready()
                row["max_diff"] = float(jnp.max(jnp.abs(out - ref)))
                reps = 50
                t = time.perf_counter()
                for _ in range(reps):
                    out = c(x, w)
                out.block_until_ready()
                row["ms"] = round((time.perf_counter() - t) / reps * 1e3, 3)
            except Exception as e:  # noqa: BLE001 - a variant that does not compile is a result
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(json.dumps(row), flush=True)
