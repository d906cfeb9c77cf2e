"""Products that accumulate in float32, shared by the model and both attention paths (a leaf module)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def einsum_f32(spec, a, b):
    """einsum accumulating in f32. XLA:CPU has no bf16 x bf16 -> f32 dot, so operands go up there."""
    if jax.default_backend() == "cpu":
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def dot_scores(qg, keys):
    # qg [B, n, H, G, D], keys [B, H, X, D] -> [B, H, G, n, X] in f32
    return einsum_f32("bnhgd,bhxd->bhgnx", qg, keys)
