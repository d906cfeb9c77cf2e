"""Split-K attention over the OSCAR INT2 history on Hopper (Pallas Mosaic GPU: mma.sync and wgmma).

Same contract as int2_attention.int2_attention (rows [B, H, M, D], the cache's codes and qparams,
per-row INT2 key ranges [lo, hi)), built for the H200's tensor cores instead of Triton's small dots.
Two block bodies share the TMA ring, the unpacking and the algebra below: the per-warp body (decode,
up to WARP_MAX_ROWS rows; see "Per-warp body") and the wgmma body described here (verification).

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
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jspec.pallas import mosaic_keys
from jspec.pallas.int2_attention import int2_attention_reference, merge_lse

try:  # Mosaic GPU pieces: present in jax >= 0.10 builds; import must not need a GPU
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.experimental.mosaic.gpu import fragmented_array as mfa
    from jax.experimental.mosaic.gpu import utils as mu
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu, llvm, vector
except ImportError:  # pragma: no cover
    plgpu = None

if plgpu is not None:
    mosaic_keys.install()  # the same kernel, the same cache key, whatever the process lowered before

BLOCK_T = 64  # tokens per block: the wgmma M tile of the score product, K tile of the value product
STAGES = 4  # blocks in flight per CTA (TMA ring)
# The per-warp bodies' defaults. 4 stages read 4-5% faster than 3 at every point measured, and 2 as fast as 4
# (H200, session 15: benchmarks/NOTES.md); likely the ring's j mod S and j / S per block, a mask and a shift
# for a power of two, not the depth.
WARP_BLOCK_T, WARP_STAGES = 128, 4
ROW_BYTES = 128  # the codes' TMA box rows: 128 bytes (4 tokens at D = 128) instead of one token's 32
APPROX = False  # ex2.approx for exp2: measured no faster (benchmarks/NOTES.md), so exact by default
_MAGIC = 0x43004300  # two bf16 128.0: a code in the low mantissa bits reads as 128 + code
OFFSET = 128.0  # what the magic leaves on every value code: raw partials carry 128 sum(w) (finish, window_merge)
_NEG = -1e30  # finite start for the running max: fully masked rows stay NaN-free
_LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


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
# Which head dimension each register slot holds (static, numpy)
# ----------------------------------------------------------------------------------------------

# Bit-pair i of a byte lands at value 128 + _FACTOR[i] * code (planes 0-2 masked in place, 3 shifted).
_FACTOR = (1.0, 4.0, 16.0, 1.0)


def key_slots(D: int, factors=_FACTOR):
    """(dim, factor) per column k of the key operand C_K [64, D] (k = 8 ct + 2 c + e); factors per plane.

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
                factor[8 * ct + 2 * c + e] = factors[i]
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
            byte, plane, f = 16 * (w // 2) + 2 * g + w % 2, 2 * mt + hr, _FACTOR[2 * mt + hr]
        else:
            byte, plane, f = 2 * g + w % 2, 2 * (w // 2) + hr, 1.0
        dims[r], factor[r] = byte + (D // 4) * plane, f
    return dims, factor


# ----------------------------------------------------------------------------------------------
# Unpacking (Mosaic GPU inline code: raw shared-memory loads, bit tricks, WGMMA register layout)
# ----------------------------------------------------------------------------------------------


def _c(v, ty=None):
    return mu.c(v, ty or ir.IntegerType.get_signless(32))


def _thread():
    """(warp 0..3, row group g 0..7, column c 0..3) of this thread in its warpgroup."""
    i32 = ir.IntegerType.get_signless(32)
    tid = arith.remui(arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x)), _c(128))
    lane = arith.andi(tid, _c(31))
    return arith.shrui(tid, _c(5)), arith.shrui(lane, _c(2)), arith.andi(lane, _c(3))


def _smem_addr(ref):
    return llvm.ptrtoint(ir.IntegerType.get_signless(32), mu.memref_ptr(ref))


def _asm_load(addr, n: int, asm: str):
    """n 32-bit registers from shared memory (side effects: stays after the barrier wait)."""
    i32 = ir.IntegerType.get_signless(32)
    outs = ",".join(["=r"] * n)
    if n == 1:
        return [llvm.inline_asm(i32, [addr], asm, outs + ",r", has_side_effects=True)]
    st = llvm.inline_asm(llvm.StructType.get_literal([i32] * n), [addr], asm, outs + ",r", has_side_effects=True)
    return [llvm.extractvalue(i32, st, [k]) for k in range(n)]


def _andor(y, mask: int, magic: int, lop3: bool = True):
    """(y & mask) | magic. lop3: as one explicit lop3.b32 (LUT 0xEA); ptxas (13.0) emits the and/or pair
    that LLVM writes as two LOP3s, since a LOP3 takes one immediate (measured on a PTX microkernel)."""
    if not lop3:
        return arith.ori(arith.andi(y, _c(mask)), _c(magic))
    i32 = ir.IntegerType.get_signless(32)
    return llvm.inline_asm(i32, [y], f"lop3.b32 $0, $1, {mask:#x}, {magic:#x}, 0xEA;", "=r,r")


def _plane(y, i, lop3: bool = False):
    """bf16x2 (as i32) 128 + f_i code for the bit pair i of the low byte of each 16-bit half of y."""
    if i == 3:
        y, i = arith.shrui(y, _c(6)), 0
    return _andor(y, 0x00030003 << (2 * i), _MAGIC, lop3)


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


def _load(ref, layout):
    try:
        return plgpu.load(ref, layout=layout)
    except TypeError:  # jax 0.10: the index is a required argument
        return plgpu.load(ref, (), layout=layout)


def _start_ring(bh, first, n_blocks, q_gmem, colv_gmem, codes_gmem, par_gmem, q_smem, colv_smem, c_smem, p_smem,
                bars, q_bar, *, BT: int, S: int):
    """Loads the queries and row vectors, primes the TMA ring with the first S blocks of this CTA's split and
    returns fetch(j, slot), which loads block j (codes and scales) into a slot of the ring."""

    def fetch(j, slot):
        start = first + j * BT
        rows = c_smem.shape[2]  # a block's codes per plane as TMA rows of `wide` tokens
        plgpu.copy_gmem_to_smem(codes_gmem.at[bh, :, pl.ds(start // (BT // rows), rows), :], c_smem.at[slot],
                                bars.at[slot])
        plgpu.copy_gmem_to_smem(par_gmem.at[bh, :, pl.ds(start, BT)], p_smem.at[slot], bars.at[slot])

    plgpu.copy_gmem_to_smem(q_gmem.at[bh], q_smem, q_bar)
    plgpu.copy_gmem_to_smem(colv_gmem.at[bh], colv_smem, q_bar)
    for s in range(S):
        pl.when(s < n_blocks)(functools.partial(fetch, s, s))
    plgpu.barrier_wait(q_bar)
    return fetch


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
        vote = _asm([i32], [arith.extui(i32, over)],
                    "{ .reg .pred p, q; setp.ne.u32 p, $1, 0; vote.sync.any.pred q, p, 0xffffffff; "
                    "selp.u32 $0, 1, 0, q; }", "=r,r", side_effects=True)[0]
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
# Per-warp body (mma.sync): no cross-warp synchronisation inside a block
# ----------------------------------------------------------------------------------------------
# Warp w owns tokens 16 w .. 16 w + 15 of each 64-token block and keeps its own softmax state and output.
# Scores^T [16 tokens, 8 columns] per column tile: mma.m16n8k16 over D (A: the unpacked key codes, the same
# fragments unpack_keys builds; B: Q' from shared memory, stored in fragment order by prepare_warp).
# P (as bf16 W = p * value scale) becomes the B operand of the value product by two movmatrix.trans,
# and out^T [D, 8] += C_V^T [D, 16 tokens] @ W with C_V^T from ldmatrix.trans (rows as warp_value_slots).
# The running max is lazy: a warp rescales only when a score exceeds its reference by more than TAU
# (one vote per block), so p <= 2^TAU. The 4 warps' partials are merged once, through shared memory.

TAU = 8.0  # log2 headroom of the lazy max (p <= 256: far from bf16/f32 overflow)
WARP_MAX_ROWS = 8  # query rows per KV head "auto" gives the per-warp body (decode; at 24 rows it spills)


def warp_value_slots(D: int, factor_of=lambda e, i: _FACTOR[i]):
    """(dim, factor) per row r = 16 mt + 8 hr + g of the per-warp value accumulator out^T [D, N]
    (factor_of(e, i): the factor of plane i of byte e, as the unpack leaves it).

    ldmatrix.trans gives thread (g, c) 16-bit column g + 8 h of tokens 2c, 2c + 1 (and + 8): bytes
    2 (g + 8 h) + e, e = 0/1, each with 4 planes i. D = 128: mt = 4 e + i, hr = h; D = 64: mt = i, hr = e."""
    dims, factor = np.zeros(D, np.int64), np.zeros(D, np.float64)
    for h in range(D // 64):
        for e in range(2):
            for i in range(4):
                mt, hr = (4 * e + i, h) if D == 128 else (i, e)
                for g in range(8):
                    dims[16 * mt + 8 * hr + g] = 2 * (g + 8 * h) + e + (D // 4) * i
                    factor[16 * mt + 8 * hr + g] = factor_of(e, i)
    return dims, factor


def _asm(types, args, asm, constraints, side_effects=False):
    """Inline PTX with len(types) results."""
    if len(types) == 1:
        return [llvm.inline_asm(types[0], args, asm, constraints, has_side_effects=side_effects)]
    st = llvm.inline_asm(llvm.StructType.get_literal(types), args, asm, constraints, has_side_effects=side_effects)
    return [llvm.extractvalue(t, st, [k]) for k, t in enumerate(types)]


def _range_masked(s, tok, lo, hi, ninf):
    """The per-warp bodies' scores s (rows g, g + 8 x columns 2c, 2c + 1, flat) with ninf where the row's
    token tok[row half] is outside the column's range [lo, hi)."""
    out = []
    for hr in range(2):
        for e in range(2):
            ok = arith.andi(arith.cmpf(arith.CmpFPredicate.OGE, tok[hr], lo[e]),
                            arith.cmpf(arith.CmpFPredicate.OLT, tok[hr], hi[e]))
            out.append(arith.select(ok, s[2 * hr + e], ninf))
    return out


def _lazy_max(s, tau, state):
    """The per-warp bodies' lazy maximum, one warp vote per block. state = [m0, m1, *rest]: the reference
    maxima of this thread's two columns, then values kept against them (alternating between the columns).
    When a score of s [row half][column] passes its reference by more than tau anywhere in the warp, the
    maxima move to the warp's running maxima and rest is scaled by exp2(old - new); else state is kept."""
    i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
    mref = state[:2]
    over = None
    for hr in range(2):
        for e in range(2):
            o = arith.cmpf(arith.CmpFPredicate.OGT, s[hr][e], arith.addf(mref[e], tau))
            over = o if over is None else arith.ori(over, o)
    vote = _asm([i32], [arith.extui(i32, over)],
                "{ .reg .pred p, q; setp.ne.u32 p, $1, 0; vote.sync.any.pred q, p, 0xffffffff; "
                "selp.u32 $0, 1, 0, q; }", "=r,r", side_effects=True)[0]

    def rescale():
        new_m = []
        for e in range(2):
            bm = arith.maximumf(s[0][e], s[1][e])
            for d in (4, 8, 16):
                bm = arith.maximumf(bm, mu.shfl_bfly(bm, d))
            new_m.append(arith.maximumf(mref[e], bm))
        alpha = [_asm([f32], [arith.subf(mref[e], new_m[e])], "ex2.approx.ftz.f32 $0, $1;", "=f,f")[0]
                 for e in range(2)]
        return new_m + [arith.mulf(v, alpha[k % 2]) for k, v in enumerate(state[2:])]

    return _if(arith.cmpi(arith.CmpIPredicate.ne, vote, _c(0)), rescale, state)


def _if(cond, then, vals):
    """scf.if: then() when cond (warp-uniform i1) else vals."""
    from jax._src.lib.mlir.dialects import scf

    try:
        op = scf.IfOp(cond, [v.type for v in vals], has_else=True)
    except TypeError:  # older bindings
        op = scf.IfOp(cond, [v.type for v in vals], hasElse=True)
    with ir.InsertionPoint(op.then_block):
        scf.yield_(then())
    with ir.InsertionPoint(op.else_block):
        scf.yield_(vals)
    return list(op.results)


def _pairs(arr, rows: int, N: int):
    """A (rows, N) f32 WGMMA fragment's registers as [rows / 64][N / 8][hr] -> [v0, v1] (f32 scalars)."""
    regs = arr.registers.reshape(rows // 64, N // 8, 2)
    get = lambda v, i: vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([i]))
    return [[[[get(regs[a, b, h], 0), get(regs[a, b, h], 1)] for h in range(2)] for b in range(N // 8)]
            for a in range(rows // 64)]


def _unpairs(vals, rows: int, N: int):
    f32 = ir.F32Type.get()
    regs = np.empty(mfa.WGMMA_LAYOUT.registers_shape((rows, N)), dtype=object)
    flat = regs.reshape(rows // 64, N // 8, 2)
    for a, b, h in np.ndindex(rows // 64, N // 8, 2):
        flat[a, b, h] = vector.from_elements(ir.VectorType.get((2,), f32), vals[a][b][h])
    return mfa.FragmentedArray(_registers=regs, _layout=mfa.WGMMA_LAYOUT, _is_signed=None)


def _warp_keys(base, rows, c, D: int, lop3: bool = False):
    """Key codes of this thread's token rows (g, g + 8) -> {(column tile, row half): bf16x2} (key_slots order):
    the A fragments of the score product, two column tiles per 16-dim chunk."""
    kregs = {}
    for hr in range(2):
        addr = arith.addi(base, arith.addi(arith.muli(rows[hr], _c(D // 4)), arith.muli(c, _c(D // 16))))
        nw = D // 64
        asm = "ld.shared.b32 $0, [$1];" if nw == 1 else "ld.shared.v2.b32 {$0, $1}, [$2];"
        for u, x in enumerate(_asm_load(addr, nw, asm)):
            for q, y in enumerate((x, arith.shrui(x, _c(8)))):
                for i in range(4):
                    kregs[8 * u + 2 * i + q, hr] = _plane(y, i, lop3)
    return kregs


def _warp_values(base, offset: int, wid, lane, sb: int, D: int, lop3: bool = False):
    """Value codes (at base + offset) of the warp's 16 tokens (half sb of a 128-token block) -> the value
    product's A fragments per m-tile (rows as warp_value_slots), by ldmatrix.trans over the token rows."""
    lrow = arith.addi(_c(64 * sb), arith.addi(arith.shli(wid, _c(4)), arith.addi(
        arith.andi(lane, _c(7)), arith.shli(arith.andi(arith.shrui(lane, _c(3)), _c(1)), _c(3)))))
    vaddr = arith.addi(arith.addi(base, _c(offset)), arith.muli(lrow, _c(D // 4)))
    if D == 128:
        vaddr = arith.addi(vaddr, arith.shli(arith.shrui(lane, _c(4)), _c(4)))
        mats = _asm_load(vaddr, 4, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];")
    else:
        mats = _asm_load(vaddr, 2, "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {$0, $1}, [$2];")
    vslots = {}  # (mt, hr, k-half) -> bf16x2 register
    for mi, x in enumerate(mats):
        kh, h = mi % 2, mi // 2
        for e, y in enumerate((x, arith.shrui(x, _c(8)))):
            for i in range(4):
                mt, hr = (4 * e + i, h) if D == 128 else (i, e)
                vslots[mt, hr, kh] = _plane(y, i, lop3)
    return [[vslots[mt, 0, 0], vslots[mt, 1, 0], vslots[mt, 0, 1], vslots[mt, 1, 1]] for mt in range(D // 16)]


def warp_block(c_ref, p_ref, q_ref, tok, interior, qoff, qsum, lo, hi, acc, m, l, w, z, *, BT, D, N, scale2,
               lop3=False):
    """One block of BT tokens for each warp's state: (acc [64 D/16, N], m, l, w, z [64, N]) -> new state.

    The state arrays are WGMMA-layout containers of per-thread registers: acc (mt, nt, hr) holds out^T rows
    16 mt + 8 hr + g, columns 8 nt + 2 c (+1); m holds each column's reference (both rows alike); l, w, z hold
    per-thread partial sums of p, W and W * value zero for the thread's token rows g, g + 8."""
    MT, NT = D // 16, N // 8
    spec = lambda shape: plgpu.ShapeDtypeStruct(shape, jnp.float32, layout=plgpu.Layout.WGMMA)
    small = spec((64, N))

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 3 + (plgpu.Layout.WGMMA,) * 11,
                       return_type=(spec((64 * MT, N)), small, small, small, small))
    def body(ctx, c_ref, p_ref, q_ref, tok, interior, qoff, qsum, lo, hi, acc, m, l, w, z):
        del ctx
        i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
        fc = lambda v: mu.c(float(v), f32)
        add, sub, mul = arith.addf, arith.subf, arith.mulf
        ex2 = lambda x: _asm([f32], [x], "ex2.approx.ftz.f32 $0, $1;", "=f,f")[0]
        wid, g, c = _thread()
        lane = arith.andi(arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x)), _c(31))
        acc_v = _pairs(acc, 64 * MT, N)  # [MT][NT][hr] -> [column 2c, column 2c + 1]
        m_v, l_v, w_v, z_v = (_pairs(x, 64, N)[0] for x in (m, l, w, z))  # [NT][hr][2]
        tok_v = [x[0] for x in _pairs(tok, 64, 8)[0][0]]  # rows g, g + 8 -> token index (f32)
        inner = arith.cmpf(arith.CmpFPredicate.OGT, _pairs(interior, 64, 8)[0][0][0][0], fc(0.5))
        col = {k: _pairs(x, 64, N)[0] for k, x in (("qoff", qoff), ("qsum", qsum), ("lo", lo), ("hi", hi))}
        isz = mu.bitwidth(ir.MemRefType(p_ref.type).element_type) // 8
        pbase, cbase, qbase = _smem_addr(p_ref), _smem_addr(c_ref), _smem_addr(q_ref)
        tokrow = [arith.addi(arith.shli(wid, _c(4)), arith.addi(g, _c(8 * hr))) for hr in range(2)]

        def param(i, hr):
            addr = arith.addi(pbase, arith.muli(arith.addi(tokrow[hr], _c(i * BT)), _c(isz)))
            if isz == 2:
                v = _asm_load(addr, 1, "ld.shared.u16 $0, [$1];")[0]
                return mu.bitcast(arith.shli(v, _c(16)), f32)
            return mu.bitcast(_asm_load(addr, 1, "ld.shared.b32 $0, [$1];")[0], f32)

        mma = lambda a, b, acc4: _asm([f32] * 4, [*a, *b, *acc4],
                                      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                                      "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                                      "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
        tau, ninf = fc(TAU), fc(-float("inf"))
        tok_blk, row_blk = tok_v, tokrow
        for sb in range(BT // 64):  # each warp's 16 tokens of every 64 in the block
            tok_v = [add(t, fc(64 * sb)) for t in tok_blk]
            tokrow = [arith.addi(r, _c(64 * sb)) for r in row_blk]
            ks = [mul(param(0, hr), fc(scale2)) for hr in range(2)]
            kz, vs, vz = ([param(i, hr) for hr in range(2)] for i in (1, 2, 3))

            kregs = _warp_keys(cbase, tokrow, c, D, lop3)
            va = _warp_values(cbase, BT * D // 4, wid, lane, sb, D, lop3)

            for nt in range(NT):
                # Scores^T for column tile nt: rows (g, g + 8) x columns (2c, 2c + 1).
                qaddr = arith.addi(qbase, arith.muli(arith.addi(arith.muli(arith.addi(_c(8 * nt), g), _c(4)), c),
                                                     _c(D // 2)))
                qf = []
                for k in range(D // 32):  # D / 2 bytes: this thread's B fragments for every 16-dim chunk
                    qf += _asm_load(arith.addi(qaddr, _c(16 * k)), 4, "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];")
                chains = [[fc(0.0)] * 4, [fc(0.0)] * 4]  # two accumulators: half the dependent mma chain
                for kc in range(D // 16):
                    a = [kregs[2 * kc, 0], kregs[2 * kc, 1], kregs[2 * kc + 1, 0], kregs[2 * kc + 1, 1]]
                    chains[kc % 2] = mma(a, qf[2 * kc:2 * kc + 2], chains[kc % 2])
                s4 = [add(x, y) for x, y in zip(*chains)]
                cq, cs = col["qoff"][nt][0], col["qsum"][nt][0]
                s = [[mul(ks[hr], sub(sub(s4[2 * hr + e], cq[e]), mul(kz[hr], cs[e]))) for e in range(2)]
                     for hr in range(2)]

                flat = [s[0][0], s[0][1], s[1][0], s[1][1]]
                flat = _if(inner, lambda flat=flat: flat,
                           _range_masked(flat, tok_v, col["lo"][nt][0], col["hi"][nt][0], ninf))
                s = [[flat[0], flat[1]], [flat[2], flat[3]]]
                mref = m_v[nt][0]
                state = _lazy_max(s, tau, [mref[0], mref[1], *[x for hr in range(2) for x in (
                    *l_v[nt][hr], *w_v[nt][hr], *z_v[nt][hr])], *[x for mt in range(MT) for hr in range(2)
                                                                 for x in acc_v[mt][nt][hr]]])
                mref = state[0:2]
                m_v[nt] = [mref, mref]
                k = 2
                for hr in range(2):
                    l_v[nt][hr], w_v[nt][hr], z_v[nt][hr] = state[k:k + 2], state[k + 2:k + 4], state[k + 4:k + 6]
                    k += 6
                for mt in range(MT):
                    for hr in range(2):
                        acc_v[mt][nt][hr] = state[k:k + 2]
                        k += 2
                # p, W = p * value scale (bf16), its sums, and W as the value product's B fragment.
                wb = []
                for hr in range(2):
                    p = [ex2(sub(s[hr][e], mref[e])) for e in range(2)]
                    wv = [mul(p[e], vs[hr]) for e in range(2)]
                    packed = _asm([i32], [wv[1], wv[0]], "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")[0]
                    wr = [mu.bitcast(arith.shli(packed, _c(16)), f32), mu.bitcast(arith.andi(packed, _c(-65536)), f32)]
                    l_v[nt][hr] = [add(l_v[nt][hr][e], p[e]) for e in range(2)]
                    w_v[nt][hr] = [add(w_v[nt][hr][e], wr[e]) for e in range(2)]
                    z_v[nt][hr] = [arith.addf(z_v[nt][hr][e], mul(wr[e], vz[hr])) for e in range(2)]
                    wb.append(_asm([i32], [packed], "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r",
                                   side_effects=True)[0])
                for mt in range(MT):
                    acc4 = mma(va[mt], wb, [*acc_v[mt][nt][0], *acc_v[mt][nt][1]])
                    acc_v[mt][nt] = [acc4[0:2], acc4[2:4]]
        pack_small = lambda v: _unpairs([v], 64, N)
        return (_unpairs(acc_v, 64 * MT, N), pack_small(m_v), pack_small(l_v), pack_small(w_v), pack_small(z_v))

    return body(c_ref, p_ref, q_ref, tok, interior, qoff, qsum, lo, hi, acc, m, l, w, z)


def _st(addr, v, pred=None):
    """st.shared.f32 (predicated on an i32 != 0 if pred is given)."""
    if pred is None:
        args, asm, cons = [addr, v], "st.shared.f32 [$0], $1;", "r,f"
    else:
        args, asm, cons = [addr, v, pred], "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p st.shared.f32 [$0], $1; }", "r,f,r"
    llvm.inline_asm(ir.Type.parse("!llvm.void"), args, asm, cons, has_side_effects=True)


def warp_value_slot(d, D: int):
    """The row r of warp_value_slots holding head dimension d (its inverse; d: int or numpy array).
    D = 128: d = 32 i + 16 h + 2 g + e, r = 16 (4 e + i) + 8 h + g; D = 64: d = 16 i + 2 g + e, r = 16 i + 8 e + g."""
    if D == 128:
        return 64 * (d & 1) + 16 * (d >> 5) + 8 * ((d >> 4) & 1) + ((d >> 1) & 7)
    return 16 * (d >> 4) + 8 * (d & 1) + ((d >> 1) & 7)


def _value_slot(dim, D: int):
    """warp_value_slot on an i32 value (a thread's head dimension)."""
    bits = lambda shift, mask: arith.andi(arith.shrui(dim, _c(shift)), _c(mask))
    if D == 128:
        parts = ((bits(0, 1), 64), (bits(5, 3), 16), (bits(4, 1), 8), (bits(1, 7), 1))
    else:
        parts = ((bits(4, 3), 16), (bits(0, 1), 8), (bits(1, 7), 1))
    return functools.reduce(arith.addi, [arith.muli(x, _c(f)) for x, f in parts])


def warp_merge(red_ref, o_ref, st_ref, acc, m, l, w=None, z=None, *, D, N, xt=0):
    """The 4 warps' partials -> o_ref [N, D] (head dimensions in order, each times its value plane factor) and
    st_ref [4, N] (reference max, sum p, sum W, sum W z), through red_ref [4, D N + 4 N] f32 in shared memory
    (rows as warp_value_slots) and one barrier.
    xt > 0 (the lean body): no w, z; acc's xt tiles after the D/16 output tiles hold the warp's sums
    (row g: sum W z in xt parts, row g + 8 of the first: sum W), already summed over its tokens."""
    MT, NT = D // 16, N // 8
    arrays = (acc, m, l) if xt else (acc, m, l, w, z)

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 3 + (plgpu.Layout.WGMMA,) * len(arrays))
    def body(ctx, red_ref, o_ref, st_ref, acc, m, l, w=None, z=None):
        del ctx
        i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
        ex2 = lambda x: _asm([f32], [x], "ex2.approx.ftz.f32 $0, $1;", "=f,f")[0]
        ld = lambda addr: mu.bitcast(_asm_load(addr, 1, "ld.shared.b32 $0, [$1];")[0], f32)
        wid, g, c = _thread()
        tid = arith.remui(arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x)), _c(128))
        rbase, obase, sbase = _smem_addr(red_ref), _smem_addr(o_ref), _smem_addr(st_ref)
        stride = 4 * (D * N + 4 * N)  # bytes per warp in red_ref
        wbase = arith.addi(rbase, arith.muli(wid, _c(stride)))
        acc_v = _pairs(acc, 64 * (MT + xt), N)
        m_v, l_v = (_pairs(x, 64, N)[0] for x in (m, l))
        w_v, z_v = (None, None) if xt else (_pairs(x, 64, N)[0] for x in (w, z))
        for nt in range(NT):
            for e in range(2):
                colx = arith.addi(_c(8 * nt + e), arith.shli(c, _c(1)))
                for mt in range(MT):
                    for hr in range(2):
                        r = arith.addi(_c(16 * mt + 8 * hr), g)
                        _st(arith.addi(wbase, arith.shli(arith.addi(arith.muli(r, _c(N)), colx), _c(2))),
                            acc_v[mt][nt][hr][e])
                sums = []
                for v in (l_v, w_v, z_v)[:1 if xt else 3]:  # the thread's two rows, then the warp's 8 row groups
                    x = arith.addf(v[nt][0][e], v[nt][1][e])
                    for d in (4, 8, 16):
                        x = arith.addf(x, mu.shfl_bfly(x, d))
                    sums.append(x)
                if xt:  # summed over the tokens by the tensor core
                    sums.append(acc_v[MT][nt][1][e])
                    sums.append(functools.reduce(arith.addf, [acc_v[MT + x][nt][0][e] for x in range(xt)]))
                for k, x in enumerate((m_v[nt][0][e], *sums)):  # all 8 row groups store the same value
                    _st(arith.addi(wbase, arith.shli(arith.addi(_c(D * N + k * N), colx), _c(2))), x)
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [], "bar.sync 0;", "", has_side_effects=True)
        live = arith.extui(i32, arith.cmpi(arith.CmpIPredicate.ult, tid, _c(D)))  # thread t: head dimension t
        dim = arith.remui(tid, _c(D))
        row = _value_slot(dim, D)  # its row in the warps' partials
        for colx in range(N):
            mw = [ld(arith.addi(rbase, _c(k * stride + 4 * (D * N + colx)))) for k in range(4)]
            big = arith.maximumf(arith.maximumf(mw[0], mw[1]), arith.maximumf(mw[2], mw[3]))
            a = [ex2(arith.subf(mw[k], big)) for k in range(4)]
            total = lambda offs: functools.reduce(arith.addf, [arith.mulf(ld(arith.addi(rbase, o)), a[k])
                                                               for k, o in enumerate(offs)])
            val = total([arith.addi(_c(k * stride + 4 * colx), arith.muli(row, _c(4 * N))) for k in range(4)])
            _st(arith.addi(obase, arith.shli(arith.addi(_c(colx * D), dim), _c(2))), val, live)
            for j in range(4):  # every thread stores the same column statistics
                x = big if j == 0 else total([_c(k * stride + 4 * (D * N + j * N + colx)) for k in range(4)])
                _st(arith.addi(sbase, _c(4 * (j * N + colx))), x)

    body(red_ref, o_ref, st_ref, *arrays)


# Releasing ring slots without a block barrier (release=True): every thread arrives on the slot's "empty"
# mbarrier (128 arrivals) when it is done reading it, and only warp 0, which issues the TMA refill, waits
# for the other warps; warps 1-3 may run up to S - 1 blocks ahead. The default (commit_smem) is a
# warpgroup bar.sync per block, which keeps the four warps in lockstep. Raw PTX mbarriers in an int32
# [S, 2] scratch (8 bytes each, 1024-aligned by Pallas): a Pallas barrier cannot be waited on by one warp.


def _empty_init(ref, S: int):
    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def body(ctx, ref):
        del ctx
        tid = arith.index_cast(ir.IntegerType.get_signless(32), gpu.thread_id(gpu.Dimension.x))
        first = arith.extui(ir.IntegerType.get_signless(32), arith.cmpi(arith.CmpIPredicate.eq, tid, _c(0)))
        base = _smem_addr(ref)
        for s in range(S):
            llvm.inline_asm(ir.Type.parse("!llvm.void"), [arith.addi(base, _c(8 * s)), first],
                            "{ .reg .pred p; setp.ne.u32 p, $1, 0; @p mbarrier.init.shared::cta.b64 [$0], 128; }",
                            "r,r", has_side_effects=True)
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [], "bar.sync 0;", "", has_side_effects=True)

    body(ref)


def _release(ref, code):
    """All threads arrive on the mbarrier at ref; warp 0 then waits for its phase when code (a (64, 8) i32
    WGMMA array, all equal) has bit 1 set (a refill follows), on parity bit 0."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.Layout.WGMMA))
    def body(ctx, ref, code):
        del ctx
        i32 = ir.IntegerType.get_signless(32)
        x = vector.extract(code.registers.flat[0], dynamic_position=[],
                           static_position=ir.DenseI64ArrayAttr.get([0]))
        wid, _, _ = _thread()
        addr = _smem_addr(ref)
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [addr],
                        "{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [$0]; }", "r", has_side_effects=True)
        wait = arith.andi(arith.extui(i32, arith.cmpi(arith.CmpIPredicate.eq, wid, _c(0))), arith.shrui(x, _c(1)))
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [addr, wait, arith.andi(x, _c(1))],
                        "{ .reg .pred p, w; setp.ne.u32 w, $1, 0; @!w bra DONE; WAIT: "
                        "mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $2; @!p bra WAIT; DONE: }",
                        "r,r,r", has_side_effects=True)

    body(ref, code)


def _warp_kernel(q_gmem, colv_gmem, sched_gmem, codes_gmem, par_gmem, raw_gmem, stats_gmem,
                 q_smem, colv_smem, c_smem, p_smem, red_smem, o_smem, st_smem, bars, q_bar, empty_smem=None, *,
                 BT: int, D: int, N: int, S: int, scale2: float, xt: int = 0, keys: str = "f16",
                 lop3: bool = False, late_values: bool = False):
    # As _kernel, with q_gmem in prepare_warp's fragment order, sched_gmem [B, splits, 4]: first token,
    # blocks, and the [max lo, min hi) range inside which no row needs the range mask, and raw_gmem
    # [BH, splits, N, D]: head dimensions in order (warp_merge), each times its value plane factor.
    # xt > 0: the lean body (int2_mosaic_lean.block; q_gmem f16) with xt tiles of sums after the output's.
    # lop3: the per-warp body's unpack as one lop3 per register (the lean bodies always are).
    # late_values: the lean bodies' value fragments unpacked after the scores (int2_mosaic_lean.block).
    f32 = jnp.float32
    bh, sp = lax.axis_index("bh"), lax.axis_index("split")
    b = lax.div(bh, q_gmem.shape[0] // sched_gmem.shape[0])
    first, n_blocks = sched_gmem[b, sp, 0], sched_gmem[b, sp, 1]
    lo_max, hi_min = sched_gmem[b, sp, 2], sched_gmem[b, sp, 3]

    if empty_smem is not None:
        _empty_init(empty_smem, S)
    fetch = _start_ring(bh, first, n_blocks, q_gmem, colv_gmem, codes_gmem, par_gmem, q_smem, colv_smem, c_smem,
                        p_smem, bars, q_bar, BT=BT, S=S)
    col = plgpu.Layout.WGMMA.reduce(0)
    tile = lambda x: lax.broadcast_in_dim(x, (64, N), [1])
    qoff, qsum, lo, hi = (tile(_load(colv_smem.at[i], col)) for i in range(4))
    tok0 = plgpu.broadcasted_iota(jnp.int32, (64, 8), 0, layout=plgpu.Layout.WGMMA).astype(f32)
    wgmma = lambda x: plgpu.layout_cast(x, plgpu.Layout.WGMMA)

    def body(j, carry):
        slot = lax.rem(j, S)
        start = first + j * BT
        plgpu.barrier_wait(bars.at[slot])
        inner = ((start >= lo_max) & (start + BT <= hi_min)).astype(f32)
        carry = block(c_smem.at[slot], p_smem.at[slot], q_smem, tok0 + start.astype(f32),
                      wgmma(jnp.full((64, 8), inner, f32)), qoff, qsum, lo, hi, *carry,
                      BT=BT, D=D, N=N, scale2=scale2)
        if empty_smem is None:
            plgpu.commit_smem()  # every warp is done reading this slot
        else:  # this thread is done reading it; warp 0 waits for all before the refill
            code = lax.rem(lax.div(j, S), 2) + 2 * (j + S < n_blocks).astype(jnp.int32)
            _release(empty_smem.at[slot], wgmma(jnp.full((64, 8), code, jnp.int32)))

        @pl.when(j + S < n_blocks)
        def _refill():
            fetch(j + S, slot)

        return carry

    zeros = lambda rows: wgmma(jnp.zeros((rows, N), f32))
    if xt:
        from jspec.pallas import int2_mosaic_lean as lean

        block = functools.partial(lean.block, XT=xt, keys=keys, late_values=late_values)
        init = (zeros(4 * D + 64 * xt), wgmma(jnp.full((64, N), _NEG, f32)), zeros(64))
    else:
        block = functools.partial(warp_block, lop3=lop3)
        init = (zeros(4 * D), wgmma(jnp.full((64, N), _NEG, f32)), zeros(64), zeros(64), zeros(64))
    warp_merge(red_smem, o_smem, st_smem, *lax.fori_loop(0, n_blocks, body, init), D=D, N=N, xt=xt)
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


def schedule(lo, hi, T: int, splits: int, BT: int):
    """[B, splits, 2] int32: first token and block count of each split of the rows' union range."""
    nonempty = hi > lo
    first = jnp.min(jnp.where(nonempty, lo, T), axis=1)
    last = jnp.max(jnp.where(nonempty, hi, 0), axis=1)
    begin = first // BT * BT
    chunk = -(-(-(-jnp.maximum(last - begin, 0) // splits)) // BT) * BT
    start = begin[:, None] + jnp.arange(splits)[None, :] * chunk[:, None]
    blocks = -(-jnp.clip(last[:, None] - start, 0, chunk[:, None]) // BT)
    return jnp.stack([start, blocks], -1).astype(jnp.int32)


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
            from jspec.pallas import int2_mosaic_lean as lm

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


@functools.partial(jax.jit, static_argnames=("T", "splits", "BT", "lean"))
def prepare(q, lo, hi, T: int, splits: int, BT: int = BLOCK_T, lean: bool = False):
    """Kernel inputs from the queries and ranges: Q' [B, H, N, D] bf16 (key_slots order, divided by the
    plane factor: exact), colv [B, H, 4, N] f32 (128 sum(Q'), sum(q), lo, hi) and the split schedule.
    lean: Q' f16 with the lean body's factors, and -1024 sum(Q') (int2_mosaic_lean)."""
    B, H, M, D = q.shape
    N = -(-M // 8) * 8
    f32 = jnp.float32
    if lean:
        from jspec.pallas import int2_mosaic_lean as lm

        (kdims, kf), qdt, offset = lm.key_slots(D), jnp.float16, -lm.KEY_OFFSET
    else:
        (kdims, kf), qdt, offset = key_slots(D), jnp.bfloat16, OFFSET
    qb = jnp.pad(q.astype(jnp.bfloat16), ((0, 0), (0, 0), (0, N - M), (0, 0)))  # [B, H, N, D]
    qp = (qb[..., kdims].astype(f32) / kf).astype(qdt)
    qsum = qb.astype(f32).sum(-1)
    return qp, row_vectors(offset * qp.astype(f32).sum(-1), qsum, lo, hi), schedule(lo, hi, T, splits, BT)


def row_vectors(first, qsum, lo, hi):
    """colv [B, H, 4, N] f32: first [B, H, N] (the body's score offset or scale), qsum [B, H, N] (sum(q) of
    each row), lo and hi (padded rows: lo = hi = 0, empty). One stack, written once."""
    B, H, N = qsum.shape
    pad_rows = lambda x: jnp.broadcast_to(jnp.pad(x.astype(jnp.float32), ((0, 0), (0, N - x.shape[1])))[:, None],
                                          (B, H, N))
    return jnp.stack([first, qsum, pad_rows(lo), pad_rows(hi)], 2)


@functools.partial(jax.jit, static_argnames=("T", "splits", "BT", "lean"))
def prepare_warp(q, lo, hi, T: int, splits: int, BT: int = BLOCK_T, lean: bool = False):
    """prepare for the per-warp body: Q' in mma B-fragment order ([N/8, g, c, D/16, 2, 2] per head: thread
    (g, c) reads its fragments of column tile nt contiguously) and the schedule with each batch row's
    [max lo, min hi) (no range mask needed inside)."""
    qp, colv, sched = prepare(q, lo, hi, T, splits, BT, lean)
    B, H, N, D = qp.shape
    frag = qp.reshape(B, H, N // 8, 8, D // 16, 2, 4, 2).transpose(0, 1, 2, 3, 6, 4, 5, 7).reshape(B, H, N, D)
    return frag, colv, _with_inside(sched, lo, hi)


def _with_inside(sched, lo, hi):
    """[B, splits, 2] schedule -> [B, splits, 4] with each batch row's [max lo, min hi) (no mask inside)."""
    B, splits = sched.shape[:2]
    inside = jnp.stack([jnp.max(lo, 1), jnp.min(hi, 1)], -1).astype(jnp.int32)  # [B, 2]
    return jnp.concatenate([sched, jnp.broadcast_to(inside[:, None], (B, splits, 2))], -1)


def _value_rows(D: int, warp=False):
    """(dims, factor) of the value rows: warp False (wgmma body), True (per-warp body) or "lean"."""
    if warp == "lean":
        from jspec.pallas import int2_mosaic_lean as lm

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
