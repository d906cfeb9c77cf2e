"""The KV cache pytree: BF16 sink + BF16 recent ring + INT2 history, and the masked commit.

Everything is stored in the rotated basis (keys after RoPE and R_K, values after R_V). Per layer the
BF16 rows live in one window buffer for keys and one for values (the S sink slots, then the W ring
slots), and the INT2 history in two buffers shared by keys and values (codes and quantisation
parameters, keys and values as planes). So a commit is four scatters per layer, and attention reads the
BF16 window as it lies. In "bf16" mode the sink simply spans the whole capacity, the ring and history
are empty, and the attention rule reads every key in BF16: one structure, one code path.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jspec import quant
from jspec.config import ConfigError, KVConfig, ModelConfig

# BF16-mode windows are rounded up to a multiple of this: XLA pads the attention matmul's contracting
# dimension to its tile, and a padded operand is a copy of the whole cache every layer of every step.
ALIGN = 256


@struct.dataclass
class LayerKV:
    k: jax.Array  # [B, Hkv, S + W, D] BF16 keys: slot p < S holds position p, slot S + p mod W position p >= S
    v: jax.Array  # [B, Hkv, S + W, D] BF16 values, same slots
    codes: jax.Array  # [B, Hkv, 2, T, D/4] uint8 INT2 keys (plane 0) and values (plane 1), planar packing
    qparams: jax.Array  # [B, Hkv, 4, T, D/G]: key scale, key zero, value scale, value zero
    sink: int = struct.field(pytree_node=False)  # S (the capacity, rounded up, in bf16 mode)

    @property
    def ring(self) -> int:
        return self.k.shape[2] - self.sink

    @property
    def history(self) -> int:
        return self.codes.shape[3]

    def parts(self) -> dict:
        """Named views for inspection: sink_k/v [B, H, S, D], ring_k/v [B, H, W, D] (position p >= S in
        slot p mod W) and codes_k/v, scale_k/v, zero_k/v [B, H, T, ...] of the INT2 history."""
        S = self.sink
        views = dict(sink_k=self.k[:, :, :S], sink_v=self.v[:, :, :S], ring_k=self.k[:, :, S:], ring_v=self.v[:, :, S:])
        for i, kind in enumerate("kv"):
            views.update({f"codes_{kind}": self.codes[:, :, i], f"scale_{kind}": self.qparams[:, :, 2 * i],
                          f"zero_{kind}": self.qparams[:, :, 2 * i + 1]})
        return views


@struct.dataclass
class KVCache:
    layers: tuple[LayerKV, ...]  # one per layer: no slicing of a stacked array on the hot path
    length: jax.Array  # [B] int32, committed tokens per row; slots past it are dead
    kv: KVConfig = struct.field(pytree_node=False)
    capacity: int = struct.field(pytree_node=False)

    @property
    def ring_size(self) -> int:
        return self.layers[0].ring

    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.layers))


def init_cache(cfg: ModelConfig, kv: KVConfig, batch: int, capacity: int, dtype=jnp.bfloat16,
               lookahead: int = 0) -> KVCache:
    """An empty cache for `batch` rows of at most `capacity` tokens (prompt + new + lookahead + 1)."""
    kv.validate(cfg.head_dim, lookahead)
    if capacity > cfg.max_position:
        raise ConfigError(
            f"capacity {capacity} (prompt + new tokens + lookahead) exceeds the model's "
            f"max_position_embeddings {cfg.max_position}"
        )
    if cfg.sliding_window is not None and capacity > cfg.sliding_window:
        raise ConfigError(
            f"capacity {capacity} exceeds the model's sliding window of {cfg.sliding_window} tokens: jspec has "
            "no sliding-window attention, so longer runs would silently differ from the model"
        )
    B, H, D = batch, cfg.num_kv_heads, cfg.head_dim
    if kv.int2:
        S, W, T = min(kv.sink, capacity), kv.ring(), capacity
    else:
        S, W, T = -(-capacity // ALIGN) * ALIGN, 0, 0
    G = kv.group(D)
    # jnp.zeros, not jnp.empty: since jax 0.11 empty is uninitialized memory on GPU.
    zeros = lambda *shape, dt=dtype: jnp.zeros((B, H, *shape), dt)
    layer = lambda: LayerKV(zeros(S + W, D), zeros(S + W, D), zeros(2, T, D // 4, dt=jnp.uint8),
                            zeros(4, T, D // G, dt=jnp.dtype(kv.scale_dtype)), S)
    layers = tuple(layer() for _ in range(cfg.num_layers))
    return KVCache(layers, jnp.zeros((B,), jnp.int32), kv, capacity)


def _scatter(buf, idx, rows):
    """buf [B, H, ..., X, F] <- rows [B, n, H, ..., F] at per-row slots idx [B, n] of axis -2; idx >= X
    is dropped.

    vmapped over rows: a batched scatter keeps a data-parallel batch local to its device (an indexed
    scatter over all rows made GSPMD gather the new rows from every device).
    """
    def put(b, i, r):  # b [H, ..., X, F], r [n, H, ..., F]
        return b.at[..., i, :].set(jnp.moveaxis(r, 0, -2).astype(b.dtype), mode="drop")

    return jax.vmap(put)(buf, idx, rows)


def commit(cache: KVCache, new_k, new_v, n_commit) -> KVCache:
    """Writes the first n_commit[b] of the new rows of each row b and advances the lengths.

    new_k, new_v: per layer [B, n, Hkv, D], the rows a forward computed at positions length + 0..n-1.
    Rows past n_commit (rejected speculative candidates, prompt padding) never touch the cache: their
    scatter index points out of bounds and mode="drop" discards them.
    """
    kv, first = cache.kv, cache.layers[0]
    S, W, T = first.sink, first.ring, first.history
    n = new_k[0].shape[1]
    pos = cache.length[:, None] + jnp.arange(n)  # [B, n]
    end = cache.length + n_commit
    valid = pos < end[:, None]
    if W:  # only the last W committed positions go to the ring: no two writes share a slot
        slot = jnp.where(valid & ((pos < S) | (pos >= end[:, None] - W)), jnp.where(pos < S, pos, S + pos % W), S + W)
    else:
        slot = jnp.where(valid & (pos < S), pos, S)
    hist = jnp.where(valid, pos, T)
    layers = []
    for layer, k, v in zip(cache.layers, new_k, new_v):
        upd = dict(k=_scatter(layer.k, slot, k), v=_scatter(layer.v, slot, v))
        if kv.int2:
            codes, qparams = quantize_kv(k, v, kv, layer.qparams.dtype)
            upd.update(codes=_scatter(layer.codes, hist, codes), qparams=_scatter(layer.qparams, hist, qparams))
        layers.append(dataclasses.replace(layer, **upd))
    return cache.replace(layers=tuple(layers), length=end.astype(jnp.int32))


def quantize_kv(k, v, kv: KVConfig, scale_dtype):
    """Keys and values [.., H, D] coded together: codes [.., H, 2, D/4] and qparams [.., H, 4, D/G]."""
    x = jnp.stack([k, v], axis=-2)  # [.., H, 2, D]
    codes, scale, zero = quant.quantize(x, kv.group(x.shape[-1]), (kv.clip_k, kv.clip_v), scale_dtype)
    qparams = jnp.stack([scale, zero], axis=-2)  # [.., H, 2, 2, D/G]: (k scale, k zero), (v scale, v zero)
    return codes, qparams.reshape(*qparams.shape[:-3], 4, qparams.shape[-1])


def _dequantize_kv(codes, qparams, dtype, plane_axis: int):
    """(keys, values) from codes [.., 2, .., D/4] and qparams [.., 4, .., D/G] planes along plane_axis."""
    plane = lambda x, i: jnp.take(x, i, axis=plane_axis)
    return tuple(quant.dequantize(plane(codes, i), plane(qparams, 2 * i), plane(qparams, 2 * i + 1), dtype)
                 for i in (0, 1))


def fake_quantize_kv(k, v, kv: KVConfig):
    """Keys and values [.., D] as commit stores them in the INT2 history, dequantised: what attention
    reads for an INT2 key or value."""
    return _dequantize_kv(*quantize_kv(k, v, kv, jnp.dtype(kv.scale_dtype)), k.dtype, plane_axis=-2)


def history(layer: LayerKV, dtype):
    """The dequantised INT2 history: keys and values [B, H, T, D] each."""
    return _dequantize_kv(layer.codes, layer.qparams, dtype, plane_axis=2)


def bf16_keys(layer: LayerKV, T: int):
    """The BF16 copy of keys/values at positions 0..T-1 where one exists ([B, H, T, D] each).

    Position p < S comes from the sink, otherwise from ring slot S + p mod W; whether that slot still
    holds p is the caller's business (the attention rule only asks for p < S or p > t - R, both covered).
    """
    S, W = layer.sink, layer.ring
    if W == 0:
        return layer.k[:, :, :T], layer.v[:, :, :T]
    p = jnp.arange(T)
    slot = jnp.where(p < S, p, S + p % W)
    return layer.k[:, :, slot], layer.v[:, :, slot]
