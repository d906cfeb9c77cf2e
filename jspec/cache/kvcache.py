"""The KV cache pytree: BF16 sink + BF16 recent ring + INT2 history, and the masked commit.

Everything is stored in the rotated basis (keys after RoPE and R_K, values after R_V). This module owns
the layout; both attention paths and the kernel wrapper ask it rather than repeat it. Every buffer holds all
layers, [L, ...] (LayerKV's shapes below are one layer's, KVCache.layer(i)); per layer:
- the BF16 window, one buffer for keys and one for values, [B, H, S + W, D]: first the S *pinned*
  slots (slot p holds position p for good), then the W *ring* slots (position p >= S in slot
  S + p mod W, so the ring holds the latest W positions; window_positions says which). In "int2" mode the
  pinned slots are the attention sink (S = kv.sink) and W = kv.recent. In "bf16" mode every position
  is pinned (S = the capacity, rounded up to ALIGN) and there is no ring and no history: one
  structure, one code path, and the attention rule reads every key in BF16. In "window" mode (a drafter's
  flat cache) S = kv.sink, W = kv.recent + lookahead + 1 and there is no history: attention reads the
  window alone (attention.rule), so its size and cost do not grow with the context. The slack of
  lookahead + 1 ring slots is for a drafter's own provisional rows: it commits its drafts past the
  target's length, and they must not overwrite a position the window still attends after the round
  (window_view: the target's own cache seen that way, for the self-draft, which never commits).
- the INT2 history, T slots (position p in slot p; T = capacity in "int2" mode, 0 in "bf16"), two
  buffers shared by keys and values: codes [B, H, 2, T, D/4] with planes CODE_PLANES, and the
  quantisation parameters [B, H, 4, T, D/G] with planes QPARAM_PLANES.
So a commit is four scatters per layer, and attention reads the BF16 window as it lies.

Names: LayerKV.pinned_slots, ring_slots and history_slots are the counts S, W and T;
dequantize_history(layer) returns the history's arrays; layer.parts() gives named views of all of it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jspec import struct
from jspec.config import ConfigError, KVConfig, ModelConfig, Options
from jspec.int2 import quant
from jspec.int2.planes import CODE_PLANES, INT2_PLANES, QPARAM_PLANES, code_plane, qparam_plane
from jspec.kernels.common import int32_indexable
from jspec.kernels.int2_commit import commit_int2

# BF16-mode windows are rounded up to a multiple of this: XLA pads the attention matmul's contracting
# dimension to its tile, and a padded operand is a copy of the whole cache every layer of every step.
ALIGN = 256


@struct.dataclass
class LayerKV:
    k: jax.Array  # [B, Hkv, S + W, D] BF16 keys: S pinned slots (slot p: position p), then W ring slots
    v: jax.Array  # [B, Hkv, S + W, D] BF16 values, same slots
    codes: jax.Array  # [B, Hkv, 2, T, D/4] uint8 INT2 keys and values (CODE_PLANES), planar packing
    qparams: jax.Array  # [B, Hkv, 4, T, D/G] scales and zero points (QPARAM_PLANES)
    pinned_slots: int = struct.field(pytree_node=False)  # S: kv.sink in int2 mode, the capacity in bf16
    # In the forward's loop over the layers (KVCache.in_scan), (k, v, i): the [L, ...] window stacks that k and
    # v are layer i's slices of, for a kernel that reads them in place (window_merge); XLA then drops the
    # slices unread. None elsewhere.
    window_stacks: tuple | None = None

    @property
    def ring_slots(self) -> int:
        return self.k.shape[2] - self.pinned_slots  # W

    @property
    def history_slots(self) -> int:
        return self.codes.shape[3]  # T

    def slot(self, pos):
        """The window slot of position pos (any shape): p itself if pinned, else S + p mod W."""
        S, W = self.pinned_slots, self.ring_slots
        return pos if W == 0 else jnp.where(pos < S, pos, S + pos % W)

    def window_positions(self, length):
        """[B, S + W]: the position each window slot holds once length[b] tokens are committed: p for
        pinned slot p (whether p < length is the caller's business), and for ring slot S + j the latest
        p < length with p = j mod W (it may be < S or negative: then the slot holds no ring position)."""
        S, W = self.pinned_slots, self.ring_slots
        x = jnp.arange(S + W)
        if W == 0:
            return jnp.broadcast_to(x, (length.shape[0], S))
        last = length[:, None] - 1
        return jnp.where(x < S, x, last - jnp.mod(last - (x - S), W))

    def parts(self) -> dict:
        """Named views for inspection: pinned_k/v [B, H, S, D], ring_k/v [B, H, W, D] (position p >= S
        in slot p mod W) and codes_k/v, scale_k/v, zero_k/v [B, H, T, ...] of the INT2 history."""
        S = self.pinned_slots
        views = dict(pinned_k=self.k[:, :, :S], pinned_v=self.v[:, :, :S], ring_k=self.k[:, :, S:],
                     ring_v=self.v[:, :, S:])
        views.update({f"codes_{kind}": self.codes[:, :, code_plane(kind)] for kind in CODE_PLANES})
        views.update({name: self.qparams[:, :, qparam_plane(name)] for name in QPARAM_PLANES})
        return views


@struct.dataclass
class KVCache:
    layers: LayerKV  # every layer's buffers stacked, [L, ...] leaves: the forward's scan slices them
    length: jax.Array  # [B] int32, committed tokens per row; slots past it are dead
    kv: KVConfig = struct.field(pytree_node=False)
    capacity: int = struct.field(pytree_node=False)

    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.layers))

    @property
    def num_layers(self) -> int:
        return self.layers.k.shape[0]

    def layer(self, i) -> LayerKV:
        """Layer i's buffers (slices of the stacks)."""
        return jax.tree.map(lambda x: x[i], self.layers)

    def scanned(self):
        """What the forward's loop over the layers (model.forward_taps' scan) slices along its leading axis."""
        return self.layers

    def in_scan(self, layer: LayerKV, i) -> LayerKV:
        """Layer i's buffers in that loop, from the slice `layer`: they know the [L, ...] window stacks they are
        layer i's slices of (LayerKV.window_stacks), for a kernel that reads them in place."""
        return layer.replace(window_stacks=(self.layers.k, self.layers.v, i))


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
    if kv.windowed:
        S, W, T = min(kv.sink, capacity), kv.recent + lookahead + 1, 0
    elif kv.int2:
        # W = R ring slots: a query at t >= length reads from the cache in BF16 only positions in
        # (t - R, length), at most R - 1 of them, whatever the lookahead (its own chunk is attended
        # from the forward's rows).
        S, W, T = min(kv.sink, capacity), kv.recent, capacity
    else:
        S, W, T = -(-capacity // ALIGN) * ALIGN, 0, 0
    G = kv.group(D)
    dt = jnp.dtype(dtype)
    parts = (((B, H, S + W, D), dt), ((B, H, S + W, D), dt), ((B, H, 2, T, D // 4), jnp.dtype(jnp.uint8)),
             ((B, H, 4, T, D // G), jnp.dtype(kv.scale_dtype)))
    bufs = _zeros(tuple(((cfg.num_layers, *shape), dt) for shape, dt in parts) + (((B,), jnp.dtype(jnp.int32)),))
    return KVCache(LayerKV(*bufs[:4], S), bufs[-1], kv, capacity)


def window_view(cache: KVCache) -> KVCache:
    """The same buffers read as a "window" cache (only the sink and the recent window attended, in BF16): the
    self-draft's view of the target's cache. Reading only: a view is never committed to."""
    return cache.replace(kv=dataclasses.replace(cache.kv, mode="window"))


@functools.partial(jax.jit, static_argnums=0)
def _zeros(parts):
    """Zeros of every (shape, dtype) in parts, in one program: a cache costs one small compile (or load from
    the compilation cache) at start-up, not one per buffer shape. Zeros, not jnp.empty: since jax 0.11 empty
    is uninitialized memory on GPU."""
    return tuple(jnp.zeros(shape, dt) for shape, dt in parts)


def _scatter(buf, idx, rows):
    """buf [B, H, ..., X, F] <- rows [B, n, H, ..., F] at per-row slots idx [B, n] of axis -2; idx >= X
    is dropped.

    vmapped over rows: a batched scatter keeps a data-parallel batch local to its device (an indexed
    scatter over all rows made GSPMD gather the new rows from every device).
    """
    def put(b, i, r):  # b [H, ..., X, F], r [n, H, ..., F]
        return b.at[..., i, :].set(jnp.moveaxis(r, 0, -2).astype(b.dtype), mode="drop")

    return jax.vmap(put)(buf, idx, rows)


def commit(cache: KVCache, new_k, new_v, n_commit, options: Options = Options()) -> KVCache:
    """Writes the first n_commit[b] of the new rows of each row b and advances the lengths (options: the
    fused commit, Options.fused_commit).

    new_k, new_v: [L, B, n, Hkv, D], the rows a forward computed at positions length + 0..n-1.
    Rows past n_commit (rejected speculative candidates, prompt padding) never touch the cache: their
    scatter index points out of bounds and mode="drop" discards them.
    """
    kv, first = cache.kv, cache.layer(0)  # for its shapes (the slice is dead code)
    S, W, T = first.pinned_slots, first.ring_slots, first.history_slots
    n = new_k.shape[2]
    pos = cache.length[:, None] + jnp.arange(n)  # [B, n]
    end = cache.length + n_commit
    valid = pos < end[:, None]
    # Only the last W committed positions go to the ring: no two writes share a slot.
    slot = jnp.where(valid & ((pos < S) | (pos >= end[:, None] - W)), first.slot(pos), S + W)
    hist = jnp.where(valid, pos, T)
    if _fused_commit(kv, cache.layers, options):  # every layer's in one kernel
        layers = _commit_fused(cache.layers, new_k, new_v, slot, hist, kv=kv, interpret=not options.gpu)
    else:
        layers = jax.vmap(lambda x, k, v: _scatter_commit(x, k, v, slot, hist, kv=kv))(cache.layers, new_k, new_v)
    return cache.replace(layers=layers, length=end.astype(jnp.int32))


def _fused_commit(kv: KVConfig, layer: LayerKV, options: Options) -> bool:
    """Whether the INT2 commit into layer (one layer's buffers or the [L, ...] stacks) runs as
    kernels/int2_commit.py's kernel (a row is one group, every buffer int32-indexable: common.int32_indexable; a
    stack of 2^31 elements or more commits with jnp): Options.fused_commit (None: on a GPU (Options.platform)
    outside a mesh, where GSPMD would have to split the kernel)."""
    switch = options.fused_commit
    if not (kv.int2 and layer.qparams.shape[-1] == 1 and int32_indexable(*jax.tree.leaves(layer))) or switch is False:
        return False
    return switch or (options.gpu and jax.sharding.get_abstract_mesh().empty)


def commit_layer(layer: LayerKV, k, v, slot, hist, *, kv: KVConfig, options: Options = Options()) -> LayerKV:
    """One layer's writes: k, v [B, n, Hkv, D] to window slots slot [B, n] and, for int2, their codes to
    history slots hist [B, n] (out-of-range slots are dropped); options: Options.fused_commit and platform."""
    if _fused_commit(kv, layer, options):
        stacks = jax.tree.map(lambda x: x[None], layer)  # a one-layer stack
        return jax.tree.map(lambda x: x[0], _commit_fused(stacks, k[None], v[None], slot, hist, kv=kv,
                                                          interpret=not options.gpu))
    return _scatter_commit(layer, k, v, slot, hist, kv=kv)


# The jnp commit of one layer, vmapped over the stacks.
# It reads no switch: which commit runs is decided outside it, so no trace of it depends on Options.
@functools.partial(jax.jit, static_argnames=("kv",))
def _scatter_commit(layer: LayerKV, k, v, slot, hist, *, kv: KVConfig) -> LayerKV:
    upd = dict(k=_scatter(layer.k, slot, k), v=_scatter(layer.v, slot, v))
    if kv.int2:
        codes, qparams = quantize_kv(k, v, kv, layer.qparams.dtype)
        upd.update(codes=_scatter(layer.codes, hist, codes), qparams=_scatter(layer.qparams, hist, qparams))
    return dataclasses.replace(layer, **upd)


def _commit_fused(layers: LayerKV, k, v, slot, hist, *, kv: KVConfig, interpret: bool) -> LayerKV:
    """The fused commit of k, v [L, B, n, Hkv, D] into the [L, ...] stacks: one kernel (kernels/int2_commit.py;
    interpret: off a GPU)."""
    bufs = commit_int2((layers.k, layers.v, layers.codes, layers.qparams), k, v, slot, hist, clip_k=kv.clips[0],
                       clip_v=kv.clips[1], planes=INT2_PLANES, interpret=interpret)
    return dataclasses.replace(layers, **dict(zip(("k", "v", "codes", "qparams"), bufs)))


def quantize_kv(k, v, kv: KVConfig, scale_dtype):
    """Keys and values [.., H, D] coded together: codes [.., H, 2, D/4] and qparams [.., H, 4, D/G], their
    planes in the order of CODE_PLANES and QPARAM_PLANES.

    Planes are put side by side with selects, not stacks (the same values): a select is elementwise and
    fuses into the reductions and writes that read it, where XLA:GPU tends to give a concatenation a kernel
    of its own (benchmarks/results/profile_s6.json: 8 concatenate kernels per layer).
    """
    clips = dict(zip(("k", "v"), kv.clips))
    is_k = (jnp.arange(2) == 0)[:, None]  # [2, 1]: CODE_PLANES is (k, v), and QPARAM_PLANES (k, v) x (scale, zero)
    x = jnp.where(is_k, k[..., None, :], v[..., None, :])  # [.., H, 2, D]
    codes, scale, zero = quant.quantize(x, kv.group(x.shape[-1]), tuple(clips[kind] for kind in CODE_PLANES),
                                        scale_dtype)
    is_scale = jnp.asarray([True, False])[:, None]  # [2 (scale, zero), 1]
    qparams = jnp.where(is_scale, scale[..., None, :], zero[..., None, :])  # [.., H, 2 (kind), 2, D/G]
    return codes, qparams.reshape(*qparams.shape[:-3], 4, qparams.shape[-1])


def _dequantize_kv(codes, qparams, dtype, plane_axis: int):
    """(keys, values) from codes [.., 2, .., D/4] and qparams [.., 4, .., D/G] planes along plane_axis."""
    plane = lambda x, i: jnp.take(x, i, axis=plane_axis)
    return tuple(quant.dequantize(plane(codes, code_plane(kind)), plane(qparams, qparam_plane(f"scale_{kind}")),
                                  plane(qparams, qparam_plane(f"zero_{kind}")), dtype) for kind in ("k", "v"))


def fake_quantize_kv(k, v, kv: KVConfig):
    """Keys and values [.., D] as commit stores them in the INT2 history, dequantised: what attention
    reads for an INT2 key or value."""
    return _dequantize_kv(*quantize_kv(k, v, kv, jnp.dtype(kv.scale_dtype)), k.dtype, plane_axis=-2)


def dequantize_history(layer: LayerKV, dtype):
    """The INT2 history's keys and values, dequantised: [B, H, T, D] each."""
    return _dequantize_kv(layer.codes, layer.qparams, dtype, plane_axis=2)


def bf16_keys(layer: LayerKV, T: int):
    """The BF16 copy of keys/values at positions 0..T-1 where one exists ([B, H, T, D] each).

    Position p comes from its window slot (layer.slot); whether a ring slot still holds p is the
    caller's business (the attention rule only asks for p < S or p > t - R, both covered).
    """
    if layer.ring_slots == 0:
        return layer.k[:, :, :T], layer.v[:, :, :T]
    slot = layer.slot(jnp.arange(T))
    return layer.k[:, :, slot], layer.v[:, :, slot]
