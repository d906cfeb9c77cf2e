"""The KV cache pytree: BF16 sink + BF16 recent ring + INT2 history, and the masked commit.

Everything is stored in the rotated basis (keys after RoPE and R_K, values after R_V). In "bf16" mode
the sink simply spans the whole capacity, the ring and history are empty, and the attention rule
reads every key in BF16: one structure, one code path.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jspec import quant
from jspec.config import ConfigError, KVConfig, ModelConfig


@struct.dataclass
class QRows:
    """INT2-coded rows: D values -> D/4 bytes plus a (scale, zero) per group of G values."""

    codes: jax.Array  # [B, Hkv, T, D/4] uint8, planar packing (see quant.py)
    scale: jax.Array  # [B, Hkv, T, D/G] bf16 or f32
    zero: jax.Array  # [B, Hkv, T, D/G]


@struct.dataclass
class LayerKV:
    sink_k: jax.Array  # [B, Hkv, S, D]; positions 0..S-1 (S = capacity in bf16 mode)
    sink_v: jax.Array  # [B, Hkv, S, D]
    ring_k: jax.Array  # [B, Hkv, W, D]; position p lives in slot p mod W (W = 0 in bf16 mode)
    ring_v: jax.Array  # [B, Hkv, W, D]
    hist_k: QRows  # every committed position, INT2 (T = 0 in bf16 mode)
    hist_v: QRows


@struct.dataclass
class KVCache:
    layers: tuple[LayerKV, ...]  # one per layer: no slicing of a stacked array on the hot path
    length: jax.Array  # [B] int32, committed tokens per row; slots past it are dead
    kv: KVConfig = struct.field(pytree_node=False)
    capacity: int = struct.field(pytree_node=False)

    @property
    def ring_size(self) -> int:
        return self.layers[0].ring_k.shape[2]

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
        S, W, T = capacity, 0, 0
    G = kv.group(D)
    sdt = jnp.dtype(kv.scale_dtype)
    # jnp.zeros, not jnp.empty: since jax 0.11 empty is uninitialized memory on GPU.
    rows = lambda n, d, dt=dtype: jnp.zeros((B, H, n, d), dt)
    qrows = lambda: QRows(rows(T, D // 4, jnp.uint8), rows(T, D // G, sdt), rows(T, D // G, sdt))
    layer = lambda: LayerKV(rows(S, D), rows(S, D), rows(W, D), rows(W, D), qrows(), qrows())
    layers = tuple(layer() for _ in range(cfg.num_layers))
    return KVCache(layers, jnp.zeros((B,), jnp.int32), kv, capacity)


def _scatter(buf, idx, rows):
    """buf [B, H, X, ...] <- rows [B, n, H, ...] at per-row slots idx [B, n]; idx >= X is dropped.

    vmapped over rows: a batched scatter keeps a data-parallel batch local to its device (an indexed
    scatter over all rows made GSPMD gather the new rows from every device).
    """
    put = lambda b, i, r: b.at[:, i].set(jnp.swapaxes(r, 0, 1).astype(b.dtype), mode="drop")
    return jax.vmap(put)(buf, idx, rows)


def commit(cache: KVCache, new_k, new_v, n_commit) -> KVCache:
    """Writes the first n_commit[b] of the new rows of each row b and advances the lengths.

    new_k, new_v: per layer [B, n, Hkv, D], the rows a forward computed at positions length + 0..n-1.
    Rows past n_commit (rejected speculative candidates, prompt padding) never touch the cache: their
    scatter index points out of bounds and mode="drop" discards them.
    """
    kv, T = cache.kv, cache.capacity
    B, n = new_k[0].shape[:2]
    pos = cache.length[:, None] + jnp.arange(n)  # [B, n]
    end = cache.length + n_commit
    valid = pos < end[:, None]
    S = cache.layers[0].sink_k.shape[2]
    sink_idx = jnp.where(valid & (pos < S), pos, S)
    layers = []
    for layer, k, v in zip(cache.layers, new_k, new_v):
        upd = dict(sink_k=_scatter(layer.sink_k, sink_idx, k), sink_v=_scatter(layer.sink_v, sink_idx, v))
        if kv.int2:
            W = cache.ring_size
            # Only the last W committed positions go to the ring: no two writes share a slot.
            ring_idx = jnp.where(valid & (pos >= end[:, None] - W), pos % W, W)
            hist_idx = jnp.where(valid, pos, T)
            upd.update(
                ring_k=_scatter(layer.ring_k, ring_idx, k),
                ring_v=_scatter(layer.ring_v, ring_idx, v),
                hist_k=_commit_q(layer.hist_k, hist_idx, k, kv, kv.clip_k),
                hist_v=_commit_q(layer.hist_v, hist_idx, v, kv, kv.clip_v),
            )
        layers.append(dataclasses.replace(layer, **upd))
    return cache.replace(layers=tuple(layers), length=end.astype(jnp.int32))


def _commit_q(h: QRows, idx, x, kv: KVConfig, clip: float) -> QRows:
    codes, scale, zero = quant.quantize(x, kv.group(x.shape[-1]), clip, h.scale.dtype)
    return QRows(_scatter(h.codes, idx, codes), _scatter(h.scale, idx, scale), _scatter(h.zero, idx, zero))


def bf16_keys(layer: LayerKV, T: int):
    """The BF16 copy of keys/values at positions 0..T-1 where one exists ([B, H, T, D] each).

    Position p < S comes from the sink, otherwise from ring slot p mod W; whether that slot still holds
    p is the caller's business (the attention rule only asks for p < S or p > t - R, both covered).
    """
    S, W = layer.sink_k.shape[2], layer.ring_k.shape[2]
    if W == 0:
        return layer.sink_k[:, :, :T], layer.sink_v[:, :, :T]
    p = jnp.arange(T)
    ring = jnp.where(p < S, 0, p % W)
    from_sink = (p < S)[:, None]
    sink_at = jnp.minimum(p, S - 1) if S else jnp.zeros_like(p)
    pick = lambda s, r: jnp.where(from_sink, s[:, :, sink_at] if S else 0, r[:, :, ring]).astype(r.dtype)
    return pick(layer.sink_k, layer.ring_k), pick(layer.sink_v, layer.ring_v)
