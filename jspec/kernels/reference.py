"""The pure-jnp INT2 history attention every INT2 kernel (Triton: int2_triton; Mosaic GPU: hopper) is tested
against, and falls back to for group sizes G < D."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jspec.int2.planes import code_plane, qparam_plane
from jspec.int2.quant import dequantize


def int2_attention_reference(q, codes, qparams, lo, hi, *, sm_scale=None):
    """Pure-jnp int2_attention: dequantise everything, masked softmax over [lo, hi) per row, in f32.

    q [B, H, M, D]; codes [B, H, 2, T, D/4] uint8 (or [.., D/16] uint32 words); qparams [B, H, 4, T, D/G];
    lo, hi [B, M]. Returns out [B, H, M, D] f32 (0 where empty) and lse [B, H, M] (-inf where empty)."""
    D = q.shape[-1]
    sm_scale = D**-0.5 if sm_scale is None else sm_scale
    if codes.dtype == jnp.uint32:  # int2_triton.as_words' view, back to bytes
        codes = lax.bitcast_convert_type(codes, jnp.uint8).reshape(*codes.shape[:-1], -1)
    k, v = (dequantize(codes[:, :, code_plane(kind)], qparams[:, :, qparam_plane(f"scale_{kind}")],
                       qparams[:, :, qparam_plane(f"zero_{kind}")]) for kind in "kv")
    s = jnp.einsum("bhmd,bhtd->bhmt", q.astype(jnp.float32), k, precision=lax.Precision.HIGHEST) * sm_scale
    pos = jnp.arange(k.shape[2])
    valid = (pos >= lo[:, None, :, None]) & (pos < hi[:, None, :, None])  # [B, 1, M, T]
    s = jnp.where(valid, s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.where(valid, jnp.exp(s - jnp.where(jnp.isfinite(lse), lse, 0.0)[..., None]), 0.0)
    out = jnp.einsum("bhmt,bhtd->bhmd", p, v, precision=lax.Precision.HIGHEST)
    return out, jnp.where(jnp.isfinite(lse), lse, -jnp.inf)
