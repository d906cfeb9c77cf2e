"""Attention over the mixed KV cache plus the rows of the current forward, under one rule.

The rule (the semantics of a model under OSCAR): a query at position t reads key p <= t in BF16 iff
p < S or p > t - R, otherwise the INT2 (dequantized) copy. It holds alike for prefill, chunked prefill,
decode and K+1 verification; rows of the current chunk are fake-quantized exactly as commit will
quantize them, so a cached decode equals one full forward over the same tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jspec import quant
from jspec.config import KVConfig
from jspec.kvcache import LayerKV, bf16_keys

IMPLS = ("auto", "reference", "pallas")


def attend(q, k, v, layer: LayerKV | None, length, kv: KVConfig | None, impl: str = "reference"):
    """q: [B, n, Hq, D] rotated queries at positions length + 0..n-1; k, v: [B, n, Hkv, D] new rows.

    layer is this layer's cache (None: no cache, plain causal attention over the n rows).
    Returns [B, n, Hq, D].
    """
    if impl == "pallas" and layer is not None and kv is not None and kv.int2:
        from jspec.attention_fast import attend_split  # GPU path: Pallas INT2 kernel + XLA BF16 parts

        return attend_split(q, k, v, layer, length, kv)
    return attend_reference(q, k, v, layer, length, kv)


def attend_reference(q, k, v, layer, length, kv):
    """Pure-jnp attention implementing the rule by selecting, per (query, key), BF16 or INT2 scores."""
    B, n, Hq, D = q.shape
    H = k.shape[2]
    qg = q.reshape(B, n, H, Hq // H, D)
    t = length[:, None] + jnp.arange(n)  # [B, n] query positions
    k_bf, v_bf = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, H, n, D]
    kpos = t  # [B, X] key positions
    exists = jnp.ones((B, n), bool)
    int2 = kv is not None and kv.int2
    if int2:
        G = kv.group(D)
        k_q = quant.fake_quantize(k_bf, G, kv.clip_k, kv.scale_dtype)
        v_q = quant.fake_quantize(v_bf, G, kv.clip_v, kv.scale_dtype)
    if layer is not None:
        T = layer.hist_k.codes.shape[2] if int2 else layer.sink_k.shape[2]
        ck, cv = bf16_keys(layer, T)
        k_bf, v_bf = jnp.concatenate([ck.astype(k.dtype), k_bf], 2), jnp.concatenate([cv.astype(v.dtype), v_bf], 2)
        if int2:
            hk, hv = layer.hist_k, layer.hist_v
            k_q = jnp.concatenate([quant.dequantize(hk.codes, hk.scale, hk.zero, k.dtype), k_q], 2)
            v_q = jnp.concatenate([quant.dequantize(hv.codes, hv.scale, hv.zero, v.dtype), v_q], 2)
        cpos = jnp.broadcast_to(jnp.arange(T), (B, T))
        kpos = jnp.concatenate([cpos, kpos], 1)
        exists = jnp.concatenate([cpos < length[:, None], exists], 1)
    valid = exists[:, None, :] & (kpos[:, None, :] <= t[:, :, None])  # [B, n, X]
    scores = _dot_scores(qg, k_bf)  # [B, H, G, n, X]
    if int2:
        use_bf = (kpos[:, None, :] < kv.sink) | (kpos[:, None, :] > t[:, :, None] - kv.recent)
        use_bf = use_bf[:, None, None]  # [B, 1, 1, n, X]
        scores = jnp.where(use_bf, scores, _dot_scores(qg, k_q))
    scores = jnp.where(valid[:, None, None], scores * D**-0.5, -jnp.inf)
    p = jax.nn.softmax(scores, axis=-1)
    if int2:
        out = _dot_values(jnp.where(use_bf, p, 0), v_bf) + _dot_values(jnp.where(use_bf, 0, p), v_q)
    else:
        out = _dot_values(p, v_bf)
    return out.reshape(B, n, Hq, D).astype(q.dtype)  # [B, n, H, G, D] -> [B, n, Hq, D]


def einsum_f32(spec, a, b):
    """einsum accumulating in f32. XLA:CPU has no bf16 x bf16 -> f32 dot, so operands go up there."""
    if jax.default_backend() == "cpu":
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _dot_scores(qg, keys):
    # qg [B, n, H, G, D], keys [B, H, X, D] -> [B, H, G, n, X] in f32
    return einsum_f32("bnhgd,bhxd->bhgnx", qg, keys)


def _dot_values(p, vals):
    # p [B, H, G, n, X] f32, vals [B, H, X, D] -> [B, n, H, G, D] f32
    return einsum_f32("bhgnx,bhxd->bnhgd", p.astype(vals.dtype), vals)
