"""Session 10 probe (issue 14): do stacked, scanned layers read their weights in place on the GPU?

The lost branch issue14-scan measured every step 2x slower: XLA copied each layer's weight slice out of
the stack. XLA's legacy Triton GEMM emitter does accept a dynamic-slice on the majormost dimension as
an operand producer, so this times model.block over 8B-shaped layers (no KV cache: weights dominate)
unrolled against three scanned forms, and reports each program's temporary bytes and its fusions that
slice weights on their own (a copy) rather than inside a GEMM.

    python benchmarks/results/logs10/scan_probe.py [--small] [--layers 8] [--tokens 1,5,256]
"""

import argparse
import json
import re
import time

import jax
import jax.numpy as jnp

from benchmarks.timing import median_time
from jspec import model
from jspec.config import ModelConfig


def shapes(small):
    if small:
        return dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16)
    return dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                num_kv_heads=8, head_dim=128)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", default="1,5,256")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hlo", default="")
    ap.add_argument("--variants", default="unrolled,scan_xs,fori_index,fori_dynamic")
    args = ap.parse_args()
    kw = shapes(args.small) | dict(num_layers=args.layers)
    cfg = ModelConfig(model_type="llama", **kw)
    params = model.init_params(cfg, jax.random.key(0), jnp.bfloat16)
    layers = params.layers
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *layers)
    L = len(layers)

    def body(lp, x, pos, rope, length):
        return model.block(lp, x, pos, rope, None, length, cfg=cfg, kv=None, attn_impl="reference")[0]

    def unrolled(layers, x, pos, rope, length):
        for lp in layers:
            x = body(lp, x, pos, rope, length)
        return x

    def scan_xs(st, x, pos, rope, length):
        return jax.lax.scan(lambda x, lp: (body(lp, x, pos, rope, length), None), x, st)[0]

    def fori_index(st, x, pos, rope, length):
        step = lambda i, x: body(jax.tree.map(lambda a: a[i], st), x, pos, rope, length)
        return jax.lax.fori_loop(0, L, step, x)

    def fori_dynamic(st, x, pos, rope, length):
        pick = lambda a, i: jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)
        step = lambda i, x: body(jax.tree.map(lambda a: pick(a, i), st), x, pos, rope, length)
        return jax.lax.fori_loop(0, L, step, x)

    variants = dict(unrolled=(unrolled, layers), scan_xs=(scan_xs, stacked), fori_index=(fori_index, stacked),
                    fori_dynamic=(fori_dynamic, stacked))
    weight_bytes = sum(a.nbytes for a in jax.tree.leaves(layers[0]))
    out = dict(device=str(jax.devices()[0]), layers=L, layer_weight_bytes=weight_bytes, rows=[])
    for n in map(int, args.tokens.split(",")):
        B = args.batch
        x = jax.random.normal(jax.random.key(1), (B, n, cfg.hidden_size), jnp.bfloat16)
        length = jnp.zeros((B,), jnp.int32)
        pos = length[:, None] + jnp.arange(n)
        rope = model.rope_tables(cfg, pos)
        for name in args.variants.split(","):
            fn, w = variants[name]
            t0 = time.perf_counter()
            compiled = jax.jit(fn).lower(w, x, pos, rope, length).compile()
            compile_s = time.perf_counter() - t0
            mem = compiled.memory_analysis()
            temp = getattr(mem, "temp_size_in_bytes", -1) if mem is not None else -1
            text = compiled.as_text()
            # fusions whose root slices a stacked weight on its own: a copy out of the stack
            copies = len(re.findall(r"ROOT \S+ = bf16\[[^\]]*\]\{[^}]*\} dynamic-slice", text))
            ds_in_gemm = len(re.findall(r"triton_gemm[^\n]*\n(?:[^\n]*\n){0,12}?[^\n]*dynamic-slice", text))
            if args.hlo:
                open(f"{args.hlo}_{name}_n{n}.txt", "w").write(text)
            t = median_time(lambda: compiled(w, x, pos, rope, length), iters=20, warmup=3)
            row = dict(variant=name, tokens=n, batch=B, ms=round(t * 1e3, 3), per_layer_ms=round(t * 1e3 / L, 3),
                       compile_s=round(compile_s, 2), temp_mib=round(temp / 2**20, 1), ds_roots=copies,
                       ds_near_gemm=ds_in_gemm)
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
