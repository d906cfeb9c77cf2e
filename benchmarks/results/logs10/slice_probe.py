"""Issue 14, for the next device call: which form of a stacked weight's layer slice does XLA:GPU feed to
its GEMM in place, without copying it out of the stack first?

Call 1 of session 10 found that model.block under lax.scan / fori_loop over stacked 8B layers copied
every layer's weights (416 MiB temporaries, decode 2.5x slower). This strips the question down to one
GEMM per layer, x [M, K] @ W[l] with W [L, K, N] bf16, in a fori_loop over l, in five forms, against
the same GEMMs unrolled over a tuple of [K, N] arrays. For each: temporary bytes (a copy shows as about
K * N * 2), the fusions whose root is a dynamic-slice, and the time per layer against the byte floor.

    python benchmarks/results/logs10/slice_probe.py [--small] [--m 1,8,256]
"""

import argparse
import json
import re

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks.timing import median_time


def forms(L):
    def unrolled(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    def loop(pick):
        return lambda W, x: lax.fori_loop(0, L, lambda i, x: jnp.tanh(x @ pick(W, i)), x)

    return dict(
        unrolled=unrolled,
        index=loop(lambda W, i: W[i]),
        dynamic_index=loop(lambda W, i: lax.dynamic_index_in_dim(W, i, 0, keepdims=False)),
        dynamic_slice=loop(lambda W, i: lax.dynamic_slice_in_dim(W, i, 1, 0).reshape(W.shape[1:])),
        batched_dot=lambda W, x: lax.fori_loop(0, L, lambda i, x: jnp.tanh(jnp.einsum(
            "mk,bkn->bmn", x, lax.dynamic_slice_in_dim(W, i, 1, 0))[0]), x),
        scan=lambda W, x: lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, W)[0],
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--m", default="1,8,256")
    args = ap.parse_args()
    L, K = args.layers, (64 if args.small else 4096)  # square K x K weights: the loop carry keeps its shape
    W = jax.random.normal(jax.random.key(0), (L, K, K), jnp.bfloat16) * K**-0.5
    ws = tuple(W[i] for i in range(L))
    floor_s = L * K * K * 2 / 4.3e12
    rows = []
    for M in map(int, args.m.split(",")):
        x = jax.random.normal(jax.random.key(1), (M, K), jnp.bfloat16)
        ref = None
        for name, fn in forms(L).items():
            w = ws if name == "unrolled" else W
            compiled = jax.jit(fn).lower(w, x).compile()
            mem = compiled.memory_analysis()
            temp = getattr(mem, "temp_size_in_bytes", -1) if mem is not None else -1
            text = compiled.as_text()
            out = compiled(w, x)
            ref = out if ref is None else ref
            t = median_time(lambda: compiled(w, x), iters=20, warmup=3)
            row = dict(form=name, M=M, us_per_layer=round(t * 1e6 / L, 2), floor_us=round(floor_s * 1e6 / L, 2),
                       temp_mib=round(temp / 2**20, 2), layer_mib=round(K * K * 2 / 2**20, 2),
                       ds_roots=len(re.findall(r"ROOT \S+ = bf16\[[^\]]*\]\{[^}]*\} dynamic-slice", text)),
                       max_err=float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)))))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps(dict(device=str(jax.devices()[0]), rows=rows)))


if __name__ == "__main__":
    main()
