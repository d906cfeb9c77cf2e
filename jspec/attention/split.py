"""The split path of mixed-cache attention: BF16 parts in XLA, the INT2 history in the Pallas kernel.

Same semantics as attention.attend_reference (the rule: a query at t reads key p <= t in BF16 iff
p < S or p > t - R, else the INT2 copy), computed as the kernel's softmax partials and the BF16 keys'
scores joined in one normalisation:
- Pallas, INT2: committed history [S, min(t-R+1, length)) — each query row has its own end. On
  Hopper (wgmma) the Mosaic GPU kernel (pallas/int2_mosaic.py), elsewhere the Triton one. It returns
  one (out, lse) partial per split of the history.
- XLA, BF16: sink positions p < min(S, length); ring slots holding p in [max(S, t-R+1), length);
  the chunk's own rows (causal), fake-quantised where the rule says INT2 (only in long prefills).
  The window is read as it lies in the cache and the chunk's rows apart from it (no concatenation);
  window, chunk and splits share one maximum, so there is no per-part normalisation to merge.

The kernel is a custom call that GSPMD cannot split: per_shard runs the split path under shard_map so
that each device runs it on its own (dp, tp) block of rows and KV heads (jspec.runtime.sharding places the
arrays; the Engine lowers its program under the mesh so that per_shard finds it). Where it is not
wrapped, GSPMD gathers the kernel's operands onto every device (correct results, no speed-up).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jspec.cache.kvcache import LayerKV, fake_quantize_kv
from jspec.config import DP, TP, KVConfig, default_platform
from jspec.numerics import einsum_f32
# Imported with the module, not while tracing: with the lazy import (153682c, untimed then) the warm README
# command measured 6.6-8.4 s on the H200 against 3.6-4.1 s before it (cause not established).
from jspec.kernels.common import LOG2E, int32_indexable
from jspec.kernels.hopper import attention as int2_mosaic
from jspec.kernels.int2_triton import config_for as triton_config, int2_attention
from jspec.kernels.window_merge import join_slots, supported as window_merge_supported, window_merge



def noise_shift(q, key_noise, axis: int):
    """What an INT2 key's noise adds to the log-weights of query q, to subtract from its INT2 scores: q [..., D], its
    KV head on `axis`; key_noise [Hkv] (Layer.key_noise) -> ||q||^2 sigma_h^2 / (2 D), shaped as q without D.

    A key read as k + e, e zero-mean noise of variance sigma^2 per coordinate and independent of q, scores
    s + q.e / sqrt(D): its weight exp(s) is multiplied by exp(q.e / sqrt(D)), whose mean is exp(||q||^2 sigma^2 /
    (2 D)) (a Gaussian's). Every INT2 key of the history is inflated alike, so the history takes too much of the
    softmax, the more the longer it is; subtracting the shift from its scores (its lse: one number per query row)
    takes the bias out, and leaves the BF16 keys' weights as they are."""
    shape = [1] * (q.ndim - 1)
    shape[axis] = -1
    D = q.shape[-1]
    return jnp.sum(jnp.square(q.astype(jnp.float32)), -1) * key_noise.reshape(shape).astype(jnp.float32) / (2 * D)


def attend_split(q, k, v, layer: LayerKV, length, kv: KVConfig, interpret: bool | None = None,
                 kernel: str = "auto", fused_window: bool | None = None, qkv=None, key_noise=None,
                 **kernel_options):
    """q: [B, n, Hq, D] rotated queries at positions length + 0..n-1; k, v: [B, n, Hkv, D] new rows.

    Returns [B, n, Hq, D] in q.dtype. interpret: the Pallas kernels in interpret mode (an engine's forwards pass
    not Options.gpu; None, for callers with no engine: off a GPU, config.default_platform). kernel: "mosaic",
    "triton" or "auto" (mosaic where the device has wgmma and D is 64 or 128). kernel_options: fields of the
    Triton kernel's TritonConfig (block sizes, splits).
    fused_window (Options.fused_window): the BF16 parts and the merge in kernels/window_merge.py where it takes
    the shapes (None: on GPUs; True: also in interpret mode), else in XLA. qkv: q, k and v as the one
    [B, n, Hkv, g + 2, D] array
    they are slices of (model.qkv_slots), for window_merge (None: joined here, a copy). key_noise: [Hkv]
    Layer.key_noise, the INT2 scores' bias taken out (noise_shift); None: none.
    """
    B, n, Hq, D = q.shape
    H = k.shape[2]
    g = Hq // H
    # GQA heads x query positions as M rows per KV head, row m = i * g + head-in-group: the kernel's
    # layout, which the BF16 parts share (at n = 1 both reshapes are free).
    rows = q.reshape(B, n, H, g, D).transpose(0, 2, 1, 3, 4).reshape(B, H, n * g, D)
    t = length[:, None] + jnp.arange(n)  # [B, n] query positions
    if interpret is None:
        interpret = default_platform() != "gpu"
    if fused_window is None:
        fused_window = not interpret
    fused_window = fused_window and window_merge_supported(n, g, D, layer.k.shape[2], kv.recent)
    shift = None if key_noise is None else noise_shift(rows, key_noise, axis=1)  # [B, H, M]
    with jax.named_scope("int2_history"):
        splits = _int2_part(rows, layer, length, t, kv, interpret, kernel, kernel_options, raw=fused_window)
        splits = splits if shift is None else _shifted(splits, shift)
    if fused_window:
        with jax.named_scope("window_merge"):
            stacks = layer.window_stacks  # read in place in the layer loop, where the kernel can index them whole
            win_k, win_v, index = stacks if stacks and int32_indexable(*stacks[:2]) else (layer.k, layer.v, None)
            qkv = join_slots(q, k, v) if qkv is None else qkv
            return window_merge(qkv, win_k, win_v, length, splits, index, sink=kv.sink, recent=kv.recent,
                                pinned=layer.pinned_slots, interpret=interpret)
    out_k, lse_k = splits
    with jax.named_scope("bf16_parts"):
        out = _bf16_parts_merged(rows, k, v, layer, length, t, kv, out_k, lse_k, shift)  # [B, H, n * g, D] f32
    return out.reshape(B, H, n, g, D).transpose(0, 2, 1, 3, 4).reshape(B, n, Hq, D).astype(q.dtype)


def _int2_part(rows, layer: LayerKV, length, t, kv: KVConfig, interpret, kernel, kernel_options, raw=False):
    """Kernel over the INT2 history for rows [B, H, M, D] (M = n * g query rows per KV head).

    Returns the kernel's unmerged split partials: out [B, H, splits, M, D], lse [B, H, splits, M]; with raw, the
    Mosaic kernel's as it leaves them (its merge="raw"), for window_merge."""
    B, H, M, D = rows.shape
    g = M // t.shape[1]
    hi = jnp.repeat(jnp.minimum(t - kv.recent + 1, length[:, None]), g, axis=1)  # [B, M]
    lo = jnp.full_like(hi, kv.sink)
    if kernel == "mosaic" and not int2_mosaic.available():
        raise ValueError("the mosaic INT2 kernel needs a GPU with wgmma (compute capability 9.x)")
    small = M <= int2_mosaic.MAX_ROWS  # decode and verify; a long prefill chunk goes to the Triton kernel
    auto = kernel == "auto" and not interpret and D in (64, 128) and int2_mosaic.available()
    if small and (kernel == "mosaic" or auto):
        merge = "raw" if raw else False
        return int2_mosaic.int2_attention_mosaic(rows, layer.codes, layer.qparams, lo, hi, merge=merge)
    config = triton_config(M, **kernel_options)
    return int2_attention(rows, layer.codes, layer.qparams, lo, hi, config=config, merge=False, interpret=interpret)


def _shifted(splits, shift):
    """The kernel's split partials (_int2_part's) with shift [B, H, M] (noise_shift) taken from their scores: from
    each lse, or from the Mosaic decode body's raw maxima (log2 units; its N >= M rows padded)."""
    if len(splits) == 2:
        out, lse = splits
        return out, lse - shift[:, :, None]
    raw, stats, factors = splits
    pad = stats.shape[-1] - shift.shape[-1]
    m = stats[..., 0, :] - jnp.pad(shift, ((0, 0), (0, 0), (0, pad)))[:, :, None] * LOG2E
    return raw, stats.at[..., 0, :].set(m), factors


def _bf16_parts_merged(rows, k, v, layer: LayerKV, length, t, kv: KVConfig, out_k, lse_k, shift=None):
    """The BF16 window (sink and ring slots as they lie) and the chunk's own rows, joined with the kernel's
    split partials out_k [B, H, ns, M, D], lse_k [B, H, ns, M] in one softmax: out [B, H, M, D] f32. shift
    [B, H, M]: noise_shift, taken from the chunk's rows read as INT2 (the splits' lse_k carry it already).

    Nothing is concatenated: the window and the chunk are scored apart, and every key set (window,
    chunk, each split) enters the normalisation under one shared maximum. At n = 1 that is a few small
    kernels per layer where a partial per part, a concatenation and a merge were a dozen.
    """
    B, H, M, D = rows.shape
    n = k.shape[1]
    g = M // n
    S, R = layer.pinned_slots, kv.recent
    i = np.repeat(np.arange(n), g)  # [M] query index of each row
    tm = jnp.repeat(t, g, axis=1)[:, :, None]  # [B, M, 1] query position of each row
    # Window slots: pinned slot p reads position p < length; a ring slot its position in
    # [max(S, t - R + 1), length) (every position it holds is < length).
    p_win = layer.window_positions(length)[:, None, :]  # [B, 1, S + W]
    slot = np.arange(p_win.shape[-1])
    ok_win = jnp.where(slot < S, p_win < length[:, None, None],
                       (p_win >= jnp.maximum(kv.sink, tm - R + 1)) & (p_win >= 0))  # [B, M, S + W]
    kc, vc = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, H, n, D] (free at n = 1)
    ok_new = i[:, None] >= np.arange(n)[None, :]  # [M, n] causal

    scale = D**-0.5
    small = n <= SMALL_CHUNK
    s_win = jnp.where(ok_win[:, None], _scores(rows, layer.k.astype(k.dtype), small) * scale, -jnp.inf)
    s_new = _scores(rows, kc, small)  # [B, H, M, n]
    new_int2 = None
    if n > R:  # a long chunk: its own rows older than t - R are read as INT2
        new_int2 = (i[:, None] - np.arange(n)[None, :] >= R) & (t[:, None, :] >= kv.sink)  # [B, M, n]
        kq, vq = _fake_quant(k, v, kv)
        s_new = jnp.where(new_int2[:, None], _scores(rows, kq) - (0 if shift is None else shift[..., None] / scale),
                          s_new)
    s_new = jnp.where(ok_new, s_new * scale, -jnp.inf)
    # One maximum over all parts; the chunk's own key (causal diagonal) keeps it finite.
    m = jnp.maximum(jnp.maximum(s_win.max(-1), s_new.max(-1)), lse_k.max(2))  # [B, H, M]
    p_win, p_new = jnp.exp(s_win - m[..., None]), jnp.exp(s_new - m[..., None])
    w_k = jnp.exp(lse_k - m[:, :, None])[..., None]  # [B, H, ns, M, 1]; 0 for empty splits
    num, den = _weighted_sums(w_k, out_k, axis=2)  # the splits: [B, H, M, D], [B, H, M]
    num_win, den_win = _weighted(p_win, layer.v, small)
    num, den = num + num_win, den + den_win
    if new_int2 is None:
        num_new, den_new = _weighted(p_new, vc, small)
        num, den = num + num_new, den + den_new
    else:
        num += _values(jnp.where(new_int2[:, None], 0, p_new), vc) + _values(jnp.where(new_int2[:, None], p_new, 0), vq)
        den += p_new.sum(-1)
    return num / den[..., None]


def _fake_quant(k, v, kv: KVConfig):
    """Chunk rows as commit will store them in the INT2 history: [B, H, n, D] each."""
    return fake_quantize_kv(k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), kv)


# Chunks up to this many tokens (decode, verification) take their BF16 products as broadcasts and sums
# (reductions, which XLA fuses with the masks, exponentials and sums around them), not GEMMs of a few rows.
SMALL_CHUNK = 32


def _scores(rows, keys, small: bool = False):
    # rows [B, H, M, D], keys [B, H, X, D] -> [B, H, M, X] f32
    if small:
        return (rows[:, :, :, None, :].astype(jnp.float32) * keys[:, :, None].astype(jnp.float32)).sum(-1)
    return einsum_f32("bhmd,bhxd->bhmx", rows, keys)


def _values(p, vals):
    # p [B, H, M, X] f32, vals [B, H, X, D] -> [B, H, M, D] f32. In f32: XLA:CPU has no
    # bf16 x bf16 -> f32 dot for this layout, and these BF16 parts are small (S + W + n keys).
    return jnp.einsum("bhmx,bhxd->bhmd", p, vals.astype(jnp.float32), preferred_element_type=jnp.float32)


def _weighted(p, vals, small: bool):
    """(p @ vals [B, H, M, D], p.sum(-1) [B, H, M]) for p [B, H, M, X] f32, vals [B, H, X, D]."""
    if not small:
        return _values(p, vals), p.sum(-1)
    return _weighted_sums(p[..., None], vals[:, :, None].astype(jnp.float32), axis=3)


def _weighted_sums(w, x, axis: int):
    """(sum of w * x, sum of w) over axis, w broadcast against x: one variadic reduction. XLA:GPU writes w * x
    to memory before reducing it (5.2 MB per layer for the window at B 1 / 128K), yet two plain reductions
    measured no faster (8B, H200: 6.88 vs 6.84 ms at B 1 / 128K, 8.38 vs 8.10 ms at B 8 / 32K)."""
    wx = w * x
    add = lambda a, b: (a[0] + b[0], a[1] + b[1])
    num, den = jax.lax.reduce((wx, jnp.broadcast_to(w, wx.shape)), (0.0, 0.0), add, (axis,))
    return num, den[..., 0]


def per_shard(fn, mesh=None):
    """fn(q, k, v, layer, length, kv[, qkv, key_noise]) -> [B, n, Hq, D] (attend_split) run per device on its rows
    and KV heads under shard_map; fn itself when there is no ("dp", "tp") mesh (argument or jax.set_mesh)."""
    mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or set(mesh.axis_names) != {DP, TP}:
        return fn
    heads = P(DP, None, TP, None)  # [B, n, H, D]

    def run(q, k, v, layer, length, kv, qkv=None, key_noise=None):
        # the optional operands that are given: qkv [B, n, Hkv, g + 2, D] (when the caller has it), key_noise [Hkv]
        extra = {name: x for name, x in (("qkv", qkv), ("key_noise", key_noise)) if x is not None}
        extra_specs = {"qkv": P(DP, None, TP, None, None), "key_noise": P(TP)}
        body = lambda q, k, v, layer, length, extra: fn(q, k, v, layer, length, kv, **extra)
        # every buffer [B, H, ...] over (dp, tp); window stacks [L, B, H, ...] the same with L whole, their index bare
        stacks = None if layer.window_stacks is None else (P(None, DP, TP), P(None, DP, TP), P())
        layer_spec = jax.tree.map(lambda _: P(DP, TP), layer.replace(window_stacks=None)).replace(window_stacks=stacks)
        specs = (heads, heads, heads, layer_spec, P(DP), {name: extra_specs[name] for name in extra})
        # check_vma off: a pallas_call carries no varying-axes annotations for shard_map to check
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=heads, check_vma=False)(
            q, k, v, layer, length, extra)

    return run
