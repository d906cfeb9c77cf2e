"""Kernels per decode layer: how many fusions, scatters and sorts one layer's decode step compiles to.

    python benchmarks/op_count.py            # on whatever backend JAX finds (CPU here)

A decode step of a small model is launch-bound, so the number of kernels per layer bounds its fixed
cost. The step is compiled for 1 and 2 layers; the difference is the per-layer count.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec import kvcache, model
from jspec.config import KVConfig, ModelConfig


def counts(cfg: ModelConfig, kv: KVConfig) -> dict:
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    cache = kvcache.init_cache(cfg, kv, 2, 1024, jnp.bfloat16)

    def step(p, c, t):
        logits, (k, v) = model.forward(p, cfg, t, c)
        return logits, kvcache.commit(c, k, v, jnp.ones((2,), jnp.int32))

    hlo = jax.jit(step).lower(params, cache, jnp.zeros((2, 1), jnp.int32)).compile().as_text()
    return {op: hlo.count(f" {op}(") for op in ("fusion", "scatter", "sort", "custom-call")}


def main():
    base = ModelConfig("llama", 1024, 256, 512, 1, 4, 2, 64, max_position=4096)
    for kv in (KVConfig("bf16"), KVConfig("int2", sink=64, recent=256)):
        one, two = counts(base, kv), counts(dataclasses.replace(base, num_layers=2), kv)
        per_layer = {op: two[op] - one[op] for op in one}
        print(f"{jax.default_backend()} {kv.mode}: per layer {per_layer}")


if __name__ == "__main__":
    main()
