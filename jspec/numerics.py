"""Products that accumulate in float32, shared by the model and both attention paths (a leaf module)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def einsum_f32(spec, a, b):
    """einsum accumulating in f32. XLA:CPU has no bf16 x bf16 -> f32 dot, so operands go up there."""
    if jax.default_backend() == "cpu":
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def logits_f32(x, head):
    """A vocabulary head: x [..., E] @ head [E, V] -> [..., V] f32. BF16 operands name their algorithm (bf16
    products accumulated in f32, which is what the default means for them): under model.SCAN_OPTIONS (XLA's
    Triton GEMMs off) the unnamed one-row product converted the whole head to f32 on every step, 1.26 ms
    where this takes 0.24 (8B head, H200: docs/kernels.md). Unchanged elsewhere."""
    if x.dtype != jnp.bfloat16 or head.dtype != jnp.bfloat16 or jax.default_backend() == "cpu":
        return einsum_f32("...e,ev->...v", x, head)
    return jnp.einsum("...e,ev->...v", x, head, preferred_element_type=jnp.float32,
                      precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32)


def dot_scores(qg, keys):
    # qg [B, n, H, G, D], keys [B, H, X, D] -> [B, H, G, n, X] in f32
    return einsum_f32("bnhgd,bhxd->bhgnx", qg, keys)
