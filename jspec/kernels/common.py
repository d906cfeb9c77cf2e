"""What the INT2 attention kernels and their callers share: the numeric constants of the softmax in base 2, the
offset the Mosaic kernels' raw partials carry, and the merge of softmax partials (split-K)."""

from __future__ import annotations

import jax.numpy as jnp

NEG = -1e30  # finite start for a running max: fully masked rows stay NaN-free
LOG2E = 1.4426950408889634  # scores in the log2 domain: exp2 is the native instruction
LN2 = 0.6931471805599453
# What the Mosaic kernels' value unpack leaves on every code (bf16 128.0 as the magic): their raw partials
# carry RAW_OFFSET sum(w), removed by hopper.attention.finish or window_merge.
RAW_OFFSET = 128.0
# The Triton kernels that index a whole buffer (int2_commit over the [L, ...] stacks, window_merge) compute element
# offsets in int32: a buffer of more elements would be written and read at wrapped offsets (seen on an H100: an
# illegal address in the 8B step at batch 1 / 128K, whose codes stack holds 2.15e9 bytes). Their callers take the
# jnp path past it.
MAX_INDEXED = 2**31


def int32_indexable(*arrays) -> bool:
    """Whether every array has fewer than 2^31 elements (MAX_INDEXED): a Triton kernel may index it whole."""
    return all(x.size < MAX_INDEXED for x in arrays)


def merge_lse(out, lse, axis: int):
    """Merges softmax partials along `axis`: out [..., X, M, D] normalised, lse [..., X, M].

    Partials with lse = -inf (empty) get weight 0; a row empty everywhere gives out 0, lse -inf.
    """
    m = lse.max(axis=axis, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    w = jnp.exp(lse - m)  # [..., X, M]
    den = w.sum(axis=axis)
    o = (jnp.expand_dims(w, -1) * out).sum(axis=axis) / jnp.where(den > 0, den, 1.0)[..., None]
    lse = jnp.where(den > 0, jnp.squeeze(m, axis) + jnp.log(jnp.where(den > 0, den, 1.0)), -jnp.inf)
    return o, lse
