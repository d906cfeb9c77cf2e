"""Issue 14, prepared in session 21 for the next (not run on a GPU): in a lax.scan over stacked layers, does XLA
read a BF16 KV cache's layer in place, or copy it out of the stack before attending? scan_probe.py showed the
weights read in place once the GEMMs are cuBLAS calls with the dynamic-slice fusion on; the cache is the other
half of a scanned decode step. Per layer at one token: q = x @ wq, attention over the layer's cache
k, v [B, T, Hkv, D] (GQA, f32 softmax), the step's new row written at position t (the cache a loop carry, updated
in place), x += o @ wo. 32 layers of the Llama-3-8B attention shape (Hq 32, Hkv 8, D 128) at batch 1 / 32K,
1 / 128K and 8 / 32K (B 8 at 128K would need 137 GB of cache). Variants: unrolled (the cache a tuple of per-layer arrays, as jspec's today), scan with default
flags, scan with XLA's dynamic-slice fusion and Triton GEMMs off. Prints ms per step, the KV bytes read per
step at that time, and the number of copy ops in the compiled HLO.

    python scan_attention_probe.py [--cases 1:32768,1:131072,8:32768] [--small]
"""
import argparse, json, time

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--cases", default="1:32768,1:131072,8:32768", help="batch:context,...")
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--small", action="store_true")
a = ap.parse_args()
E, Hq, H, D = (4096, 32, 8, 128) if not a.small else (64, 4, 2, 16)
L, g = a.layers, Hq // H
bf = jnp.bfloat16
CUBLAS_DS = {"xla_gpu_enable_dynamic_slice_fusion": True, "xla_gpu_enable_triton_gemm": False}


def layer(x, t, wq, wo, k, v):
    """x [B, E] at position t; k, v [B, T, H, D] this layer's cache, the row at t written first. -> x, k, v."""
    B = x.shape[0]
    q = (x @ wq).reshape(B, H, g, D)
    row = q[:, :, 0].astype(bf)  # a stand-in for the step's new key and value row [B, H, D]
    k = jax.lax.dynamic_update_slice(k, row[:, None], (0, t, 0, 0))
    v = jax.lax.dynamic_update_slice(v, row[:, None], (0, t, 0, 0))
    s = jnp.einsum("bhgd,bthd->bhgt", q, k, preferred_element_type=jnp.float32) / D ** 0.5
    s = jnp.where(jnp.arange(k.shape[1]) <= t, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(bf)
    o = jnp.einsum("bhgt,bthd->bhgd", p, v, preferred_element_type=jnp.float32).astype(bf)
    return x + o.reshape(B, E) @ wo, k, v


def unrolled(x, t, wq, wo, ks, vs):  # ks, vs: tuples of per-layer caches
    ks, vs = list(ks), list(vs)
    for i in range(L):
        x, ks[i], vs[i] = layer(x, t, wq[i], wo[i], ks[i], vs[i])
    return x, tuple(ks), tuple(vs)


def scanned(x, t, wq, wo, K, V):  # K, V: [L, B, T, H, D]
    def body(i, c):
        x, K, V = c
        k, v = jax.lax.dynamic_index_in_dim(K, i, keepdims=False), jax.lax.dynamic_index_in_dim(V, i, keepdims=False)
        x, k, v = layer(x, t, wq[i], wo[i], k, v)
        return x, jax.lax.dynamic_update_index_in_dim(K, k, i, 0), jax.lax.dynamic_update_index_in_dim(V, v, i, 0)
    return jax.lax.fori_loop(0, L, body, (x, K, V))


key = jax.random.PRNGKey(0)
wq = jax.random.normal(key, (L, E, Hq * D), bf) * 0.02
wo = jax.random.normal(key, (L, Hq * D, E), bf) * 0.02
for case in a.cases.split(","):
    B, T = map(int, case.split(":"))
    T = T if not a.small else 64
    x = jnp.ones((B, E), bf)
    t = jnp.int32(T // 2)
    kv_bytes = 2 * L * B * T * H * D * 2
    for name, fn, opts, stacked in (("unrolled", unrolled, None, False), ("scan", scanned, None, True),
                                    ("scan-dsfusion-cublas", scanned, CUBLAS_DS, True)):
        row = dict(B=B, T=T, variant=name)
        try:
            shape = (L, B, T, H, D) if stacked else (B, T, H, D)
            K = jnp.zeros(shape, bf) if stacked else tuple(jnp.zeros(shape, bf) for _ in range(L))
            V = jnp.zeros(shape, bf) if stacked else tuple(jnp.zeros(shape, bf) for _ in range(L))
            c = jax.jit(fn, donate_argnums=(4, 5)).lower(x, t, wq, wo, K, V).compile(compiler_options=opts)
            text = c.as_text()
            row.update(copies=text.count(" copy(") + text.count(" copy-start("),
                       dynamic_slices=text.count("dynamic-slice("))
            out = c(x, t, wq, wo, K, V)
            jax.block_until_ready(out)
            reps = 10
            t0 = time.perf_counter()
            for _ in range(reps):
                out = c(out[0], t, wq, wo, out[1], out[2])
            jax.block_until_ready(out)
            dt = (time.perf_counter() - t0) / reps
            row.update(ms=round(dt * 1e3, 3), kv_TBps=round(kv_bytes / dt / 1e12, 2))
            del K, V, out
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:300]
        print(json.dumps(row), flush=True)
