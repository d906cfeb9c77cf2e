"""(Session 21 took qkv_rows out of the library: `git apply benchmarks/results/logs21/qkv_rows.patch` to run this.)

Issue 16, prepared in session 20 for session 21: pallas/qkv_rows.py alone against the XLA kernels it replaces,
8B shapes (Hkv 8, g 4, D 128), kernel time from a trace. Each variant runs 32 layers in one jitted call (32
different R_K, as in a step, so that they do not all sit in L2), and the time per layer is the sum of its kernels
(the QKV projection's GEMM left out) over 32.

    PYTHONPATH=.:benchmarks python benchmarks/results/logs20/rows_probe.py --batch 1,8 --out $OUT/rows_probe.json

Variants: xla (model.qkv after the projection, prepare_imma and row_vectors: the default path), xla-rows (model.qkv
alone), rows-wN (qkv_rows without the quantised queries, N warps), rows-sN (N programs per KV head), prepared-wN
(with them), prepared-bf16rot (R_K passed in bf16). --small: a CPU check of the script (interpret mode, tiny shapes, no trace).
"""
import argparse, json, sys, time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
from jspec import attention_split, model  # noqa: E402
from jspec.config import KVConfig, ModelConfig  # noqa: E402
from jspec.pallas import int2_mosaic, int2_mosaic_lean, qkv_rows as qr  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--batch", default="1,8")
ap.add_argument("--variants", default="xla,xla-rows,rows-w1,rows-w2,rows-w4,rows-w8,rows-s2,rows-s4,rows-s8,"
                "prepared-w1,prepared-w2,prepared-w4,prepared-w8,prepared-bf16rot")
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--out", default="/tmp/rows_probe.json")
ap.add_argument("--small", action="store_true")
a = ap.parse_args()

cfg = ModelConfig(model_type="llama", vocab_size=128, hidden_size=4096, intermediate_size=128, num_layers=1,
                  num_heads=32, num_kv_heads=8, head_dim=128, max_position=1 << 18)
if a.small:
    cfg = ModelConfig(model_type="llama", vocab_size=32, hidden_size=64, intermediate_size=32, num_layers=1,
                      num_heads=16, num_kv_heads=4, head_dim=64, max_position=4096)
L, kv = (2 if a.small else a.layers), KVConfig(sink=64, recent=256)
Hkv, g, D = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
rng = np.random.default_rng(0)
base = model.init_params(cfg, jax.random.PRNGKey(0), jnp.bfloat16).layers[0]
orthogonal = lambda: np.swapaxes(np.linalg.qr(rng.standard_normal((Hkv, D, D)))[0], 1, 2)
rots = [jnp.asarray(orthogonal(), jnp.bfloat16).astype(jnp.float32) for _ in range(L)]


def variant(name: str, B: int):
    """fn(h, length, rots) for the variant: L layers' q, k, v (and quantised queries) from one h."""
    kind, opt = name.split("-", 1) if "-" in name else (name, "")
    warps = int(opt[1:]) if opt.startswith("w") else None
    split = int(opt[1:]) if opt.startswith("s") else None
    interpret = a.small

    def fn(h, length, rots):
        pos = length[:, None]
        rope = model.rope_tables(cfg, pos)
        lo, hi = attention_split.history_range(length, 1, g, kv)
        outs = []
        for r in rots:
            lp = base.replace(rot_k=r)
            if kind.startswith("xla"):
                q, k, v = model.qkv(lp, cfg, h, pos, rope)
                outs += [q, k, v]
                if kind == "xla":
                    outs += list(int2_mosaic_lean.prepare_imma(q.reshape(B, Hkv, g, D), lo, hi, 1 << 17, 49, 128)[:2])
            else:
                rot = r.astype(jnp.bfloat16) if opt == "bf16rot" else r
                N = -(-g // 8) * 8
                lohi = jnp.pad(jnp.stack([lo, hi], 1), ((0, 0), (0, 0), (0, N - g))).astype(jnp.float32)
                outs += list(qr.qkv_rows(model.project(lp, h), *rope, rot, lohi=lohi if kind == "prepared" else None,
                                         prepare=kind == "prepared", interpret=interpret, warps=warps,
                                         split=split))
        return outs

    return jax.jit(fn)


rows = []
for B in map(int, a.batch.split(",")):
    h = jnp.asarray(rng.standard_normal((B, 1, cfg.hidden_size)), jnp.bfloat16)
    length = jnp.full((B,), 100_000 if not a.small else 1000, jnp.int32)
    for name in a.variants.split(","):
        row = dict(B=B, variant=name)
        try:
            fn = variant(name, B)
            jax.block_until_ready(fn(h, length, rots))
            if not a.small:
                from profile_step import gpu_kernels, kernel_kind  # benchmarks/profile_step.py

                trace = f"/tmp/rows_probe_{B}_{name}"
                jax.profiler.start_trace(trace)
                for _ in range(3):
                    jax.block_until_ready(fn(h, length, rots))
                jax.profiler.stop_trace()
                ev = [(kernel_kind(n), d) for n, _, d, _ in gpu_kernels(trace) if "gemm" not in n and "dot" not in n]
                kinds = {}
                for n, d in ev:
                    kinds[n] = kinds.get(n, 0.0) + d / 3 / L / 1e3
                row.update(us_per_layer=round(sum(kinds.values()), 2), kernels_per_layer=len(ev) / 3 / L,
                           kinds={k: round(v, 2) for k, v in sorted(kinds.items(), key=lambda x: -x[1])})
        except Exception as e:  # one failing variant must not lose the run
            row["error"] = repr(e)[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
json.dump(dict(device=str(jax.devices()[0]), rows=rows), open(a.out, "w"), indent=1)
