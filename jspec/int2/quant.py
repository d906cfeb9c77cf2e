"""The OSCAR INT2 codec: per-row quantile clip, asymmetric min-max per group, planar 2-bit packing.

A row is one (token, KV head) vector of D values, already in the rotated basis. Each row is coded on
its own, so a committed token is quantized exactly once and never re-quantized.

Planar packing: byte j holds the codes of dims j, j+D/4, j+D/2, j+3D/4 in bits 0-1, 2-3, 4-5, 6-7.
Bit-pair i of every byte is therefore the contiguous quarter i of the row, which lets a kernel compute
q.k as four small dots without any interleaving.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def clip_rows(x, ratio):
    """Symmetric clip of each row at thr = sort(|x|)[floor(ratio * D)]; ratio <= 0 disables.

    ratio: a float, or one per plane of axis -2 (keys and values stacked: (clip_k, clip_v)).
    """
    idx = _clip_index(ratio, x.shape[-1])
    if idx is None:
        return x
    thr = jnp.where(idx >= 0, order_statistic(jnp.abs(x), idx), jnp.inf)
    return jnp.clip(x, -thr, thr)


def _clip_index(ratio, D: int):
    """The clip quantile's index into the sorted row ([1] or [P, 1]; -1 where disabled), None if all are."""
    ratio = np.asarray(ratio, np.float64)[..., None]  # [1] or [P, 1]: against x.shape[:-1] + (1,)
    if (ratio <= 0).all():
        return None
    return np.where(ratio > 0, np.minimum((ratio * D).astype(np.int32), D - 1), -1)


# Rows up to which order_statistic counts ranks instead of sorting (decode and verification sizes).
RANK_ROWS = 8192


def order_statistic(a, idx):
    """sort(a)[..., idx] as [..., 1], idx broadcastable to a.shape[:-1] + (1,).

    Few rows (decode, verification): by counting ranks, a D x D compare-and-sum that XLA fuses into one
    reduction, where a sort is kernels of its own. sort(a)[idx] is exactly the least entry with more than
    idx entries <= it: any smaller entry has at most idx. Many rows (prefill): a sort.
    """
    if a.size // a.shape[-1] > RANK_ROWS:
        return jnp.take_along_axis(jnp.sort(a, axis=-1), jnp.broadcast_to(idx, a.shape[:-1] + (1,)), axis=-1)
    return jnp.min(rank_candidates(a, idx), axis=-1, keepdims=True)


def rank_candidates(a, idx):
    """a where more than idx entries of its row are <= it, else inf: the row's minimum is sort(a)[idx]."""
    le = (a[..., None, :] <= a[..., :, None]).sum(-1, dtype=jnp.int32)  # [..., D]
    return jnp.where(le > idx, a, jnp.inf)


def _threshold_and_range(x, group: int, ratio):
    """(thr [..., 1] of clip_rows, or None when no plane clips; min and max [..., D/G] of each unclipped
    group). Clipping is monotone, so clipping these extremes gives the clipped group's.

    With ranks counted and one group per row, the threshold's last reduction and the extremes are one
    variadic reduction over the row (one kernel), which reads x and needs nothing after the rank count.
    """
    D = x.shape[-1]
    xg = x.reshape(*x.shape[:-1], D // group, group)  # [..., D/G, G]
    idx = _clip_index(ratio, D)
    if idx is None:
        return None, xg.min(-1), xg.max(-1)
    if x.size // D > RANK_ROWS or group != D:
        thr = jnp.where(idx >= 0, order_statistic(jnp.abs(x), idx), jnp.inf)
        return thr, xg.min(-1), xg.max(-1)
    inf = jnp.asarray(jnp.inf, x.dtype)
    min_min_max = lambda p, q: (jnp.minimum(p[0], q[0]), jnp.minimum(p[1], q[1]), jnp.maximum(p[2], q[2]))
    thr, mn, mx = jax.lax.reduce((rank_candidates(jnp.abs(x), idx), x, x), (inf, inf, -inf), min_min_max,
                                  (x.ndim - 1,))
    return jnp.where(idx >= 0, thr[..., None], jnp.inf), mn[..., None], mx[..., None]


def pack(codes):
    """[..., D] codes in [0, 3] -> [..., D/4] uint8, quarter i in bits 2i..2i+1."""
    D = codes.shape[-1]
    c = codes.astype(jnp.uint8).reshape(*codes.shape[:-1], 4, D // 4)
    return c[..., 0, :] | (c[..., 1, :] << 2) | (c[..., 2, :] << 4) | (c[..., 3, :] << 6)


def unpack(packed):
    """[..., D/4] uint8 -> [..., D] codes (uint8 in [0, 3])."""
    shifts = jnp.arange(0, 8, 2, dtype=packed.dtype)[:, None]  # quarter i: bits 2i..2i+1
    quarters = (packed[..., None, :] >> shifts) & 3  # [..., 4, D/4]: a broadcast, not a concatenation
    return quarters.reshape(*packed.shape[:-1], 4 * packed.shape[-1])


def quantize(x, group: int, clip_ratio=0.0, scale_dtype=jnp.bfloat16):
    """Codes each row of x: [..., D] -> (codes [..., D/4] uint8, scale [..., D/G], zero [..., D/G]).

    clip_ratio: as in clip_rows (a float, or one per plane of axis -2).
    scale = max(mx - mn, 1e-8) / 3 and zero = -mn / scale (a float, not rounded), both stored in
    scale_dtype; codes are computed against the stored values so that dequantize is exact to them.
    """
    D = x.shape[-1]
    x = x.astype(jnp.float32)
    thr, mn, mx = _threshold_and_range(x, group, clip_ratio)
    xg = x.reshape(*x.shape[:-1], D // group, group)  # [..., D/G, G]
    if thr is not None:
        xg = jnp.clip(xg, -thr[..., None], thr[..., None])
        mn, mx = jnp.clip(mn, -thr, thr), jnp.clip(mx, -thr, thr)
    scale = (jnp.maximum(mx - mn, 1e-8) / 3).astype(scale_dtype)
    zero = (-mn / scale.astype(jnp.float32)).astype(scale_dtype)
    s, z = scale.astype(jnp.float32)[..., None], zero.astype(jnp.float32)[..., None]
    codes = jnp.clip(jnp.floor(xg / s + z + 0.5), 0, 3).reshape(x.shape)
    return pack(codes), scale, zero


def dequantize(packed, scale, zero, dtype=jnp.float32):
    """Inverse of quantize: (code - zero) * scale per group, in dtype."""
    codes = unpack(packed).astype(jnp.float32)
    D = codes.shape[-1]
    G = D // scale.shape[-1]
    cg = codes.reshape(*codes.shape[:-1], D // G, G)
    x = (cg - zero.astype(jnp.float32)[..., None]) * scale.astype(jnp.float32)[..., None]
    return x.reshape(codes.shape).astype(dtype)


def fake_quantize(x, group: int, clip_ratio: float = 0.0, scale_dtype=jnp.bfloat16):
    """dequantize(quantize(x)) in x's dtype: what attention reads for an INT2 key or value."""
    return dequantize(*quantize(x, group, clip_ratio, scale_dtype), dtype=x.dtype)
