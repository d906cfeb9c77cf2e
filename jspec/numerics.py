"""Products that accumulate in float32, shared by the model and both attention paths (a leaf module).

XLA:CPU has no bf16 x bf16 -> f32 dot, so there the operands go up to f32 first. Which platform a product runs
on is chosen when its program is lowered, for the platform it is lowered for (lax.platform_dependent keeps the
one branch), not by asking JAX's default backend while tracing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def einsum_f32(spec, a, b):
    """einsum accumulating in f32 (operands up to f32 on the CPU)."""
    if a.dtype == b.dtype == jnp.float32:
        return _product(spec, a, b)
    return jax.lax.platform_dependent(a, b, cpu=functools.partial(_upcast_product, spec),
                                      default=functools.partial(_product, spec))


def logits_f32(x, head):
    """A vocabulary head: x [..., E] @ head [E, V] -> [..., V] f32. BF16 operands name their algorithm (bf16
    products accumulated in f32, which is what the default means for them): under model.SCAN_OPTIONS (XLA's
    Triton GEMMs off) the unnamed one-row product converted the whole head to f32 on every step, 1.26 ms
    where this takes 0.24 (8B head, H200: docs/kernels.md). Unchanged elsewhere."""
    spec = "...e,ev->...v"
    if x.dtype != jnp.bfloat16 or head.dtype != jnp.bfloat16:
        return einsum_f32(spec, x, head)
    return jax.lax.platform_dependent(x, head, cpu=functools.partial(_upcast_product, spec), default=_bf16_logits)


def dot_scores(qg, keys):
    # qg [B, n, H, G, D], keys [B, H, X, D] -> [B, H, G, n, X] in f32
    return einsum_f32("bnhgd,bhxd->bhgnx", qg, keys)


def _product(spec, a, b):
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _upcast_product(spec, a, b):
    return _product(spec, a.astype(jnp.float32), b.astype(jnp.float32))


def _bf16_logits(x, head):
    return jnp.einsum("...e,ev->...v", x, head, preferred_element_type=jnp.float32,
                      precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32)
