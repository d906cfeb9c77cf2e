"""Split-K attention over the OSCAR INT2 history on Hopper (Pallas Mosaic GPU: mma.sync and wgmma).

Same contract as int2_attention.int2_attention (rows [B, H, M, D], the cache's codes and qparams,
per-row INT2 key ranges [lo, hi)), built for the H200's tensor cores instead of Triton's small dots.
Two block bodies share the TMA ring, the unpacking and the algebra below: the per-warp bodies (decode,
up to WARP_MAX_ROWS rows; int2_mosaic_warp and int2_mosaic_lean) and the wgmma body described here
(verification). What they share is in int2_mosaic_parts; this module has the wgmma body and the entry point.

Tokens are the wgmma M side (swap A and B): decode has only M = 4-8 query rows per KV head (20 when
verifying K = 4), while wgmma needs 64 rows on M and allows N = 8..256 on the other side. Per
64-token block of one KV head:
- scores^T [64 tokens, N] = C_K [64, D] @ Q'^T [D, N]: the unpacked key codes are the register A
  operand, Q' (queries, head dims permuted, see below) sits in shared memory as B;
- out^T [D, N] += C_V^T [D, 64] @ W [64, N], W = p * value scale (bf16, written to shared memory),
  C_V^T unpacked from the same token-major value codes with ldmatrix.trans.
Scale and zero stay out of the inner loop: q.k = s (q.c) - s z sum(q) per token, and for values
sum_t w_t (c_t - z_t) = W.C - sum_t w_t z_t (per-thread partial sums, reduced once at the end).

Unpacking without int->float conversion: a code c sitting in bits 2i..2i+1 of the low byte of a
16-bit lane, masked and OR-ed with 0x4300 (bf16 128.0), reads as 128 + 4^i c exactly (i <= 2; the
last pair is shifted down first). Which head dimension each register slot holds is whatever the
load gives the thread: the dot over D does not care about order, so Q' is permuted (and divided
by 4^i, exact) to match, and the value output rows are un-permuted by the wrapper. The offset 128
is removed with sum(Q') (keys) and sum(W) (values). No change to the cache layout.

The softmax state per query row (running max, sum, value-zero sums) is kept per thread and merged
once; each block needs one cross-warp max (Mosaic's reduction) and one shared-memory round trip for W.
The wrapper returns the splits' partials (merge=False) like the Triton kernel, or merges them.
Mosaic GPU has no interpret mode: on CPU (and GPUs without wgmma) use the Triton kernel or the
reference; this module only imports and traces there.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jspec.kernels.hopper import decode as lm, cache_keys as mosaic_keys
from jspec.kernels.int2_triton import int2_attention_reference, merge_lse
from jspec.kernels.hopper.ptx import (_FACTOR, _MAGIC, _NEG, LN2, OFFSET, TAU, _andor, _asm_load, _c,
                                            _load, _plane, _smem_addr, _start_ring, _thread, _warp_any, _with_inside,
                                            plgpu, prepare, warp_value_slots)
from jspec.kernels.hopper.warp import _warp_kernel, prepare_warp

if plgpu is not None:
    from jspec.kernels.hopper.ptx import arith, gpu, ir, llvm, mfa, mu, vector

    mosaic_keys.install()  # the same kernel, the same cache key, whatever the process lowered before

BLOCK_T = 64  # tokens per block: the wgmma M tile of the score product, K tile of the value product
STAGES = 4  # blocks in flight per CTA (TMA ring)
# The per-warp bodies' defaults. 4 stages read 4-5% faster than 3 at every point measured, and 2 as fast as 4
# (H200, session 15: benchmarks/NOTES.md); likely the ring's j mod S and j / S per block, a mask and a shift
# for a power of two, not the depth.
WARP_BLOCK_T, WARP_STAGES = 128, 4
WARP_MAX_ROWS = 8  # query rows per KV head "auto" gives the per-warp body (decode; at 24 rows it spills)
ROW_BYTES = 128  # the codes' TMA box rows: 128 bytes (4 tokens at D = 128) instead of one token's 32
APPROX = False  # ex2.approx for exp2: measured no faster (benchmarks/NOTES.md), so exact by default
_LOG2E = 1.4426950408889634


# Query rows per KV head (GQA group x query positions) one call takes: they are wgmma's N, and Q', W and
# the f32 output tile grow with them in shared memory (about 0.9 KB per row: 256 rows asked 258 KB of the
# H200's 227 KB, measured). Decode and verify (K <= 16) have a few dozen; a longer prefill chunk goes to
# the Triton kernel (attention_split).
MAX_ROWS = 128

# Stages of the block body a timing run may leave out (benchmarks/kernel_diag.py; the results are wrong):
# the bit tricks of the key / value unpack, the range mask, the cross-warp max, exp2, the whole softmax,
# the score or value product (with its unpack), or everything but the TMA ring.
ABLATIONS = ("nokunpack", "novunpack", "nomask", "nomax", "noexp", "nosoft", "noscore", "novalue", "empty")


def available() -> bool:
    """Whether this jax has Mosaic GPU and the default device can run it (wgmma: compute capability 9.x)."""
    if plgpu is None or jax.default_backend() != "gpu":
        return False
    cc = getattr(jax.devices()[0], "compute_capability", "0")
    return str(cc).split(".")[0] == "9"


# ----------------------------------------------------------------------------------------------
# The wgmma body: which head dimension each value row holds, and the unpacking into its operands
# ----------------------------------------------------------------------------------------------


def value_slots(D: int):
    """(dim, factor) per row r of the value operand C_V^T [D, 64] (r = 64 mt + 16 w + 8 hr + g).

    ldmatrix.trans gives thread (w, g) the 16-bit column g of a 16-byte half of each token row;
    the warp's parity picks one byte of it. D = 128: byte 16 (w // 2) + 2 g + w % 2, plane 2 mt + hr;
    D = 64: byte 2 g + w % 2, plane 2 (w // 2) + hr (shifted down, factor 1)."""
    dims, factor = np.zeros(D, np.int64), np.zeros(D, np.float64)
    for r in range(D):
        mt, rest = divmod(r, 64)
        w, rest = divmod(rest, 16)
        hr, g = divmod(rest, 8)
        if D == 128:
            byte, plane, f = 16 * (w // 2) + 2 * g + w % 2, 2 * mt + hr, _FACTOR[2 * mt + hr]
        else:
            byte, plane, f = 2 * g + w % 2, 2 * (w // 2) + hr, 1.0
        dims[r], factor[r] = byte + (D // 4) * plane, f
    return dims, factor


def _plane_shifted(y, i, lop3: bool = False):
    """As _plane, with a run-time plane index i (i32): shifted down, factor 1."""
    return _andor(arith.shrui(y, arith.shli(i, _c(1))), 0x00030003, _MAGIC, lop3)


def _as_bf16x2(x):
    return mu.bitcast(x, ir.VectorType.get((2,), ir.BF16Type.get()))


def _fragment(regs):
    return mfa.FragmentedArray(_registers=regs, _layout=mfa.WGMMA_LAYOUT, _is_signed=None)


def unpack_keys(ref, BT: int, D: int, raw: bool = False, lop3: bool = False):
    """Key codes smem [BT, D/4] uint8 -> C_K [BT, D] bf16 (WGMMA layout, columns as key_slots).
    raw: skip the bit tricks (the loaded words as bf16 pairs; only for timing, see ABLATIONS)."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                       return_type=plgpu.ShapeDtypeStruct((BT, D), jnp.bfloat16, layout=plgpu.Layout.WGMMA))
    def body(ctx, ref):
        del ctx
        w, g, c = _thread()
        base = _smem_addr(ref)
        nw = D // 64  # 32-bit words per thread and row
        shape = mfa.WGMMA_LAYOUT.registers_shape((BT, D))
        regs = np.empty(shape, dtype=object)
        for mt in range(BT // 64):
            for hr in range(2):
                row = arith.addi(arith.addi(_c(64 * mt + 8 * hr), arith.shli(w, _c(4))), g)
                addr = arith.addi(base, arith.addi(arith.muli(row, _c(D // 4)), arith.muli(c, _c(D // 16))))
                asm = "ld.shared.b32 $0, [$1];" if nw == 1 else "ld.shared.v2.b32 {$0, $1}, [$2];"
                for u, x in enumerate(_asm_load(addr, nw, asm)):
                    for q, y in enumerate((x, arith.shrui(x, _c(8)))):
                        for i in range(4):
                            v = x if raw else _plane(y, i, lop3)
                            regs[mt, 8 * u + 2 * i + q, 0, 0, hr, 0, 0, 0, 0] = _as_bf16x2(v)
        return _fragment(regs)

    return body(ref)


def unpack_values(ref, BT: int, D: int, raw: bool = False, lop3: bool = False):
    """Value codes smem [BT, D/4] uint8 -> C_V^T [D, BT] bf16 (WGMMA layout, rows as value_slots).
    raw: skip the bit tricks (only for timing)."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                       return_type=plgpu.ShapeDtypeStruct((D, BT), jnp.bfloat16, layout=plgpu.Layout.WGMMA))
    def body(ctx, ref):
        del ctx
        w, _, _ = _thread()
        lane = arith.andi(arith.index_cast(ir.IntegerType.get_signless(32), gpu.thread_id(gpu.Dimension.x)), _c(31))
        half = arith.shrui(w, _c(1)) if D == 128 else _c(0)
        parity = arith.andi(w, _c(1))
        base = arith.addi(_smem_addr(ref), arith.shli(half, _c(4)))
        shape = mfa.WGMMA_LAYOUT.registers_shape((D, BT))
        regs = np.empty(shape, dtype=object)
        asm = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];"
        for a in range(BT // 32):
            # Lane L gives the address of token 32 a + L; matrix m holds tokens 8 (4a + m) + 0..7.
            addr = arith.addi(base, arith.muli(arith.addi(lane, _c(32 * a)), _c(D // 4)))
            for m, x in enumerate(_asm_load(addr, 4, asm)):
                y = arith.shrui(x, arith.shli(parity, _c(3)))  # the warp's byte to the low byte of each half
                for mt in range(D // 64):
                    for hr in range(2):
                        if raw:
                            v = x
                        elif D == 128:
                            v = _plane(y, 2 * mt + hr, lop3)
                        else:
                            v = _plane_shifted(y, arith.addi(arith.shli(arith.shrui(w, _c(1)), _c(1)), _c(hr)), lop3)
                        regs[mt, 4 * a + m, 0, 0, hr, 0, 0, 0, 0] = _as_bf16x2(v)
        return _fragment(regs)

    return body(ref)


# ----------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------


def _weights(s, m, vs):
    """The wgmma body's p = 2^(s - m) and W = p * value scale (bf16) of a block's [BT, N] scores (m, vs broadcast)."""
    p = jnp.exp2(s - m)
    return p, (p * vs).astype(jnp.bfloat16)


def _splat(x):
    """An i32 scalar as a (64, 8) WGMMA array (every register x): how inline_mgpu bodies take a run-time value."""
    return plgpu.layout_cast(jnp.full((64, 8), x, jnp.int32), plgpu.Layout.WGMMA)


def _vote_over(flag_ref, s, limit, parity):
    """Each warp's vote into flag_ref[parity, warp] (flag_ref [2, 4] int32 in shared memory; parity a _splat): 1 when
    any score of s [BT, N] that the warp holds passes limit (both f32 WGMMA arrays), else 0, written by lane 0."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.Layout.WGMMA, plgpu.Layout.WGMMA, plgpu.Layout.WGMMA))
    def body(ctx, ref, s, limit, parity):
        del ctx
        i32 = ir.IntegerType.get_signless(32)
        get = lambda v, i: vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([i]))
        over = None
        for sv, lv in zip(s.registers.flat, limit.registers.flat):
            for i in range(2):
                o = arith.cmpf(arith.CmpFPredicate.OGT, get(sv, i), get(lv, i))
                over = o if over is None else arith.ori(over, o)
        vote = _warp_any(over)
        wid, g, c = _thread()
        row = get(parity.registers.flat[0], 0)
        addr = arith.addi(_smem_addr(ref), arith.muli(arith.addi(arith.muli(row, _c(4)), wid), _c(4)))
        first = arith.extui(i32, arith.cmpi(arith.CmpIPredicate.eq, arith.ori(g, c), _c(0)))
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [addr, vote, first],
                        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p st.shared.u32 [$0], $1; }", "r,r,r",
                        has_side_effects=True)

    body(flag_ref, s, limit, parity)


def _kernel(q_gmem, colv_gmem, sched_gmem, codes_gmem, par_gmem, raw_gmem, stats_gmem,
            q_smem, colv_smem, c_smem, p_smem, w_smem, o_smem, st_smem, bars, q_bar, flag_smem=None, *,
            BT: int, D: int, N: int, S: int, scale2: float, ablate: tuple = (), lop3: bool = False,
            edge_mask: bool = False, lazy_max: bool = False, late_values: bool = False):
    # q_gmem [BH, N, D] bf16 (Q' : permuted, divided by the plane factor) | colv_gmem [BH, 4, N] f32:
    # 128 sum(Q'), sum(q), lo, hi per query row | sched_gmem [B, splits, 2] int32: first token, blocks
    # codes_gmem [BH, 2, T, D/4] uint8 | par_gmem [BH, 4, T] key scale/zero, value scale/zero
    # raw_gmem [BH, splits, D, N] f32: out^T before offsets/normalisation (rows as value_slots)
    # stats_gmem [BH, splits, 4, N] f32: running max (log2), sum p, sum w, sum w z
    # late_values: fewer registers live through the softmax (the values unpacked after W's barrier; the row vectors
    # read from shared memory where used, the range mask's only in edge blocks)
    f32 = jnp.float32
    row = plgpu.Layout.WGMMA.reduce(1)  # one value per token (row of the [BT, N] tiles)
    col = plgpu.Layout.WGMMA.reduce(0)  # one value per query row
    bh, sp = lax.axis_index("bh"), lax.axis_index("split")
    H = q_gmem.shape[0] // sched_gmem.shape[0]
    b = lax.div(bh, H)
    first, n_blocks = sched_gmem[b, sp, 0], sched_gmem[b, sp, 1]
    if edge_mask:  # sched_gmem [B, splits, 4]: and the range [max lo, min hi) that needs no mask
        lo_max, hi_min = sched_gmem[b, sp, 2], sched_gmem[b, sp, 3]

    fetch = _start_ring(bh, first, n_blocks, q_gmem, colv_gmem, codes_gmem, par_gmem, q_smem, colv_smem, c_smem,
                        p_smem, bars, q_bar, BT=BT, S=S)
    held = None if late_values else [_load(colv_smem.at[i], col) for i in range(4)]  # qoff, qsum, lo, hi
    vec = lambda i: _load(colv_smem.at[i], col) if held is None else held[i]
    bcol = lambda x: lax.broadcast_in_dim(x, (BT, N), [1])
    brow = lambda x: lax.broadcast_in_dim(x, (BT, N), [0])
    tok_at = lambda: plgpu.broadcasted_iota(jnp.int32, (BT, N), 0, layout=plgpu.Layout.WGMMA).astype(f32)
    tok0 = None if late_values else tok_at()

    def body(j, carry):
        m, l_t, w_t, z_t, acc = carry
        slot = lax.rem(j, S)
        plgpu.barrier_wait(bars.at[slot])
        if "empty" in ablate:  # the TMA ring alone
            plgpu.commit_smem()
            pl.when(j + S < n_blocks)(lambda: fetch(j + S, slot))
            return carry
        ck = None if "noscore" in ablate else unpack_keys(c_smem.at[slot, 0], BT, D, "nokunpack" in ablate, lop3)
        no_values = "novalue" in ablate
        unpack_v = lambda: unpack_values(c_smem.at[slot, 1], BT, D, "novunpack" in ablate, lop3)
        cv = None if no_values or late_values else unpack_v()
        ks = _load(p_smem.at[slot, 0], row).astype(f32) * scale2
        kz, vs, vz = (_load(p_smem.at[slot, i], row).astype(f32) for i in (1, 2, 3))

        def scores(acc_ref):
            plgpu.wgmma(acc_ref, ck, q_smem.T)
            return acc_ref[...]

        if ck is None:
            s_raw = plgpu.layout_cast(jnp.zeros((BT, N), f32), plgpu.Layout.WGMMA)
        else:
            s_raw = pl.run_scoped(scores, plgpu.ACC((BT, N), f32))  # [BT, N]: Q' . (128 + f c)
        if "nosoft" in ablate:
            m_new, alpha, wv = m, m, s_raw.astype(jnp.bfloat16)
        else:
            s = brow(ks) * (s_raw - bcol(vec(0)) - brow(kz) * bcol(vec(1)))
            if "nomask" not in ablate:
                def masked(s):
                    tok = (tok_at() if tok0 is None else tok0) + (first + j * BT).astype(f32)
                    return jnp.where((tok >= bcol(vec(2))) & (tok < bcol(vec(3))), s, -jnp.inf)

                if edge_mask:  # blocks inside every row's range need no mask (a real branch, not a select)
                    start = first + j * BT
                    s = lax.cond((start >= lo_max) & (start + BT <= hi_min), lambda s: s, masked, s)
                else:
                    s = masked(s)
        if lazy_max:  # W against the reference max; the block redone only where a score passed it by TAU
            p, wv = _weights(s, bcol(m), brow(vs))
            _vote_over(flag_smem, s, bcol(m + TAU), _splat(lax.rem(j, 2)))
            w_smem.T[...] = plgpu.layout_cast(wv, plgpu.Layout.WGMMA_TRANSPOSED)
            plgpu.commit_smem()  # W and the 4 warps' votes visible (votes alternate between two rows of flags)
            par = lax.rem(j, 2)
            over = (flag_smem[par, 0] | flag_smem[par, 1]) | (flag_smem[par, 2] | flag_smem[par, 3])

            def redo(state):
                m, l_t, w_t, z_t, acc, _, _ = state
                m_new = jnp.maximum(m, s.max(axis=0))
                alpha = jnp.exp2(m - m_new)
                p, wv = _weights(s, bcol(m_new), brow(vs))
                w_smem.T[...] = plgpu.layout_cast(wv, plgpu.Layout.WGMMA_TRANSPOSED)
                plgpu.commit_smem()
                a2 = bcol(alpha)
                return m_new, l_t * a2, w_t * a2, z_t * a2, acc * lax.broadcast_in_dim(alpha, (D, N), [1]), p, wv

            m_new, l_t, w_t, z_t, acc, p, wv = lax.cond(over != 0, redo, lambda state: state,
                                                        (m, l_t, w_t, z_t, acc, p, wv))
            wf = wv.astype(f32)
            l_t, w_t, z_t = l_t + p, w_t + wf, z_t + wf * brow(vz)
            alpha = None  # acc already rescaled
        else:
            if "nosoft" not in ablate:
                m_new = m if "nomax" in ablate else jnp.maximum(m, s.max(axis=0))
                alpha = jnp.exp2(m - m_new)
                p = s - bcol(m_new) if "noexp" in ablate else jnp.exp2(s - bcol(m_new))
                wv = (p * brow(vs)).astype(jnp.bfloat16)
                wf = wv.astype(f32)
                a2 = bcol(alpha)
                l_t, w_t, z_t = l_t * a2 + p, w_t * a2 + wf, z_t * a2 + wf * brow(vz)
            if not no_values:
                w_smem.T[...] = plgpu.layout_cast(wv, plgpu.Layout.WGMMA_TRANSPOSED)
            else:
                l_t = l_t + wv.astype(f32)
            plgpu.commit_smem()  # W visible to the tensor core; every thread is done reading this slot
        if late_values and not no_values:
            cv = unpack_v()  # the refill below waits for it: Pallas puts a warpgroup barrier before each TMA copy

        @pl.when(j + S < n_blocks)
        def _refill():
            fetch(j + S, slot)

        if no_values:
            return m_new, l_t, w_t, z_t, acc
        if alpha is not None:
            acc = acc * lax.broadcast_in_dim(alpha, (D, N), [1])

        def values(acc_ref):
            plgpu.wgmma(acc_ref, cv, w_smem.T)

        acc = pl.run_state(values)(plgpu.ACC.init(acc))
        return m_new, l_t, w_t, z_t, acc

    zeros = lambda shape: plgpu.layout_cast(jnp.zeros(shape, f32), plgpu.Layout.WGMMA)
    m0 = plgpu.layout_cast(jnp.full((N,), _NEG, f32), col)
    m, l_t, w_t, z_t, acc = lax.fori_loop(0, n_blocks, body, (m0, zeros((BT, N)), zeros((BT, N)), zeros((BT, N)),
                                                              zeros((D, N))))
    o_smem[...] = acc
    for i, x in enumerate((m, l_t.sum(axis=0), w_t.sum(axis=0), z_t.sum(axis=0))):
        st_smem[i] = x
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, raw_gmem.at[bh, sp])
    plgpu.copy_smem_to_gmem(st_smem, stats_gmem.at[bh, sp])
    plgpu.wait_smem_to_gmem(0)



# ----------------------------------------------------------------------------------------------
# Wrapper
# ----------------------------------------------------------------------------------------------


def default_splits(B: int, H: int, T: int, BT: int = BLOCK_T, target: int = 528, min_blocks: int = 4,
                   round_down: bool = False) -> int:
    """Splits for about `target` CTAs, at least min_blocks blocks each (528: two waves of the wgmma body, whose
    206 registers per thread leave 2 CTAs per SM on the H200's 132; session 15's profile). round_down:
    at most target CTAs where B x H allows. The wgmma body (verification) takes it: at B = 8 (64 KV heads)
    8 splits instead of 9 ran 1.31x faster, at B 4 and 16 1.15x and 1.20x (kernel times, H200:
    benchmarks/NOTES.md, session 10). The per-warp bodies (decode) take decode_splits."""
    want = max(1, target // max(1, B * H)) if round_down else max(1, -(-target // max(1, B * H)))
    return max(1, min(want, T // (min_blocks * BT)))


# Decode's grid (the per-warp bodies) in whole waves. The lean8 body takes 161 registers per thread, so
# DECODE_CTAS_PER_SM = 3 CTAs of 128 threads fit on an SM: a wave is 396 CTAs on the H200's 132 SMs (the
# profiler's kernel_details: regs 161, 54 KB of shared memory, theoretical occupancy 18.75%). A grid a few CTAs
# past a wave runs a whole extra round for them: at B 1 / 1M 50 splits per KV head (400 CTAs) read at 44.9% of
# copy against 61.9% for 49 (392), 100 at 53.8% against 62.5% for 99; at B 4 / 1M 13 splits 47.7% against
# 63.5% for 12 (kernel time, H200, benchmarks/NOTES.md session 15). So the splits fill k waves, k the fewest
# that leave at most DECODE_CTA_TOKENS tokens per CTA and fill at least 90% of the last one; no split is
# shorter than DECODE_MIN_BLOCKS blocks (at B 1 / 32K 49 splits of 5 blocks read at 34.0% of copy, 33 of 8 at
# 36.1%).
DECODE_CTAS_PER_SM, DECODE_CTA_TOKENS, DECODE_MIN_BLOCKS = 3, 16384, 8


def decode_wave() -> int:
    """CTAs of the decode kernel resident at once on the default device (an H200's 132 SMs off a GPU)."""
    sms = getattr(jax.devices()[0], "core_count", None) if jax.default_backend() == "gpu" else None
    return DECODE_CTAS_PER_SM * (sms or 132)


def decode_splits(B: int, H: int, T: int, BT: int = WARP_BLOCK_T, wave: int | None = None) -> int:
    """Splits per KV head of the per-warp bodies' grid: B x H x splits CTAs in whole waves of `wave` CTAs
    (None: decode_wave()); at least DECODE_MIN_BLOCKS blocks per split."""
    heads = max(1, B * H)
    wave = wave or decode_wave()
    most = max(1, T // (DECODE_MIN_BLOCKS * BT))
    for k in range(1, 4 * heads + 1):  # k waves; s = 1 fills the last k at the latest
        s = min(k * wave // heads, most)
        if s and (s == most or (T <= s * DECODE_CTA_TOKENS and 10 * heads * s >= 9 * k * wave)):
            return s
    return 1


def _tma_ready(x, T_axis: int, multiple: int):
    """Pads axis T_axis to a multiple (TMA needs 16-byte row strides; only odd-sized caches pay a copy)."""
    T = x.shape[T_axis]
    if T % multiple == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[T_axis] = (0, -T % multiple)
    return jnp.pad(x, pad)


@functools.partial(jax.jit, static_argnames=("sm_scale", "num_splits", "stages", "block_t", "approx", "merge",
                                             "row_bytes", "ablate", "body", "release", "lop3", "edge_mask",
                                             "late_values", "lazy_max"))
def int2_attention_mosaic(q, codes, qparams, lo, hi, *, sm_scale=None, num_splits=None, stages=None,
                          block_t=None, approx=APPROX, merge=True, row_bytes=ROW_BYTES, ablate=(), body="auto",
                          release=False, lop3=False, edge_mask=False, late_values=None, lazy_max=False):
    """int2_attention on Hopper: same arguments and results (see int2_attention.int2_attention).

    q [B, H, M, D]; codes [B, H, 2, T, D/4] uint8; qparams [B, H, 4, T, 1] (bf16 or f32); lo, hi
    [B, M] int32. Returns out [B, H, M, D] f32 and lse [B, H, M] (merge=True) or the splits'
    partials out [B, H, splits, M, D], lse [B, H, splits, M] (merge=False). merge="raw": the per-warp bodies'
    (decode's) partials as the kernel leaves them, raw [B, H, splits, N, D], stats [B, H, splits, 4, N] and
    value_factors, for window_merge to finish them itself (two XLA kernels fewer per layer); from the wgmma
    body, as merge=False. block_t: tokens per
    block (64 or 128); approx: the approximate exp2 instruction; stages: blocks in flight per CTA (both
    default per body: WARP_BLOCK_T / WARP_STAGES, else BLOCK_T / STAGES).
    row_bytes: bytes per TMA row of codes (D / 4: one token per row; 128: several).
    ablate: stages of the block body to leave out (ABLATIONS; wrong results, for timing only).
    body: "warp" (per-warp mma.sync), "lean" (the per-warp body with fewer integer instructions per code,
    int2_mosaic_lean), "lean8" (lean with an 8-bit integer score product), "wgmma", or "auto": up to
    WARP_MAX_ROWS rows (decode) lean8 with release, else (verification) wgmma with lop3 and edge_mask, the
    flags below set by it (the fastest measured on the H200, session 8: benchmarks/NOTES.md).
    release: the per-warp bodies free ring slots through mbarriers instead of a block barrier (_release).
    lop3: the warp and wgmma bodies' mask-and-magic unpack as one lop3 per register (_andor; lean always is).
    edge_mask: the wgmma body masks ranges only in blocks not inside every row's range (as the per-warp bodies).
    late_values: the lean bodies unpack a sub-block's values after its scores (None: on with "auto", for decode's
    lean8; 1.02-1.03x kernel time at all five points measured, H200 session 16, though ptxas still gives 144
    registers, not <= 128: benchmarks/NOTES.md). The wgmma body (opt-in): the values unpacked after W's barrier,
    which the compiler cannot hoist them across, and the row vectors read from shared memory where used (the range
    mask's in edge blocks only), so fewer registers stay live through the softmax (206 in session 15: 2 CTAs per
    SM; 168 or fewer would give 3).
    lazy_max: the wgmma body keeps a reference max per row, as the per-warp bodies: a block's W is made against it,
    and the block is redone with the running max only when one warp's vote says a score passed it by TAU (the
    votes ride on W's barrier), instead of a cross-warp max and a rescale in every block (H200 session 28: the max
    was 28-29% of verification's kernel time).
    """
    B, H, M, D = q.shape
    T = codes.shape[3]
    if D not in (64, 128):
        raise ValueError(f"head_dim {D}: the Mosaic kernel handles 64 and 128")
    if codes.shape != (B, H, 2, T, D // 4) or codes.dtype != jnp.uint8 or qparams.shape[:4] != (B, H, 4, T):
        raise ValueError(f"codes {codes.shape} {codes.dtype} / qparams {qparams.shape} do not match q {q.shape}")
    if lo.shape != (B, M) or hi.shape != (B, M):
        raise ValueError(f"lo/hi must be [B, M] = {(B, M)}, got {lo.shape}/{hi.shape}")
    if M > MAX_ROWS:
        raise ValueError(f"{M} query rows per KV head: wgmma's N is at most {MAX_ROWS}")
    sm_scale = D**-0.5 if sm_scale is None else sm_scale
    if qparams.shape[-1] != 1:  # G < D: per-group scales are not folded in the kernel
        out, lse = int2_attention_reference(q, codes, qparams, lo, hi, sm_scale=sm_scale)
        return (out, lse) if merge is True else (out[:, :, None], lse[:, :, None])  # "raw": as False

    N = -(-M // 8) * 8
    per_warp = ("warp", "lean", "lean8")
    if body not in ("auto", "wgmma", *per_warp) or (body in per_warp and ablate):
        raise ValueError(f"body {body!r} (ablate {ablate}): 'auto', 'wgmma', or {per_warp} without ablations")
    if body == "auto" and ablate:  # ablations are the wgmma body's
        body = "wgmma"
    elif body == "auto":  # the fastest measured (session 8, NOTES.md), flags included
        body, release, lop3, edge_mask = ("lean8", True, False, False) if N <= WARP_MAX_ROWS else \
            ("wgmma", False, True, True)
        late_values = body == "lean8" if late_values is None else late_values
    late_values = bool(late_values)
    warp = body in per_warp
    lean = body in ("lean", "lean8")
    if release and not warp:
        raise ValueError("release: only the per-warp bodies ('warp', 'lean')")
    if late_values and body == "warp":
        raise ValueError("late_values: the lean bodies ('lean', 'lean8') and the wgmma body")
    if lazy_max and (warp or ablate):
        raise ValueError("lazy_max: only the wgmma body (the per-warp bodies' max is lazy already), no ablations")
    BT = block_t or (WARP_BLOCK_T if warp else BLOCK_T)
    stages = stages or (WARP_STAGES if warp else STAGES)
    if BT not in (64, 128):
        raise ValueError(f"block_t {BT}: 64 or 128")
    ns = num_splits or (decode_splits(B, H, T, BT) if warp else default_splits(B, H, T, BT, round_down=True))
    f32 = jnp.float32
    par = _tma_ready(qparams.reshape(B * H, 4, T), 2, 16 // qparams.dtype.itemsize)
    # The codes as TMA rows of `wide` tokens (same bytes, same order; wider rows move faster).
    wide = row_bytes // (D // 4)
    cod = _tma_ready(codes.reshape(B * H, 2, T, D // 4), 2, max(BT, wide) if T < BT else wide)
    par = _tma_ready(par, 2, BT) if T < BT else par
    cod = cod.reshape(B * H, 2, cod.shape[2] // wide, row_bytes)

    scratch = dict(colv_smem=plgpu.SMEM((4, N), f32),
                   c_smem=plgpu.SMEM((stages, 2, BT // wide, row_bytes), jnp.uint8),
                   p_smem=plgpu.SMEM((stages, 4, BT), par.dtype),
                   o_smem=plgpu.SMEM((N, D) if warp else (D, N), f32),
                   st_smem=plgpu.SMEM((4, N), f32),
                   bars=plgpu.Barrier(num_arrivals=2, num_barriers=stages),  # two copies per block: codes, scales
                   q_bar=plgpu.Barrier(num_arrivals=2))  # queries, row vectors
    # release: no automatic warpgroup barriers either (Pallas puts one before every TMA copy in Lane
    # semantics); the per-warp kernel reads no region it writes but in warp_merge, behind its own bar.sync.
    params = plgpu.CompilerParams(approx_math=approx, lowering_semantics=plgpu.LoweringSemantics.Lane,
                                  unsafe_no_auto_barriers=release)
    tile = (N, D) if warp else (D, N)  # the output partials: per-warp bodies in head dimension order
    out_type = (jax.ShapeDtypeStruct((B * H, ns, *tile), f32), jax.ShapeDtypeStruct((B * H, ns, 4, N), f32))
    if warp:
        if body == "lean8":
            qp, colv, sched = lm.prepare_imma(q, lo, hi, T, ns, BT)
        else:
            qp, colv, sched = prepare_warp(q, lo, hi, T, ns, BT, lean)
        xt = (1 if par.dtype == jnp.bfloat16 else 2) if lean else 0  # the lean body's tiles of sums
        kernel = functools.partial(_warp_kernel, BT=BT, D=D, N=N, S=stages, scale2=float(sm_scale) * _LOG2E, xt=xt,
                                   keys="s8" if body == "lean8" else "f16", lop3=lop3, late_values=late_values)
        scratch.update(q_smem=plgpu.SMEM(qp.shape[2:], qp.dtype), red_smem=plgpu.SMEM((4, D * N + 4 * N), f32))
        if release:
            scratch.update(empty_smem=plgpu.SMEM((stages, 2), jnp.int32))  # one mbarrier per slot
    else:
        qp, colv, sched = prepare(q, lo, hi, T, ns, BT)
        if edge_mask:
            sched = _with_inside(sched, lo, hi)
        swz = lambda: (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
        kernel = functools.partial(_kernel, BT=BT, D=D, N=N, S=stages, scale2=float(sm_scale) * _LOG2E,
                                   ablate=tuple(ablate), lop3=lop3, edge_mask=edge_mask, lazy_max=lazy_max,
                                   late_values=late_values)
        scratch.update(q_smem=plgpu.SMEM((N, D), jnp.bfloat16, transforms=swz()),
                       w_smem=plgpu.SMEM((N, BT), jnp.bfloat16, transforms=swz()))
        if lazy_max:
            scratch.update(flag_smem=plgpu.SMEM((2, 4), jnp.int32))  # each warp's vote, by block parity
    raw, stats = plgpu.kernel(kernel, out_type=out_type, scratch_types=scratch, grid=(B * H, ns),
                              grid_names=("bh", "split"), compiler_params=params,
                              kernel_name="int2_attention_mosaic")(
        qp.reshape(B * H, *qp.shape[2:]), colv.reshape(B * H, 4, N), sched, cod, par)
    raw, stats = raw.reshape(B, H, ns, *tile), stats.reshape(B, H, ns, 4, N)
    if merge == "raw" and warp:
        return raw, stats, value_factors(D, "lean" if lean else warp)
    out, lse = finish(raw, stats, M, "lean" if lean else warp)
    return merge_lse(out, lse, axis=2) if merge is True else (out, lse)


def _value_rows(D: int, warp=False):
    """(dims, factor) of the value rows: warp False (wgmma body), True (per-warp body) or "lean"."""
    if warp == "lean":
        return lm.value_slots(D)
    return (warp_value_slots if warp else value_slots)(D)


def value_factors(D: int, warp=True) -> np.ndarray:
    """[D] f32: 1 / the plane factor of each head dimension's value row (exact: powers of two)."""
    dims, factor = _value_rows(D, warp)
    return (1.0 / factor[np.argsort(dims)]).astype(np.float32)


@functools.partial(jax.jit, static_argnames=("M", "warp"))
def finish(raw, stats, M: int, warp=False):
    """Kernel partials -> normalised out [B, H, splits, M, D] f32 and lse [B, H, splits, M] (natural log).
    warp: False (wgmma body: raw [.., D, N], rows as value_slots), True (per-warp body: raw [.., N, D], head
    dimensions in order) or "lean" (the same, its factors)."""
    m, l, sw, zw = (stats[..., i, :, None] for i in range(4))  # [B, H, ns, N, 1]
    if not warp:
        raw = jnp.swapaxes(raw[..., np.argsort(_value_rows(raw.shape[-2])[0]), :], -1, -2)  # -> [.., N, D] in order
    c = (raw - OFFSET * sw) * jnp.asarray(value_factors(raw.shape[-1], warp)) - zw
    live = l > 0
    out = jnp.where(live, c / jnp.where(live, l, 1.0), 0.0)
    lse = jnp.where(live, (m + jnp.log2(jnp.where(live, l, 1.0))) * LN2, -jnp.inf)[..., 0]
    return out[..., :M, :], lse[..., :M]
