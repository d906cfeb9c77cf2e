"""Kernels per decode layer: how many fusions, scatters and sorts one layer's decode step compiles to.

    PYTHONPATH=. python tools/op_count.py            # on whatever backend JAX finds (CPU here)

A decode step of a small model is launch-bound, so the number of kernels per layer bounds its fixed
cost. The step is compiled for 2 and 3 layers; the difference is the per-layer count.

Cases: bf16 and int2 through the reference attention (what the CPU runs), and "int2 split": the INT2
path the GPU runs (attention_split with the Mosaic kernel's wrapper), its kernel replaced by a host
callback of the same shapes, so that the CPU compiles everything around it as the GPU step has it;
last, the same with the whole kernel call stubbed (what tests/test_step_ops.py pins). XLA:CPU fuses
differently from XLA:GPU, but the concatenates, reductions, transposes and scatters of the jnp code
show up in both: "concatenate" etc. count the ops inside the fusions too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig, Options
from jspec.kernels.hopper import attention as int2_mosaic
from jspec.model import decoder as model

OPS = ("fusion", "concatenate", "reduce", "transpose", "scatter", "dynamic-update-slice", "dot", "sort",
       "custom-call")

# A small config with the 8B target's head shape (D = 128, 4 query heads per KV head): the Mosaic
# wrapper's own shapes depend on them.
SMALL = ModelConfig("llama", 1024, 256, 512, 1, 4, 1, 128, max_position=4096)


def _stub_kernel(kernel, *, out_type, **_):
    """Stands in for plgpu.kernel on a CPU: a host callback with the kernel's output shapes."""
    def call(*args):
        zeros = lambda *a: tuple(np.zeros(t.shape, t.dtype) for t in out_type)
        return jax.pure_callback(zeros, out_type, *args)
    return call


def _stub_call(q, codes, qparams, lo, hi, *, merge=True, splits: int = 2, **_):
    """Stands in for the whole int2_attention_mosaic call: unmerged partials of `splits` splits."""
    B, H, M, D = q.shape
    f32 = jnp.float32
    shapes = (jax.ShapeDtypeStruct((B, H, splits, M, D), f32), jax.ShapeDtypeStruct((B, H, splits, M), f32))
    zeros = lambda *a: tuple(np.zeros(t.shape, t.dtype) for t in shapes)
    assert not merge
    return jax.pure_callback(zeros, shapes, q, codes, qparams, lo, hi)


@contextlib.contextmanager
def mosaic_stub(wrapper: bool = True):
    """The Mosaic kernel traced on a CPU as a host callback: with its wrapper (prepare, schedule, finish:
    part of the GPU step) around it, or (wrapper=False) the whole call, to count the rest alone."""
    patch = (mock.patch.object(int2_mosaic.plgpu, "kernel", _stub_kernel) if wrapper
             else mock.patch.object(int2_mosaic, "int2_attention_mosaic", _stub_call))
    with mock.patch.object(int2_mosaic, "available", lambda: True), patch:
        yield


def step_hlo(cfg: ModelConfig, kv: KVConfig, impl: str = "reference", batch: int = 2, n: int = 1,
             wrapper: bool = True) -> str:
    """The compiled HLO text of one decode step (forward over n tokens per row + commit of all n).
    impl "mosaic": the GPU's INT2 path, the kernel stubbed (mosaic_stub(wrapper))."""
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    if kv.int2:
        eye = jnp.eye(cfg.head_dim, dtype=jnp.float32)
        rot_k = jnp.broadcast_to(eye, (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim))
        params = dataclasses.replace(params, layers=dataclasses.replace(params.layers, rot_k=rot_k))
    cache = kvcache.init_cache(cfg, kv, batch, 1024, jnp.bfloat16)

    def step(p, c, t):  # the layers unrolled, as a GPU runs them: 1 and 2 layers then differ by one layer's ops
        logits, (k, v) = model.forward(p, cfg, t, c, attn_impl=impl, options=Options(layer_unroll=True))
        return logits, kvcache.commit(c, k, v, jnp.full((batch,), n, jnp.int32))

    stub = mosaic_stub(wrapper) if impl == "mosaic" else contextlib.nullcontext()
    jax.clear_caches()  # the nested jits (model._block) would keep a trace made under another stub
    with stub:
        return jax.jit(step).lower(params, cache, jnp.zeros((batch, n), jnp.int32)).compile().as_text()


def count(hlo: str) -> dict:
    """Instructions by opcode (those inside fusions included); "fusion": fusion calls."""
    return {op: len(re.findall(rf" {op}\(", hlo)) for op in OPS}


def per_layer(cfg: ModelConfig, kv: KVConfig, impl: str = "reference", batch: int = 2, n: int = 1,
              wrapper: bool = True) -> dict:
    # 2 and 3 layers, not 1 and 2: with two or more, the step joins the layers' new rows for the commit (two
    # concatenates per step, not per layer)
    two = count(step_hlo(dataclasses.replace(cfg, num_layers=2), kv, impl, batch, n, wrapper))
    three = count(step_hlo(dataclasses.replace(cfg, num_layers=3), kv, impl, batch, n, wrapper))
    return {op: three[op] - two[op] for op in OPS}


CASES = {"bf16": (KVConfig("bf16"), "reference"), "int2": (KVConfig("int2", sink=64, recent=256), "reference"),
         "int2 split": (KVConfig("int2", sink=64, recent=256), "mosaic")}


def main():
    for name, (kv, impl) in CASES.items():
        for batch, n in ((1, 1), (2, 5)):
            print(f"{jax.default_backend()} {name} B={batch} n={n}: per layer {per_layer(SMALL, kv, impl, batch, n)}",
                  flush=True)
    kv, impl = CASES["int2 split"]
    print(f"{jax.default_backend()} int2 split B=1 n=1 without the kernel's wrapper: per layer "
          f"{per_layer(SMALL, kv, impl, 1, 1, wrapper=False)}", flush=True)


if __name__ == "__main__":
    main()
