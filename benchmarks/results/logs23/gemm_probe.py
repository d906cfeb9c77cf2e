"""Issue 14, session 23: the stacked step's GEMMs. Under model.SCAN_OPTIONS the scan's GEMMs are cuBLASLt calls
inside dynamic-slice fusions, and call 1's HLO shows them untuned (no selected_algorithm, autotune workspace 0,
where the head outside the loop has both); at B 8 they cost +0.37 ms per 8B step over the unrolled Triton GEMMs
(memcpy32_post 97 per step included). 32 layers of an 8B layer's four GEMMs (wqkv, wo, w_gu, w_down: 14.5 GB of
bf16 weights per pass) at T tokens: unrolled (XLA's Triton GEMMs, the default), unrolled with cuBLAS (tuned), scanned under SCAN_OPTIONS, the
same with the weight as the product's left operand (y^T = W^T x^T: cuBLAS sees M = out features, N = T), and with
legacy cuBLAS instead of cuBLASLt. Time per pass, weight bandwidth, kernels in the compiled HLO.

    python gemm_probe.py [--tokens 1,8,40,64] [--small]
"""
import argparse, json, time

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--tokens", default="1,8,40,64")
ap.add_argument("--small", action="store_true")
a = ap.parse_args()
E, F, QKV, L = (4096, 14336, 6144, 32) if not a.small else (64, 128, 96, 4)
ks = jax.random.split(jax.random.PRNGKey(0), 4)
w = lambda k, *s: jax.random.normal(k, (L, *s), jnp.bfloat16) * 0.02
ws = (w(ks[0], E, QKV), w(ks[1], E, E), w(ks[2], E, 2 * F), w(ks[3], F, E))
SCAN = {"xla_gpu_enable_dynamic_slice_fusion": True, "xla_gpu_enable_triton_gemm": False}


def norm(x):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype)


def mm(x, wt, left):  # x [T, K] @ wt [K, N] -> [T, N]; left: the weight as the left operand, then transposed
    return jnp.einsum("kn,tk->nt", wt, x).T if left else x @ wt


def layer(x, w, left=False):
    wqkv, wo, wgu, wd = w
    a = mm(norm(x), wqkv, left)[:, :E]  # stands in for attention's output
    x = x + mm(a, wo, left)
    y = mm(norm(x), wgu, left)
    return x + mm(jax.nn.silu(y[:, :F]) * y[:, F:], wd, left)


def unrolled(x, ws):
    for i in range(L):
        x = layer(x, [t[i] for t in ws])
    return x


def scanned(left):
    return lambda x, ws: jax.lax.scan(lambda x, w: (layer(x, w, left), None), x, ws)[0]


variants = {"unrolled": (unrolled, None), "unrolled-cublas": (unrolled, {"xla_gpu_enable_triton_gemm": False}),
            "scan": (scanned(False), SCAN), "scan-left": (scanned(True), SCAN),
            "scan-nolt": (scanned(False), {**SCAN, "xla_gpu_enable_cublaslt": False}),
            "scan-lt": (scanned(False), {**SCAN, "xla_gpu_enable_cublaslt": True})}
byts = sum(t.size for t in ws) * 2
for T in map(int, a.tokens.split(",")):
    x0 = jnp.ones((T, E), jnp.bfloat16)
    ref = None
    for name, (fn, opts) in variants.items():
        row = dict(tokens=T, variant=name)
        try:
            t = time.perf_counter()
            c = jax.jit(fn).lower(x0, ws).compile(compiler_options=opts)
            row["compile_s"] = round(time.perf_counter() - t, 2)
            out = c(x0, ws).block_until_ready()
            ref = out if ref is None else ref
            row["max_diff"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
            for _ in range(3):
                c(x0, ws)
            reps = 20
            t = time.perf_counter()
            for _ in range(reps):
                out = c(x0, ws)
            out.block_until_ready()
            dt = (time.perf_counter() - t) / reps
            text = c.as_text()
            row.update(ms=round(dt * 1e3, 3), weight_TBps=round(byts / dt / 1e12, 2),
                       lt_calls=text.count("cublas$lt$matmul"), gemm_calls=text.count('"__cublas$gemm"'),
                       tuned=text.count("selected_algorithm"))
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:300]
        print(json.dumps(row), flush=True)
