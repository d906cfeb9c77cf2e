"""Attention over the mixed KV cache plus the rows of the current forward, under one rule.

The rule (the semantics of a model under OSCAR): a query at position t reads key p <= t in BF16 iff
p < S or p > t - R, otherwise the INT2 (dequantized) copy. It holds alike for prefill, chunked prefill,
decode and K+1 verification; rows of the current chunk are fake-quantized exactly as commit will
quantize them, so a cached decode equals one full forward over the same tokens.

The window-only path (a cache whose KVConfig is "window": a drafter's flat cache, or kvcache.window_view of
the target's for the self-draft) keeps the BF16 half of the rule and drops the other: a query at t reads key
p <= t iff p < S or p > t - R, and nothing else. It reads the S + W window slots as they lie (never the INT2
history, so on the split path no kernel runs), and, for a cache.scratch view (a self-draft step), the scratch
rows written past the cache's length as well.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jspec.attention.split import attend_split, noise_shift, per_shard
from jspec.cache.kvcache import LayerKV, bf16_keys, dequantize_history, fake_quantize_kv
from jspec.cache.scratch import ScratchLayer
from jspec.config import KVConfig
from jspec.numerics import dot_scores, einsum_f32


def attend(q, k, v, layer: LayerKV | ScratchLayer | None, length, kv: KVConfig | None, impl: str = "reference",
           qkv=None, fused_window: bool | None = None, interpret: bool | None = None, key_noise=None):
    """q: [B, n, Hq, D] rotated queries and k, v: [B, n, Hkv, D] their new rows, at positions length + 0..n-1.

    layer is this layer's cache (None: no cache, plain causal attention over the n rows; a ScratchLayer: a
    window view and its scratch rows, with a "window" kv). qkv: the one
    [B, n, Hkv, g + 2, D] array that q, k and v are slices of (model.qkv_slots), if the caller has it (the split
    path's window kernel reads it whole). fused_window, interpret: the split path's (attend_split). key_noise:
    [Hkv] (Layer.key_noise) or None: the INT2 scores' bias taken out (split.noise_shift).
    Returns [B, n, Hq, D].
    """
    if kv is not None and kv.windowed:  # no history to read: the BF16 window in XLA, whatever the impl
        return attend_reference(q, k, v, layer, length, kv)
    if impl in ("pallas", "mosaic", "triton") and layer is not None and kv is not None and kv.int2:
        # The split path (Pallas INT2 kernel + XLA BF16 parts); under a mesh it runs per device.
        kernel = "auto" if impl == "pallas" else impl  # pallas: mosaic where wgmma exists, else triton
        split = functools.partial(attend_split, kernel=kernel, fused_window=fused_window, interpret=interpret)
        return per_shard(split)(q, k, v, layer, length, kv, qkv=qkv, key_noise=key_noise)
    return attend_reference(q, k, v, layer, length, kv, key_noise)


def attend_reference(q, k, v, layer, length, kv, key_noise=None):
    """Pure-jnp attention implementing the rule by selecting, per (query, key), BF16 or INT2 scores (a "window"
    kv: the window's keys alone, see the module docstring); key_noise: attend's.

    The cache and the chunk's own rows are scored separately and joined only at the softmax, so the
    cache is read in place (never concatenated with the new rows: that would copy it every step).
    """
    B, n, Hq, D = q.shape
    H = k.shape[2]
    qg = q.reshape(B, n, H, Hq // H, D)
    t = length[:, None] + jnp.arange(n)  # [B, n] query positions
    window = kv is not None and kv.windowed
    parts = [_chunk_keys(k, v, length, kv)]
    if isinstance(layer, ScratchLayer):  # a self-draft step: the window at the cache's length, then the scratch
        parts = [_window_keys(layer.window, layer.base, kv, k.dtype), _scratch_keys(layer, k.dtype), *parts]
    elif layer is not None:
        parts.insert(0, (_window_keys if window else _cache_keys)(layer, length, kv, k.dtype))
    # the INT2 scores' bias (split.noise_shift) [B, H, G, n, 1], in units of the unscaled score
    shift = 0.0 if key_noise is None else noise_shift(qg, key_noise, axis=2).transpose(0, 2, 3, 1)[..., None] / D**-0.5
    scores, values = [], []
    for kpos, exists, kb, vb, kq, vq in parts:
        s = dot_scores(qg, kb)  # [B, H, G, n, X]
        valid = exists[:, None, :] & (kpos[:, None, :] <= t[:, :, None])  # [B, n, X]
        if window:  # outside the window: not attended
            valid &= (kpos[:, None, :] < kv.sink) | (kpos[:, None, :] > t[:, :, None] - kv.recent)
        valid = valid[:, None, None]  # [B, 1, 1, n, X]
        use_bf = True
        if kq is not None:
            use_bf = (kpos[:, None, :] < kv.sink) | (kpos[:, None, :] > t[:, :, None] - kv.recent)
            use_bf = use_bf[:, None, None]
            s = jnp.where(use_bf, s, dot_scores(qg, kq) - shift)
        scores.append(jnp.where(valid, s * D**-0.5, -jnp.inf))
        values.append((use_bf, vb, vq))
    if len(scores) > 1:
        # Without the barrier XLA:GPU fused the chunk's score reduction (and its RoPE) into the concatenation
        # below, as one badly parallel kernel: 255 us per single-token step of the EAGLE-3 head on the H200,
        # against ~3 us for the rest of its attention (docs/results.md). Numerics unchanged.
        scores[-1] = jax.lax.optimization_barrier(scores[-1])
    p = jax.nn.softmax(jnp.concatenate(scores, -1), axis=-1)
    out, start = 0.0, 0
    for (use_bf, vb, vq), s in zip(values, scores):
        pi = p[..., start : start + s.shape[-1]]
        start += s.shape[-1]
        if vq is None:
            out += _dot_values(pi, vb)
        else:
            out += _dot_values(jnp.where(use_bf, pi, 0), vb) + _dot_values(jnp.where(use_bf, 0, pi), vq)
    return out.reshape(B, n, Hq, D).astype(q.dtype)  # [B, n, H, G, D] -> [B, n, Hq, D]


def _chunk_keys(k, v, length, kv):
    """The forward's own rows [B, n, ..] at positions length + 0..n-1: (positions, exists, k, v, INT2 k, INT2 v),
    each [B, H, n, D]."""
    kb, vb = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    kq, vq = fake_quantize_kv(kb, vb, kv) if kv is not None and kv.int2 else (None, None)
    t = length[:, None] + jnp.arange(k.shape[1])
    return t, jnp.ones(t.shape, bool), kb, vb, kq, vq


def _window_keys(layer: LayerKV, length, kv, dtype):
    """The window's slots as they lie [B, H, S + W, D], with the position each holds (layer.window_positions):
    a pinned slot p exists once p < length, a ring slot when it holds a position >= S."""
    S = layer.pinned_slots
    kpos = layer.window_positions(length)  # [B, S + W]
    exists = (kpos >= 0) & (kpos < length[:, None]) & ((jnp.arange(kpos.shape[1]) < S) | (kpos >= S))
    return kpos, exists, layer.k.astype(dtype), layer.v.astype(dtype), None, None


def _scratch_keys(layer: ScratchLayer, dtype):
    """A scratch's rows [B, H, K, D] at the cache's length + 0..K-1, those written so far existing."""
    kpos, exists = layer.row_positions()
    return kpos, exists, *(x.transpose(0, 2, 1, 3).astype(dtype) for x in (layer.k, layer.v)), None, None


def _cache_keys(layer: LayerKV, length, kv, dtype):
    """Committed keys at positions 0..T-1: BF16 copies and, for int2, the dequantized history."""
    B = length.shape[0]
    T = layer.history_slots if kv.int2 else layer.pinned_slots  # bf16: every position is pinned
    kb, vb = bf16_keys(layer, T)
    kq, vq = dequantize_history(layer, dtype) if kv.int2 else (None, None)
    kpos = jnp.broadcast_to(jnp.arange(T), (B, T))
    return kpos, kpos < length[:, None], kb.astype(dtype), vb.astype(dtype), kq, vq


# Over this many keys the value product runs in chunks of VALUE_CHUNK keys (see _dot_values).
LONG_VALUES, VALUE_CHUNK = 8192, 256


def _dot_values(p, vals):
    # p [B, H, G, n, X] f32, vals [B, H, X, D] -> [B, n, H, G, D] f32
    B, H, X, D = vals.shape
    p = p.astype(vals.dtype)
    if X <= LONG_VALUES or X % VALUE_CHUNK:
        return einsum_f32("bhgnx,bhxd->bnhgd", p, vals)
    # A long contraction makes XLA:GPU pick a split-K GEMM and pad X to its tile: a padded copy of the
    # whole value cache, every layer of every step (5.4 ms of a 17.6 ms step at 128K, measured). Chunks
    # of the key axis as a batch dimension need no padding; the barrier keeps XLA from folding the sum
    # over chunks back into the contraction.
    c = X // VALUE_CHUNK
    part = einsum_f32("bhgnck,bhckd->bnhgcd", p.reshape(*p.shape[:-1], c, VALUE_CHUNK),
                      vals.reshape(B, H, c, VALUE_CHUNK, D))
    return jax.lax.optimization_barrier(part).sum(axis=4)
