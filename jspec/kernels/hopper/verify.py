"""The verification body of the Mosaic INT2 kernel (hopper.attention picks it past DECODE_MAX_ROWS query rows per
KV head): wgmma, tokens as the M side.

Tokens are the wgmma M side (swap A and B): verification has M = 20 query rows per KV head (K = 4, GQA group 4),
while wgmma needs 64 rows on M and allows N = 8..256 on the other side. Per 64-token block of one KV head:
- scores^T [64 tokens, N] = C_K [64, D] @ Q'^T [D, N]: the unpacked key codes are the register A operand, Q'
  (queries, head dims permuted, see below) sits in shared memory as B;
- out^T [D, N] += C_V^T [D, 64] @ W [64, N], W = p * value scale (bf16, written to shared memory), C_V^T
  unpacked from the same token-major value codes with ldmatrix.trans.
Scale and zero stay out of the inner loop: q.k = s (q.c) - s z sum(q) per token, and for values
sum_t w_t (c_t - z_t) = W.C - sum_t w_t z_t (per-thread partial sums, reduced once at the end).

Unpacking without int->float conversion: a code c sitting in bits 2i..2i+1 of the low byte of a 16-bit lane,
masked and OR-ed with 0x4300 (bf16 128.0) in one lop3, reads as 128 + 4^i c exactly (i <= 2; the last pair is
shifted down first: ptx.plane). Which head dimension each register slot holds is whatever the load gives the
thread: the dot over D does not care about order, so Q' is permuted (and divided by 4^i, exact) to match, and
the value output rows are un-permuted by hopper.attention.finish. The offset 128 is removed with sum(Q') (keys)
and sum(W) (values). No change to the cache layout.

The softmax state per query row (reference max, sum, value-zero sums) is kept per thread and merged once. The
max is lazy, as in the decode body: W is made against a reference max per row shared by the 4 warps, each warp
votes (in shared memory, read after W's barrier) whether a score passed it by TAU, and only then is the block
redone with the running max (a cross-warp max and a rescale): 1.31-1.35x kernel time against a cross-warp max in
every block (H100, docs/kernels.md). Blocks inside every row's range skip the range mask (a real branch, not a
select).

Tested against the numpy model of its threads in tests/test_int2_mosaic.py, and compiled (on a Hopper GPU)
against jspec.kernels.reference.int2_attention_reference.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jspec.kernels.common import NEG, RAW_OFFSET
from jspec.kernels.hopper import ptx
from jspec.kernels.hopper.decode import TAU
from jspec.kernels.hopper.launch import launch
from jspec.kernels.hopper.prepare import ring_inputs, row_vectors, schedule, with_inside

if ptx.plgpu is not None:
    from jspec.kernels.hopper.ptx import arith, gpu, ir, llvm, mfa, mu, plgpu, vector


@dataclasses.dataclass(frozen=True)
class VerifyConfig:
    """The verification body's tunables (a static argument: part of the compile key).

    block_t: tokens per block, the wgmma M tile of the score product and K tile of the value product (64 or
    128); stages: blocks in flight per CTA (the TMA ring); num_splits: splits of the history per KV head (None:
    verify_splits)."""

    block_t: int = 64
    stages: int = 4
    num_splits: int | None = None

    def __post_init__(self):
        if self.block_t not in (64, 128):
            raise ValueError(f"block_t {self.block_t}: 64 or 128")
        if self.stages < 1 or (self.num_splits is not None and self.num_splits < 1):
            raise ValueError(f"stages {self.stages}, num_splits {self.num_splits}: at least 1 (or None)")


def verify_splits(B: int, H: int, T: int, BT: int = VerifyConfig.block_t, target: int = 528, min_blocks: int = 4,
                  round_down: bool = True) -> int:
    """Splits per KV head for about `target` CTAs, at least min_blocks blocks each (528: two waves of this body,
    whose 206 registers per thread leave 2 CTAs per SM on the H200's 132; its profile in docs/kernels.md).
    round_down: at most target CTAs where B x H allows (else at least target): at B = 8 (64 KV heads) 8 splits
    instead of 9 ran 1.31x faster, at B 4 and 16 1.15x and 1.20x (kernel times, H200: docs/kernels.md)."""
    want = max(1, target // max(1, B * H)) if round_down else max(1, -(-target // max(1, B * H)))
    return max(1, min(want, T // (min_blocks * BT)))


# ----------------------------------------------------------------------------------------------
# Which head dimension each register slot holds (static, numpy), and the host-side inputs
# ----------------------------------------------------------------------------------------------


def key_slots(D: int):
    """(dim, factor) per column k of the key operand C_K [64, D] (k = 8 ct + 2 c + e).

    Thread column c of a row loads bytes [c D/16, (c+1) D/16); word u, byte pair q (bytes 0/2 or
    1/3 of the word), plane i go to column tile ct = 8u + 2i + q; e picks byte 2e + q of the word."""
    dims, factor = np.zeros(D, np.int64), np.zeros(D, np.float64)
    for ct in range(D // 8):
        u, rest = divmod(ct, 8)
        i, q = divmod(rest, 2)
        for c in range(4):
            for e in range(2):
                j = c * (D // 16) + 4 * u + q + 2 * e
                dims[8 * ct + 2 * c + e] = j + (D // 4) * i
                factor[8 * ct + 2 * c + e] = ptx.PLANE_FACTORS[i]
    return dims, factor


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
            byte, plane, f = 16 * (w // 2) + 2 * g + w % 2, 2 * mt + hr, ptx.PLANE_FACTORS[2 * mt + hr]
        else:
            byte, plane, f = 2 * g + w % 2, 2 * (w // 2) + hr, 1.0
        dims[r], factor[r] = byte + (D // 4) * plane, f
    return dims, factor


def prepare_queries(q, lo, hi, T: int, splits: int, BT: int):
    """The body's inputs from the queries q [B, H, M, D] and ranges lo, hi [B, M]: Q' [B, H, N, D] bf16 (in
    key_slots order, divided by the factor: exact), colv [B, H, 4, N] f32 (RAW_OFFSET sum(Q'), sum(q), lo, hi) and
    the split schedule [B, splits, 4] with each batch row's [max lo, min hi) (no range mask inside)."""
    B, H, M, D = q.shape
    N = -(-M // 8) * 8
    f32 = jnp.float32
    kdims, kf = key_slots(D)
    qb = jnp.pad(q.astype(jnp.bfloat16), ((0, 0), (0, 0), (0, N - M), (0, 0)))  # [B, H, N, D]
    qp = (qb[..., kdims].astype(f32) / kf).astype(jnp.bfloat16)
    # sum(Q') and sum(q) in one variadic reduction: summed inside row_vectors' stack they took 9 us per call at
    # every batch (H100), a serial sum per row
    both = lambda a, b: (a[0] + b[0], a[1] + b[1])
    psum, qsum = jax.lax.reduce((qp.astype(f32), qb.astype(f32)), (0.0, 0.0), both, (3,))
    sched = with_inside(schedule(lo, hi, T, splits, BT), lo, hi)
    return qp, row_vectors(RAW_OFFSET * psum, qsum, lo, hi), sched


# ----------------------------------------------------------------------------------------------
# Inline code: the unpacking into the wgmma operands
# ----------------------------------------------------------------------------------------------


def _plane_shifted(y, i):
    """As ptx.plane, with a run-time plane index i (i32): shifted down, factor 1."""
    return ptx.and_or(arith.shrui(y, arith.shli(i, ptx.imm(1))), 0x00030003, ptx.MAGIC)


def _as_bf16x2(x):
    return mu.bitcast(x, ir.VectorType.get((2,), ir.BF16Type.get()))


def _fragment(regs):
    return mfa.FragmentedArray(_registers=regs, _layout=mfa.WGMMA_LAYOUT, _is_signed=None)


def unpack_keys(ref, BT: int, D: int):
    """Key codes smem [BT, D/4] uint8 -> C_K [BT, D] bf16 (WGMMA layout, columns as key_slots)."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                       return_type=plgpu.ShapeDtypeStruct((BT, D), jnp.bfloat16, layout=plgpu.Layout.WGMMA))
    def body(ctx, ref):
        del ctx
        w, g, c = ptx.thread()
        base = ptx.smem_addr(ref)
        nw = D // 64  # 32-bit words per thread and row
        shape = mfa.WGMMA_LAYOUT.registers_shape((BT, D))
        regs = np.empty(shape, dtype=object)
        for mt in range(BT // 64):
            for hr in range(2):
                row = arith.addi(arith.addi(ptx.imm(64 * mt + 8 * hr), arith.shli(w, ptx.imm(4))), g)
                addr = arith.addi(base, arith.addi(arith.muli(row, ptx.imm(D // 4)), arith.muli(c, ptx.imm(D // 16))))
                asm = "ld.shared.b32 $0, [$1];" if nw == 1 else "ld.shared.v2.b32 {$0, $1}, [$2];"
                for u, x in enumerate(ptx.asm_load(addr, nw, asm)):
                    for q, y in enumerate((x, arith.shrui(x, ptx.imm(8)))):
                        for i in range(4):
                            regs[mt, 8 * u + 2 * i + q, 0, 0, hr, 0, 0, 0, 0] = _as_bf16x2(ptx.plane(y, i))
        return _fragment(regs)

    return body(ref)


def unpack_values(ref, BT: int, D: int):
    """Value codes smem [BT, D/4] uint8 -> C_V^T [D, BT] bf16 (WGMMA layout, rows as value_slots)."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                       return_type=plgpu.ShapeDtypeStruct((D, BT), jnp.bfloat16, layout=plgpu.Layout.WGMMA))
    def body(ctx, ref):
        del ctx
        w, _, _ = ptx.thread()
        tid = arith.index_cast(ir.IntegerType.get_signless(32), gpu.thread_id(gpu.Dimension.x))
        lane = arith.andi(tid, ptx.imm(31))
        half = arith.shrui(w, ptx.imm(1)) if D == 128 else ptx.imm(0)
        parity = arith.andi(w, ptx.imm(1))
        base = arith.addi(ptx.smem_addr(ref), arith.shli(half, ptx.imm(4)))
        shape = mfa.WGMMA_LAYOUT.registers_shape((D, BT))
        regs = np.empty(shape, dtype=object)
        asm = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];"
        for a in range(BT // 32):
            # Lane L gives the address of token 32 a + L; matrix m holds tokens 8 (4a + m) + 0..7.
            addr = arith.addi(base, arith.muli(arith.addi(lane, ptx.imm(32 * a)), ptx.imm(D // 4)))
            for m, x in enumerate(ptx.asm_load(addr, 4, asm)):
                y = arith.shrui(x, arith.shli(parity, ptx.imm(3)))  # the warp's byte to the low byte of each half
                for mt in range(D // 64):
                    for hr in range(2):
                        if D == 128:
                            v = ptx.plane(y, 2 * mt + hr)
                        else:
                            i = arith.addi(arith.shli(arith.shrui(w, ptx.imm(1)), ptx.imm(1)), ptx.imm(hr))
                            v = _plane_shifted(y, i)
                        regs[mt, 4 * a + m, 0, 0, hr, 0, 0, 0, 0] = _as_bf16x2(v)
        return _fragment(regs)

    return body(ref)


def _weights(s, m, vs):
    """p = 2^(s - m) and W = p * value scale (bf16) of a block's [BT, N] scores (m, vs broadcast)."""
    p = jnp.exp2(s - m)
    return p, (p * vs).astype(jnp.bfloat16)


def _vote_over(flag_ref, s, limit, parity):
    """flag_ref [2, 4] int32 (shared memory) row parity, column warp <- 1 when any score of s [BT, N] this warp
    holds passes limit (both f32 WGMMA arrays; parity an i32 splat), else 0: one vote per warp, by its lane 0."""

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
        vote = ptx.warp_any(over)
        wid, g, c = ptx.thread()
        row = get(parity.registers.flat[0], 0)
        addr = arith.addi(ptx.smem_addr(ref), arith.muli(arith.addi(arith.muli(row, ptx.imm(4)), wid), ptx.imm(4)))
        first = arith.extui(i32, arith.cmpi(arith.CmpIPredicate.eq, arith.ori(g, c), ptx.imm(0)))
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [addr, vote, first],
                        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p st.shared.u32 [$0], $1; }", "r,r,r",
                        has_side_effects=True)

    body(flag_ref, s, limit, parity)


# ----------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------


def _kernel(q_gmem, colv_gmem, sched_gmem, codes_gmem, par_gmem, raw_gmem, stats_gmem,
            q_smem, colv_smem, c_smem, p_smem, w_smem, o_smem, st_smem, bars, q_bar, flag_smem, *,
            BT: int, D: int, N: int, S: int, scale2: float):
    # q_gmem [BH, N, D] bf16 (Q' : permuted, divided by the plane factor) | colv_gmem [BH, 4, N] f32:
    # 128 sum(Q'), sum(q), lo, hi per query row | sched_gmem [B, splits, 4] int32: first token, blocks, and the
    # range [max lo, min hi) that needs no mask | codes_gmem [BH, 2, T / wide, ROW_BYTES] uint8 (ring_inputs) |
    # par_gmem [BH, 4, T] key scale/zero, value scale/zero
    # raw_gmem [BH, splits, D, N] f32: out^T before offsets/normalisation (rows as value_slots)
    # stats_gmem [BH, splits, 4, N] f32: running max (log2), sum p, sum w, sum w z
    f32 = jnp.float32
    row = plgpu.Layout.WGMMA.reduce(1)  # one value per token (row of the [BT, N] tiles)
    col = plgpu.Layout.WGMMA.reduce(0)  # one value per query row
    bh, sp = lax.axis_index("bh"), lax.axis_index("split")
    H = q_gmem.shape[0] // sched_gmem.shape[0]
    b = lax.div(bh, H)
    first, n_blocks = sched_gmem[b, sp, 0], sched_gmem[b, sp, 1]
    lo_max, hi_min = sched_gmem[b, sp, 2], sched_gmem[b, sp, 3]

    fetch = ptx.start_ring(bh, first, n_blocks, q_gmem, colv_gmem, codes_gmem, par_gmem, q_smem, colv_smem, c_smem,
                           p_smem, bars, q_bar, BT=BT, S=S)
    qoff, qsum, lo, hi = [ptx.load(colv_smem.at[i], col) for i in range(4)]
    bcol = lambda x: lax.broadcast_in_dim(x, (BT, N), [1])
    brow = lambda x: lax.broadcast_in_dim(x, (BT, N), [0])
    tok0 = plgpu.broadcasted_iota(jnp.int32, (BT, N), 0, layout=plgpu.Layout.WGMMA).astype(f32)

    def body(j, carry):
        m, l_t, w_t, z_t, acc = carry
        slot = lax.rem(j, S)
        plgpu.barrier_wait(bars.at[slot])
        ck = unpack_keys(c_smem.at[slot, 0], BT, D)
        cv = unpack_values(c_smem.at[slot, 1], BT, D)
        ks = ptx.load(p_smem.at[slot, 0], row).astype(f32) * scale2
        kz, vs, vz = (ptx.load(p_smem.at[slot, i], row).astype(f32) for i in (1, 2, 3))

        def scores(acc_ref):
            plgpu.wgmma(acc_ref, ck, q_smem.T)
            return acc_ref[...]

        s_raw = pl.run_scoped(scores, plgpu.ACC((BT, N), f32))  # [BT, N]: Q' . (128 + f c)
        s = brow(ks) * (s_raw - bcol(qoff) - brow(kz) * bcol(qsum))

        def masked(s):
            tok = tok0 + (first + j * BT).astype(f32)
            return jnp.where((tok >= bcol(lo)) & (tok < bcol(hi)), s, -jnp.inf)

        start = first + j * BT  # blocks inside every row's range need no mask (a real branch, not a select)
        s = lax.cond((start >= lo_max) & (start + BT <= hi_min), lambda s: s, masked, s)
        # The lazy max: W against the reference max m; the block is redone with the running max only where a warp's
        # vote says a score passed m by TAU (so p <= 2^TAU), instead of a cross-warp max and a rescale per block.
        p, wv = _weights(s, bcol(m), brow(vs))
        par = lax.rem(j, 2)
        _vote_over(flag_smem, s, bcol(m + TAU), plgpu.layout_cast(jnp.full((64, 8), par, jnp.int32),
                                                                    plgpu.Layout.WGMMA))
        w_smem.T[...] = plgpu.layout_cast(wv, plgpu.Layout.WGMMA_TRANSPOSED)
        plgpu.commit_smem()  # W and the 4 warps' votes visible (votes alternate between two rows of flags)
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

        @pl.when(j + S < n_blocks)
        def _refill():
            fetch(j + S, slot)

        def values(acc_ref):
            plgpu.wgmma(acc_ref, cv, w_smem.T)

        acc = pl.run_state(values)(plgpu.ACC.init(acc))
        return m_new, l_t, w_t, z_t, acc

    zeros = lambda shape: plgpu.layout_cast(jnp.zeros(shape, f32), plgpu.Layout.WGMMA)
    m0 = plgpu.layout_cast(jnp.full((N,), NEG, f32), col)
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


def verify_attention(q, codes, qparams, lo, hi, *, config: VerifyConfig, scale2: float):
    """The verification body over q [B, H, M, D] (D 64 or 128), codes [B, H, 2, T, D/4] uint8, qparams
    [B, H, 4, T, 1] and per-row ranges lo, hi [B, M] (checked by the caller, hopper.attention.int2_attention_mosaic);
    scale2: the softmax scale times log2(e). Returns the splits' raw partials: raw [B, H, splits, D, N] f32 (rows
    as value_slots, plus RAW_OFFSET sum(w)) and stats [B, H, splits, 4, N] (N: M rounded up to 8)."""
    B, H, M, D = q.shape
    T = codes.shape[3]
    N = -(-M // 8) * 8
    BT, stages = config.block_t, config.stages
    ns = config.num_splits or verify_splits(B, H, T, BT)
    cod, par = ring_inputs(codes, qparams, BT)
    qp, colv, sched = prepare_queries(q, lo, hi, T, ns, BT)
    swz = lambda: (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    scratch = dict(q_smem=plgpu.SMEM((N, D), jnp.bfloat16, transforms=swz()),
                   w_smem=plgpu.SMEM((N, BT), jnp.bfloat16, transforms=swz()),
                   flag_smem=plgpu.SMEM((2, 4), jnp.int32))  # each warp's vote on the lazy max, by block parity
    kernel = functools.partial(_kernel, BT=BT, D=D, N=N, S=stages, scale2=scale2)
    raw, stats = launch(kernel, qp.reshape(B * H, *qp.shape[2:]), colv.reshape(B * H, 4, N), sched, cod, par,
                        raw_shape=(D, N), D=D, BT=BT, stages=stages, scratch=scratch, auto_barriers=True)
    return raw.reshape(B, H, ns, D, N), stats.reshape(B, H, ns, 4, N)

