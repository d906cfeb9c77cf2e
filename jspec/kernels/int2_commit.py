"""The commit into the mixed KV cache, every layer's in one Pallas kernel (Triton backend): the BF16 window
rows, the OSCAR INT2 codes and their scale and zero, written in place.

kvcache.commit_layer does the same with jnp: the quantiser's reductions, selects and converts, then four
scatters, about ten small XLA kernels per layer and round on the GPU (docs/results.md, a
profile: 160 dynamic-update-slices, 159 selects, 356 reductions per step at batch 1 / 128K, many of them
the commit's). Here one program per (row, token, KV head, key or value) codes its row exactly as
quant.quantize does for one group per row (G = D), the rank-counted clip included, and stores it at
its slots in its layer's buffers; a slot out of range stores nothing. The cache buffers are aliased to
the outputs.

The default on a GPU outside a mesh (kvcache.FUSED_COMMIT): 0.34 ms off the 8B step at batch 1 / 128K
(H200, docs/kernels.md). On the GPU its codes may differ from the jnp commit's where a value falls within
rounding of a code boundary or a scale within one rounding of its dtype (0.4-0.5% of a float32 prefill's codes on the
H200; its GPU tests compare with a tolerance); on the CPU (interpret mode) the tests compare it
with commit_layer bit for bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jspec.int2 import quant

# Triton warps per program. Keys and values in programs of their own and one warp each: 2.5 vs 4.2 us per call
# at batch 1, 4.5 vs 7.5 at batch 8, 7.7 vs 19.1 at batch 64 (8B shape, one row per batch row; H200, kernel
# time; docs/kernels.md). Two warps were 0.2-0.3 us faster up to batch 8 and
# 3 us slower at 64.
WARPS = 1


def _code_row(x4, xf, clip_ratio: float, sdt):
    """quant.quantize of one row with one group: x4 [4, D/4] and xf [D] (the same row), f32 ->
    (packed codes [D/4] uint8, scale, zero as [1, 1] f32 holding scale_dtype values). Written out rather
    than calling quant.quantize, whose numpy clip indices a Pallas kernel would capture as constants."""
    D = xf.shape[0]
    thr = jnp.float32(jnp.inf)
    if clip_ratio > 0:  # sort(|x|)[idx], by counting ranks as quant.order_statistic does for few rows
        thr = jnp.min(quant.rank_candidates(jnp.abs(xf), min(int(clip_ratio * D), D - 1)))
    mn = jnp.clip(jnp.min(xf), -thr, thr)
    mx = jnp.clip(jnp.max(xf), -thr, thr)
    scale = (jnp.maximum(mx - mn, 1e-8) / 3).astype(sdt).astype(jnp.float32)
    zero = (-mn / scale).astype(sdt).astype(jnp.float32)
    codes = jnp.clip(jnp.floor(jnp.clip(x4, -thr, thr) / scale + zero + 0.5), 0, 3).astype(jnp.int32)  # [4, D/4]
    shifts = 2 * jax.lax.broadcasted_iota(jnp.int32, codes.shape, 0)  # quarter i in bits 2i..2i+1
    packed = jnp.sum(codes << shifts, axis=0).astype(jnp.uint8)
    return packed, jnp.full((1, 1), scale), jnp.full((1, 1), zero)


def _kernel(k4_ref, kf_ref, v4_ref, vf_ref, slot_ref, hist_ref, *refs, clip_k: float, clip_v: float, planes,
            rows: int):
    # k4/v4 [4, D/4] and kf/vf [D]: this program's key or value row (the same values, two views); slot_ref,
    # hist_ref [B, n] int32; refs: the stacked buffers wk/wv [L, B, H, S + W, D], c [L, B, H, 2, T, D/4] uint8,
    # q [L, B, H, 4, T, 1], first as inputs (aliased, unread), then as outputs. Grid (2 L, B n, H), three axes as
    # Triton's own (none collapsed): axis 0 is layer l's key (2 l) or value (2 l + 1), two programs per row
    # (half the latency of one doing both), axis 1 the batch row and token (b n + i).
    out = refs[4:]
    lk, bi, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    l, b = lk // 2, bi // rows
    slot, hist = slot_ref[b, bi % rows], hist_ref[b, bi % rows]

    def commit(x4, xf, clip, kind, cp, sp, zp):
        row = xf[...]
        packed, scale, zero = _code_row(x4[...].astype(jnp.float32), row.astype(jnp.float32), clip, out[3].dtype)
        win_ref, c_ref, q_ref = out[kind], out[2], out[3]

        @pl.when(slot < win_ref.shape[-2])
        def _():
            win_ref[l, b, h, pl.ds(slot, 1), :] = row[None].astype(win_ref.dtype)

        @pl.when(hist < c_ref.shape[-2])
        def _():
            c_ref[l, b, h, cp, pl.ds(hist, 1), :] = packed[None]
            q_ref[l, b, h, sp, pl.ds(hist, 1), :] = scale.astype(q_ref.dtype)
            q_ref[l, b, h, zp, pl.ds(hist, 1), :] = zero.astype(q_ref.dtype)

    parts = ((k4_ref, kf_ref, clip_k, 0, *planes[0]), (v4_ref, vf_ref, clip_v, 1, *planes[1]))
    for kind, part in enumerate(parts):
        pl.when(lk % 2 == kind)(functools.partial(commit, *part))


@functools.partial(jax.jit, static_argnames=("clip_k", "clip_v", "planes", "interpret", "warps"))
def commit_int2(bufs, k, v, slot, hist, *, clip_k: float, clip_v: float, planes, interpret: bool = False,
                warps: int = WARPS):
    """Every layer's commit in one kernel: k, v [L, B, n, H, D] (layer l's rows at l) to window slots slot
    [B, n] of layer l's win_k, win_v [B, H, S + W, D] and, coded, to history slots hist [B, n] of its
    codes [B, H, 2, T, D/4] and qparams [B, H, 4, T, 1]; slots out of range are dropped. bufs: the [L, ...]
    stacks (win_k, win_v, codes, qparams). planes: the (codes, scale, zero) planes of the keys, then of the
    values (the cache's layout: jspec.int2.planes.INT2_PLANES). Returns the stacks, updated in place where XLA can
    alias them. warps: Triton warps per program.

    One launch for all layers, not one per layer: at batch 1 a layer's commit is a few programs whose time is
    latency (the rank-counted clip), and 32 launches took 0.174 ms of the 8B step at batch 1 / 128K against
    0.017 ms for this one (H200, docs/kernels.md)."""
    L, B, n, H, D = k.shape
    if len(bufs) != 4 or bufs[0].ndim != 5 or bufs[0].shape[0] != L:
        raise ValueError(f"buffers of shapes {[x.shape for x in bufs]} for rows of {L} layers")
    if bufs[3].shape[-1] != 1 or bufs[2].shape[-1] != D // 4:
        raise ValueError(f"the fused commit codes one group per row: qparams {bufs[3].shape}, codes {bufs[2].shape}")
    row4 = lambda x: x.reshape(L, B * n, H, 4, D // 4)  # the same bytes: quarter i of the row is plane i's input
    spec4 = pl.BlockSpec((None, None, None, 4, D // 4), lambda lk, bi, h: (lk // 2, bi, h, 0, 0))
    spec = pl.BlockSpec((None, None, None, D), lambda lk, bi, h: (lk // 2, bi, h, 0))
    whole = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        functools.partial(_kernel, clip_k=clip_k, clip_v=clip_v, planes=planes, rows=n),
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in bufs],
        grid=(2 * L, B * n, H),
        in_specs=[spec4, spec, spec4, spec, whole, whole] + [whole] * len(bufs),
        out_specs=[whole] * len(bufs),
        input_output_aliases={6 + j: j for j in range(len(bufs))},
        interpret=interpret,
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=warps, num_stages=1),
    )(row4(k), k.reshape(L, B * n, H, D), row4(v), v.reshape(L, B * n, H, D), slot, hist, *bufs)
    return tuple(out)
