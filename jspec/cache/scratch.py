"""A cache view with provisional rows: a committed cache read as its BF16 window (kvcache.window_view), plus rows
past its length that live for one round and are never committed (a self-draft round's). A forward over the view
is an ordinary cached forward: its tokens sit at the view's length (the cache's plus the rows written so far),
and attention reads the window, the written rows and the forward's own rows (attention.rule). Writing a step's
rows into the scratch (write) is the caller's, never the forward's: nothing reaches the cache, its ring or its
history.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jspec import struct
from jspec.cache.kvcache import KVCache, LayerKV, window_view


@struct.dataclass
class Scratch:
    """The provisional rows: per layer the k and v at positions cache.length + 0..K-1, the first `at` written."""

    k: jax.Array  # [L, B, K, Hkv, D] keys, in the cache's rotated basis and dtype
    v: jax.Array  # [L, B, K, Hkv, D] values
    at: jax.Array  # [] int32: rows written; the next step's token sits at position cache.length + at


def new_scratch(cache: KVCache, num_layers: int, K: int) -> Scratch:
    """An empty scratch of K rows per layer over this cache, in its dtype."""
    first = cache.layer(0)
    B, (_, H, _, D) = cache.length.shape[0], first.k.shape
    rows = lambda: jnp.zeros((num_layers, B, K, H, D), first.k.dtype)  # two buffers: both may be donated
    return Scratch(rows(), rows(), jnp.int32(0))


def write(sc: Scratch, new_k, new_v) -> Scratch:
    """sc with one step's rows (a forward's over the view: [L, B, 1, Hkv, D]) at row `at`, advanced by one."""
    put = lambda s, r: jax.lax.dynamic_update_slice_in_dim(s, r.astype(s.dtype), sc.at, axis=2)
    return Scratch(put(sc.k, new_k), put(sc.v, new_v), sc.at + 1)


@struct.dataclass
class ScratchLayer:
    """One layer of a ScratchView, as attention reads it."""

    window: LayerKV  # the cache's layer (its BF16 window slots)
    k: jax.Array  # [B, K, Hkv, D] the scratch's rows, at positions base + 0..K-1
    v: jax.Array  # [B, K, Hkv, D]
    base: jax.Array  # [B] int32: the cache's committed length
    at: jax.Array  # [] int32: rows written

    def row_positions(self):
        """(positions [B, K], written [B, K]) of the scratch rows."""
        j = jnp.arange(self.k.shape[1])
        return self.base[:, None] + j, jnp.broadcast_to(j < self.at, (self.base.shape[0], j.size))


@struct.dataclass
class ScratchView:
    """A cache (read as its window) and a scratch past its length, with KVCache's reading side: length, kv,
    layer(i), scanned() and in_scan() (what model.forward_taps asks of a cache)."""

    cache: KVCache  # a window view (kvcache.window_view)
    scratch: Scratch

    @property
    def length(self):
        return self.cache.length + self.scratch.at  # [B]: where the next token sits

    @property
    def kv(self):
        return self.cache.kv

    def layer(self, i: int) -> ScratchLayer:
        return self._layer(self.cache.layer(i), self.scratch.k[i], self.scratch.v[i])

    def scanned(self):
        return self.cache.scanned(), self.scratch.k, self.scratch.v

    def in_scan(self, layer, i) -> ScratchLayer:
        window, k, v = layer
        return self._layer(self.cache.in_scan(window, i), k, v)

    def _layer(self, window, k, v) -> ScratchLayer:
        return ScratchLayer(window, k, v, self.cache.length, self.scratch.at)


def view(cache: KVCache, sc: Scratch) -> ScratchView:
    """The target's cache as a self-draft step reads it: its window and the round's scratch."""
    return ScratchView(window_view(cache), sc)
