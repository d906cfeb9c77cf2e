"""The decode body of the Mosaic INT2 kernel (hopper.attention picks it for up to DECODE_MAX_ROWS query rows per
KV head): per-warp mma.sync, an 8-bit integer score product, no cross-warp synchronisation inside a block.

Warp w owns tokens 16 w .. 16 w + 15 of every 64 in a block and keeps its own softmax state and output; the 4
warps' partials are merged once at the end, through shared memory (warp_merge). The running max is lazy: a warp
rescales only when a score exceeds its reference by more than TAU (one vote per block), so p <= 2^TAU.
- Scores: mma.sync m16n8k32 with the key codes as u8 A operands, 4 codes per register: planes 0/1 masked in
  place, planes 2/3 after one shift by 4 (factors 1, 4, 1, 4: IMMA_SHIFT), 5 instructions per 32-bit word of
  16 codes. Q is an int16 fixed-point number per query row, Q_n[slot] = round(q * 4 / f / s_n) (|Q| <= 32767),
  in two digits (s8 high, u8 low: two products per k-chunk, int32 accumulators combined exactly), so q . c =
  (256 acc_h + acc_l) s_n / 4 (prepare_queries). Q's step is at most 2^-14 max|q_n| (the factor-4 planes; the
  CPU model: lse within ~5e-5 of the reference). Masking all four planes in place (factors up to 64, no
  shift) was 16x coarser: lse off by ~7e-4.
- Values: W = p * value scale (bf16) becomes the B operand of out^T [D, 8] += C_V^T [D, 16 tokens] @ W by
  movmatrix.trans; C_V^T from ldmatrix.trans, each register split as x, x >> 6 and x >> 12 and masked under the
  bf16 magic (VALUE_SPLIT), one explicit lop3 per register (ptx.and_or). The value fragments are unpacked after
  the scores, once the key fragments and Q's are dead: 1.02-1.03x kernel time at all five points measured
  (H200, docs/kernels.md), though ptxas gives 144 registers against 142.
- sum(W) and sum(W * value zero) on the tensor core: one more m16n8k16 per column tile whose A rows are the
  value zeros (a bf16 pair of adjacent tokens is one 32-bit load) and ones. With f32 qparams the zeros are
  split into bf16 hi + lo (two extra tiles: XT = 2), so the sums stay exact to ~2^-17.
- The range mask only in edge blocks (inside the branch, so interior blocks pay no compares).
- Ring slots are released through mbarriers, not a block barrier (release_init, release).

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

from jspec.kernels.common import NEG
from jspec.kernels.hopper import ptx
from jspec.kernels.hopper.launch import launch
from jspec.kernels.hopper.prepare import ring_inputs, row_vectors, schedule, with_inside

if ptx.plgpu is not None:
    from jspec.kernels.hopper.ptx import arith, gpu, ir, llvm, mu, plgpu, vector

IMMA_SHIFT = (0, 0, 4, 4)  # bit pair i of each byte shifted down by this, then masked in place
TAU = 8.0  # log2 headroom of the lazy max (p <= 256: far from bf16/f32 overflow)
_ONES = 0x3F803F80  # two bf16 1.0

# The value unpack: (shift of the 32-bit register, mask per 16-bit lane, byte e, plane i, factor): each
# ldmatrix register holds bytes e = 0 (bits 0-7) and e = 1 (bits 8-15) of one 16-bit column per lane.
VALUE_SPLIT = ((0, 0x3, 0, 0, 1.0), (0, 0xC, 0, 1, 4.0), (0, 0x30, 0, 2, 16.0),
               (6, 0x3, 0, 3, 1.0), (6, 0xC, 1, 0, 4.0), (6, 0x30, 1, 1, 16.0),
               (12, 0x3, 1, 2, 1.0), (12, 0xC, 1, 3, 4.0))

DECODE_MAX_ROWS = 8  # query rows per KV head the entry gives this body (decode; at 24 rows it spills)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The decode body's tunables (a static argument: part of the compile key).

    block_t: tokens per block (64 or 128); stages: blocks in flight per CTA (the TMA ring): 4 read 4-5% faster
    than 3 at every point measured, 2 as fast as 4 (H200, docs/kernels.md); num_splits: splits of
    the history per KV head (None: decode_splits, whole waves of CTAs)."""

    block_t: int = 128
    stages: int = 4
    num_splits: int | None = None

    def __post_init__(self):
        if self.block_t not in (64, 128):
            raise ValueError(f"block_t {self.block_t}: 64 or 128")
        if self.stages < 1 or (self.num_splits is not None and self.num_splits < 1):
            raise ValueError(f"stages {self.stages}, num_splits {self.num_splits}: at least 1 (or None)")


# ----------------------------------------------------------------------------------------------
# Grid: decode's splits in whole waves
# ----------------------------------------------------------------------------------------------

# The body takes 161 registers per thread, so DECODE_CTAS_PER_SM = 3 CTAs of 128 threads fit on an SM: a wave
# is 396 CTAs on the H200's 132 SMs (the profiler's kernel_details: regs 161, 54 KB of shared memory,
# theoretical occupancy 18.75%). A grid a few CTAs past a wave runs a whole extra round for them: at B 1 / 1M
# 50 splits per KV head (400 CTAs) read at 44.9% of copy against 61.9% for 49 (392), 100 at 53.8% against 62.5%
# for 99; at B 4 / 1M 13 splits 47.7% against 63.5% for 12 (kernel time, H200, docs/kernels.md).
# So the splits fill k waves, k the fewest that leave at most DECODE_CTA_TOKENS tokens per CTA and fill at
# least 90% of the last one; no split is shorter than DECODE_MIN_BLOCKS blocks (at B 1 / 32K 49 splits of 5
# blocks read at 34.0% of copy, 33 of 8 at 36.1%).
DECODE_CTAS_PER_SM, DECODE_CTA_TOKENS, DECODE_MIN_BLOCKS = 3, 16384, 8


def decode_wave() -> int:
    """CTAs of the decode kernel resident at once on the default device (an H200's 132 SMs off a GPU, whose
    devices have no core count)."""
    sms = getattr(jax.devices()[0], "core_count", None)
    return DECODE_CTAS_PER_SM * (sms or 132)


def decode_splits(B: int, H: int, T: int, BT: int = DecodeConfig.block_t, wave: int | None = None) -> int:
    """Splits per KV head of the decode grid: B x H x splits CTAs in whole waves of `wave` CTAs (None:
    decode_wave()); at least DECODE_MIN_BLOCKS blocks per split."""
    heads = max(1, B * H)
    wave = wave or decode_wave()
    most = max(1, T // (DECODE_MIN_BLOCKS * BT))
    for k in range(1, 4 * heads + 1):  # k waves; s = 1 fills the last k at the latest
        s = min(k * wave // heads, most)
        if s and (s == most or (T <= s * DECODE_CTA_TOKENS and 10 * heads * s >= 9 * k * wave)):
            return s
    return 1


# ----------------------------------------------------------------------------------------------
# Which head dimension each register slot holds (static, numpy), and the host-side query digits
# ----------------------------------------------------------------------------------------------

def imma_slots(D: int):
    """(dim, factor) per k slot 32 kc + 16 hf + 4 c + b of the 8-bit score product (chunk kc, half hf,
    thread column c, byte b): register (word u, plane i) of a token row is chunk/half (i, u) at D = 128,
    (i // 2, i % 2) at D = 64; factor 4^i / 2^IMMA_SHIFT[i]."""
    dims, factor = np.zeros(D, np.int64), np.zeros(D, np.float64)
    for kc, hf, c, b in np.ndindex(D // 32, 2, 4, 4):
        i, j = (kc, 8 * c + 4 * hf + b) if D == 128 else (2 * kc + hf, 4 * c + b)
        k = 32 * kc + 16 * hf + 4 * c + b
        dims[k], factor[k] = j + (D // 4) * i, 4.0**i / 2**IMMA_SHIFT[i]
    return dims, factor


def prepare_queries(q, lo, hi, T: int, splits: int, BT: int):
    """The body's inputs from the queries q [B, H, M, D] and ranges lo, hi [B, M]: Q as two digits per slot, bytes
    [B, H, N, 2 D] uint8 (row n = 8 nt + g; thread column c reads D / 2 bytes at c D / 2: per chunk kc, digit (s8
    high, u8 low), half hf, 4 bytes of k slots 16 hf + 4 c + b); colv [B, H, 4, N] f32 (s_n / 4, the score scale;
    sum(q), lo, hi); the schedule [B, splits, 4] with each batch row's [max lo, min hi) (no range mask inside)."""
    B, H, M, D = q.shape
    N = -(-M // 8) * 8
    dims, factor = imma_slots(D)
    qb = jnp.pad(q.astype(jnp.bfloat16).astype(jnp.float32), ((0, 0), (0, 0), (0, N - M), (0, 0)))
    v = qb[..., dims] * jnp.asarray(4.0 / factor, jnp.float32)  # [B, H, N, D] slot order
    # max |v| and sum(q) in one variadic reduction (one kernel): the stack of row_vectors then only copies. When it
    # summed q itself, that stack took 3.8 us per layer at batch 1 (H200), likely a serial sum per row.
    both = lambda a, b: (jnp.maximum(a[0], b[0]), a[1] + b[1])
    big, qsum = jax.lax.reduce((jnp.abs(v), qb), (0.0, 0.0), both, (3,))
    big = big[..., None]
    s = jnp.where(big > 0, big / 32767.0, 1.0)
    fixed = jnp.round(v / s).astype(jnp.int32)  # in [-32767, 32767]
    digits = jnp.stack([(fixed >> 8).astype(jnp.int8).view(jnp.uint8), (fixed & 255).astype(jnp.uint8)], -1)
    digits = digits.reshape(B, H, N, D // 32, 2, 4, 4, 2).transpose(0, 1, 2, 5, 3, 7, 4, 6)  # n, c, kc, dig, hf, b
    sched = with_inside(schedule(lo, hi, T, splits, BT), lo, hi)
    return digits.reshape(B, H, N, 2 * D), row_vectors(s[..., 0] / 4.0, qsum, lo, hi), sched

def warp_value_slots(D: int, factor_of):
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


def value_slots(D: int):
    """(dim, factor) per row of out^T [D, N]: warp_value_slots' dims, VALUE_SPLIT's factors."""
    factors = {(e, i): f for _, _, e, i, f in VALUE_SPLIT}
    return warp_value_slots(D, lambda e, i: factors[e, i])

# ----------------------------------------------------------------------------------------------
# Kernel: the block body (inline code), the warps' merge, the ring's release
# ----------------------------------------------------------------------------------------------


def _key_words(base, rows, c, D: int):
    """(row half, word u, the u-th code word of this thread) for its token rows (g, g + 8), from shared memory."""
    for hr in range(2):
        addr = arith.addi(base, arith.addi(arith.muli(rows[hr], ptx.imm(D // 4)), arith.muli(c, ptx.imm(D // 16))))
        nw = D // 64
        asm = "ld.shared.b32 $0, [$1];" if nw == 1 else "ld.shared.v2.b32 {$0, $1}, [$2];"
        for u, x in enumerate(ptx.asm_load(addr, nw, asm)):
            yield hr, u, x

def _keys_s8(base, rows, c, D: int):
    """Key codes of this thread's token rows -> {(chunk kc, half hf, row half): u8x4} (imma_slots): each
    word (shifted by IMMA_SHIFT) masked per plane."""
    kregs = {}
    for hr, u, x in _key_words(base, rows, c, D):
        src = {0: x, 4: arith.shrui(x, ptx.imm(4))}
        for i in range(4):
            kc, hf = (i, u) if D == 128 else (i // 2, i % 2)
            kregs[kc, hf, hr] = arith.andi(src[IMMA_SHIFT[i]], ptx.imm(0x03030303 << (2 * i - IMMA_SHIFT[i])))
    return kregs


def _scores_s8(kregs, qf, cs, D: int):
    """q . c for one column tile from the u8 key fragments and the digits qf (words in prepare_imma's
    order): rows (g, g + 8) x columns (2c, 2c + 1), 4 f32 (the integer product times cs = s_n / 4)."""
    i32 = ir.IntegerType.get_signless(32)
    imma = lambda kind, a, b, acc4: ptx.asm(
        [i32] * 4, [*a, *b, *acc4], f"mma.sync.aligned.m16n8k32.row.col.s32.u8.{kind}.s32 "
        "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};", "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r")
    acc = {"s8": [ptx.imm(0)] * 4, "u8": [ptx.imm(0)] * 4}  # high and low digit: two independent chains
    for kc in range(D // 32):
        a = [kregs[kc, 0, 0], kregs[kc, 0, 1], kregs[kc, 1, 0], kregs[kc, 1, 1]]
        for dig, kind in enumerate(("s8", "u8")):
            acc[kind] = imma(kind, a, qf[4 * kc + 2 * dig:4 * kc + 2 * dig + 2], acc[kind])
    f32 = ir.F32Type.get()
    total = [arith.addi(arith.shli(h, ptx.imm(8)), l) for h, l in zip(acc["s8"], acc["u8"])]  # |.| < 128 * 12 * 2^15
    return [arith.mulf(arith.sitofp(f32, t), cs[k % 2]) for k, t in enumerate(total)]


def _values(base, offset: int, wid, lane, sb: int, D: int):
    """Value codes (at base + offset) of the warp's 16 tokens (half sb of a 128-token block) -> the value product's
    A fragments per m-tile (rows as value_slots), by ldmatrix.trans over the token rows and the VALUE_SPLIT unpack."""
    lrow = arith.addi(ptx.imm(64 * sb), arith.addi(arith.shli(wid, ptx.imm(4)), arith.addi(
        arith.andi(lane, ptx.imm(7)), arith.shli(arith.andi(arith.shrui(lane, ptx.imm(3)), ptx.imm(1)), ptx.imm(3)))))
    vaddr = arith.addi(arith.addi(base, ptx.imm(offset)), arith.muli(lrow, ptx.imm(D // 4)))
    if D == 128:
        vaddr = arith.addi(vaddr, arith.shli(arith.shrui(lane, ptx.imm(4)), ptx.imm(4)))
        mats = ptx.asm_load(vaddr, 4, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];")
    else:
        mats = ptx.asm_load(vaddr, 2, "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {$0, $1}, [$2];")
    vslots = {}  # (mt, hr, k-half) -> bf16x2 register
    for mi, x in enumerate(mats):
        kh, h = mi % 2, mi // 2
        shifted = {0: x, 6: arith.shrui(x, ptx.imm(6)), 12: arith.shrui(x, ptx.imm(12))}
        for shift, mask, e, i, _ in VALUE_SPLIT:
            mt, hr = (4 * e + i, h) if D == 128 else (i, e)
            vslots[mt, hr, kh] = ptx.and_or(shifted[shift], mask * 0x10001, ptx.MAGIC)
    return [[vslots[mt, 0, 0], vslots[mt, 1, 0], vslots[mt, 0, 1], vslots[mt, 1, 1]] for mt in range(D // 16)]


def _zero_pairs(pbase, isz: int, BT: int, tok):
    """The value zeros of tokens tok, tok + 1 (K rows 2c, 2c + 1 of the value product) as bf16x2 A-operand
    registers: [pair] for bf16 qparams (one load), [hi, lo] for f32 (hi + lo = z to ~2^-17)."""
    addr = arith.addi(pbase, arith.muli(arith.addi(tok, ptx.imm(3 * BT)), ptx.imm(isz)))
    if isz == 2:
        return ptx.asm_load(addr, 1, "ld.shared.b32 $0, [$1];")
    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
    z = [mu.bitcast(r, f32) for r in ptx.asm_load(addr, 2, "ld.shared.v2.b32 {$0, $1}, [$2];")]
    pack = lambda a, b: ptx.asm([i32], [b, a], "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")[0]  # a: low half
    hi = pack(*z)
    hf = [mu.bitcast(arith.shli(hi, ptx.imm(16)), f32), mu.bitcast(arith.andi(hi, ptx.imm(-65536)), f32)]
    return [hi, pack(*(arith.subf(z[k], hf[k]) for k in range(2)))]


def block(c_ref, p_ref, q_ref, tok, interior, qoff, qsum, lo, hi, acc, m, l, *, BT, D, N, scale2, XT):
    """One block of BT tokens: (acc [64 (D/16 + XT), N], m, l [64, N]) -> new state.

    The state arrays are WGMMA-layout containers of per-thread registers: acc (mt, nt, hr) holds out^T rows
    16 mt + 8 hr + g, columns 8 nt + 2 c (+1), then XT m-tiles whose row g holds sum_t W_t z_t (z split into XT
    bf16 parts) and row g + 8 of the first sum_t W_t; m holds each column's reference (both rows alike); l the
    per-thread partial sums of p for the thread's token rows g, g + 8. qoff is the score scale s_n / 4 (colv[0]);
    Q (q_ref) is prepare_queries' digits. The value fragments (D/16 x 4 registers) are loaded and unpacked after
    the scores."""
    MT, NT = D // 16, N // 8
    spec = lambda shape: plgpu.ShapeDtypeStruct(shape, jnp.float32, layout=plgpu.Layout.WGMMA)
    small = spec((64, N))

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 3 + (plgpu.Layout.WGMMA,) * 9,
                       return_type=(spec((64 * (MT + XT), N)), small, small))
    def body(ctx, c_ref, p_ref, q_ref, tok, interior, qoff, qsum, lo, hi, acc, m, l):
        del ctx
        i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
        fc = lambda v: mu.c(float(v), f32)
        add, sub, mul = arith.addf, arith.subf, arith.mulf
        ex2 = lambda x: ptx.asm([f32], [x], "ex2.approx.ftz.f32 $0, $1;", "=f,f")[0]
        wid, g, c = ptx.thread()
        lane = arith.andi(arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x)), ptx.imm(31))
        acc_v = ptx.pairs(acc, 64 * (MT + XT), N)  # [MT + XT][NT][hr] -> [column 2c, column 2c + 1]
        m_v, l_v = (ptx.pairs(x, 64, N)[0] for x in (m, l))  # [NT][hr][2]
        tok_blk = [x[0] for x in ptx.pairs(tok, 64, 8)[0][0]]  # rows g, g + 8 -> token index (f32)
        edge = arith.cmpf(arith.CmpFPredicate.OLT, ptx.pairs(interior, 64, 8)[0][0][0][0], fc(0.5))
        col = {k: ptx.pairs(x, 64, N)[0] for k, x in (("qoff", qoff), ("qsum", qsum), ("lo", lo), ("hi", hi))}
        isz = mu.bitwidth(ir.MemRefType(p_ref.type).element_type) // 8
        pbase, cbase, qbase = ptx.smem_addr(p_ref), ptx.smem_addr(c_ref), ptx.smem_addr(q_ref)
        row_blk = [arith.addi(arith.shli(wid, ptx.imm(4)), arith.addi(g, ptx.imm(8 * hr))) for hr in range(2)]
        kpair = arith.addi(arith.shli(wid, ptx.imm(4)), arith.shli(c, ptx.imm(1)))  # token of value K row 2c

        def param(i, row):
            addr = arith.addi(pbase, arith.muli(arith.addi(row, ptx.imm(i * BT)), ptx.imm(isz)))
            if isz == 2:
                v = ptx.asm_load(addr, 1, "ld.shared.u16 $0, [$1];")[0]
                return mu.bitcast(arith.shli(v, ptx.imm(16)), f32)
            return mu.bitcast(ptx.asm_load(addr, 1, "ld.shared.b32 $0, [$1];")[0], f32)

        def mma(kind):
            return lambda a, b, acc4: ptx.asm(
                [f32] * 4, [*a, *b, *acc4], f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")

        mma_bf = mma("bf16")
        ones, zero = ptx.imm(_ONES), ptx.imm(0)
        tau, ninf = fc(TAU), fc(-float("inf"))
        for sb in range(BT // 64):  # each warp's 16 tokens of every 64 in the block
            tok_v = [add(t, fc(64 * sb)) for t in tok_blk]
            tokrow = [arith.addi(r, ptx.imm(64 * sb)) for r in row_blk]
            ks = [mul(param(0, tokrow[hr]), fc(scale2)) for hr in range(2)]
            kz, vs = ([param(i, tokrow[hr]) for hr in range(2)] for i in (1, 2))
            kregs = _keys_s8(cbase, tokrow, c, D)
            va = None  # unpacked after the first column tile's scores
            zp = [_zero_pairs(pbase, isz, BT, arith.addi(kpair, ptx.imm(64 * sb + 8 * kh))) for kh in range(2)]
            xa = [[zp[0][x], ones if x == 0 else zero, zp[1][x], ones if x == 0 else zero] for x in range(XT)]

            for nt in range(NT):
                qaddr = arith.addi(qbase, arith.muli(arith.addi(arith.muli(arith.addi(ptx.imm(8 * nt), g), ptx.imm(4)),
                                                                c), ptx.imm(D // 2)))
                qf = []
                for k in range(D // 32):
                    qf += ptx.asm_load(arith.addi(qaddr, ptx.imm(16 * k)), 4,
                                       "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];")
                cq, cs = col["qoff"][nt][0], col["qsum"][nt][0]
                s4 = _scores_s8(kregs, qf, cq, D)
                s = [mul(ks[hr], sub(s4[2 * hr + e], mul(kz[hr], cs[e]))) for hr in range(2) for e in range(2)]

                flat = ptx.if_else(edge, lambda s=s, nt=nt, tok_v=tok_v: _range_masked(  # interior blocks skip it
                    s, tok_v, col["lo"][nt][0], col["hi"][nt][0], ninf), s)
                s = [[flat[0], flat[1]], [flat[2], flat[3]]]
                mref = m_v[nt][0]
                state = _lazy_max(s, tau, [mref[0], mref[1], *l_v[nt][0], *l_v[nt][1], *[
                    x for mt in range(MT + XT) for hr in range(2) for x in acc_v[mt][nt][hr]]])
                mref = state[0:2]
                m_v[nt] = [mref, mref]
                l_v[nt] = [state[2:4], state[4:6]]
                for mt in range(MT + XT):
                    acc_v[mt][nt] = [state[6 + 4 * mt:8 + 4 * mt], state[8 + 4 * mt:10 + 4 * mt]]
                # p, W = p * value scale (bf16) as the value product's B fragment; sum p in f32.
                wb = []
                for hr in range(2):
                    p = [ex2(sub(s[hr][e], mref[e])) for e in range(2)]
                    wv = [mul(p[e], vs[hr]) for e in range(2)]
                    packed = ptx.asm([i32], [wv[1], wv[0]], "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")[0]
                    l_v[nt][hr] = [add(l_v[nt][hr][e], p[e]) for e in range(2)]
                    wb.append(ptx.asm([i32], [packed], "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r",
                                      side_effects=True)[0])
                if va is None:
                    va = _values(cbase, BT * D // 4, wid, lane, sb, D)
                for mt in range(MT + XT):
                    acc4 = mma_bf(va[mt] if mt < MT else xa[mt - MT], wb, [*acc_v[mt][nt][0], *acc_v[mt][nt][1]])
                    acc_v[mt][nt] = [acc4[0:2], acc4[2:4]]
        pack_small = lambda v: ptx.unpairs([v], 64, N)
        return ptx.unpairs(acc_v, 64 * (MT + XT), N), pack_small(m_v), pack_small(l_v)

    return body(c_ref, p_ref, q_ref, tok, interior, qoff, qsum, lo, hi, acc, m, l)


def _range_masked(s, tok, lo, hi, ninf):
    """The scores s (rows g, g + 8 x columns 2c, 2c + 1, flat) with ninf where the row's
    token tok[row half] is outside the column's range [lo, hi)."""
    out = []
    for hr in range(2):
        for e in range(2):
            ok = arith.andi(arith.cmpf(arith.CmpFPredicate.OGE, tok[hr], lo[e]),
                            arith.cmpf(arith.CmpFPredicate.OLT, tok[hr], hi[e]))
            out.append(arith.select(ok, s[2 * hr + e], ninf))
    return out


def _lazy_max(s, tau, state):
    """The lazy maximum, one warp vote per block. state = [m0, m1, *rest]: the reference
    maxima of this thread's two columns, then values kept against them (alternating between the columns).
    When a score of s [row half][column] passes its reference by more than tau anywhere in the warp, the
    maxima move to the warp's running maxima and rest is scaled by exp2(old - new); else state is kept."""
    f32 = ir.F32Type.get()
    mref = state[:2]
    over = None
    for hr in range(2):
        for e in range(2):
            o = arith.cmpf(arith.CmpFPredicate.OGT, s[hr][e], arith.addf(mref[e], tau))
            over = o if over is None else arith.ori(over, o)
    vote = ptx.warp_any(over)

    def rescale():
        new_m = []
        for e in range(2):
            bm = arith.maximumf(s[0][e], s[1][e])
            for d in (4, 8, 16):
                bm = arith.maximumf(bm, mu.shfl_bfly(bm, d))
            new_m.append(arith.maximumf(mref[e], bm))
        alpha = [ptx.asm([f32], [arith.subf(mref[e], new_m[e])], "ex2.approx.ftz.f32 $0, $1;", "=f,f")[0]
                 for e in range(2)]
        return new_m + [arith.mulf(v, alpha[k % 2]) for k, v in enumerate(state[2:])]

    return ptx.if_else(arith.cmpi(arith.CmpIPredicate.ne, vote, ptx.imm(0)), rescale, state)


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
    bits = lambda shift, mask: arith.andi(arith.shrui(dim, ptx.imm(shift)), ptx.imm(mask))
    if D == 128:
        parts = ((bits(0, 1), 64), (bits(5, 3), 16), (bits(4, 1), 8), (bits(1, 7), 1))
    else:
        parts = ((bits(4, 3), 16), (bits(0, 1), 8), (bits(1, 7), 1))
    return functools.reduce(arith.addi, [arith.muli(x, ptx.imm(f)) for x, f in parts])


def warp_merge(red_ref, o_ref, st_ref, acc, m, l, *, D, N, xt):
    """The 4 warps' partials -> o_ref [N, D] (head dimensions in order, each times its value plane factor) and
    st_ref [4, N] (reference max, sum p, sum W, sum W z), through red_ref [4, D N + 4 N] f32 in shared memory
    (rows as warp_value_slots) and one barrier. acc's xt tiles after the D/16 output tiles hold the warp's sums
    (row g: sum W z in xt parts, row g + 8 of the first: sum W), already summed over its tokens."""
    MT, NT = D // 16, N // 8

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 3 + (plgpu.Layout.WGMMA,) * 3)
    def body(ctx, red_ref, o_ref, st_ref, acc, m, l):
        del ctx
        i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
        ex2 = lambda x: ptx.asm([f32], [x], "ex2.approx.ftz.f32 $0, $1;", "=f,f")[0]
        ld = lambda addr: mu.bitcast(ptx.asm_load(addr, 1, "ld.shared.b32 $0, [$1];")[0], f32)
        wid, g, c = ptx.thread()
        tid = arith.remui(arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x)), ptx.imm(128))
        rbase, obase, sbase = ptx.smem_addr(red_ref), ptx.smem_addr(o_ref), ptx.smem_addr(st_ref)
        stride = 4 * (D * N + 4 * N)  # bytes per warp in red_ref
        wbase = arith.addi(rbase, arith.muli(wid, ptx.imm(stride)))
        acc_v = ptx.pairs(acc, 64 * (MT + xt), N)
        m_v, l_v = (ptx.pairs(x, 64, N)[0] for x in (m, l))
        for nt in range(NT):
            for e in range(2):
                colx = arith.addi(ptx.imm(8 * nt + e), arith.shli(c, ptx.imm(1)))
                for mt in range(MT):
                    for hr in range(2):
                        r = arith.addi(ptx.imm(16 * mt + 8 * hr), g)
                        _st(arith.addi(wbase, arith.shli(arith.addi(arith.muli(r, ptx.imm(N)), colx), ptx.imm(2))),
                            acc_v[mt][nt][hr][e])
                sums = []
                x = arith.addf(l_v[nt][0][e], l_v[nt][1][e])  # the thread's two rows, then the warp's 8 row groups
                for d in (4, 8, 16):
                    x = arith.addf(x, mu.shfl_bfly(x, d))
                sums.append(x)
                # sum W and sum W z: summed over the tokens by the tensor core
                sums.append(acc_v[MT][nt][1][e])
                sums.append(functools.reduce(arith.addf, [acc_v[MT + x][nt][0][e] for x in range(xt)]))
                for k, x in enumerate((m_v[nt][0][e], *sums)):  # all 8 row groups store the same value
                    _st(arith.addi(wbase, arith.shli(arith.addi(ptx.imm(D * N + k * N), colx), ptx.imm(2))), x)
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [], "bar.sync 0;", "", has_side_effects=True)
        live = arith.extui(i32, arith.cmpi(arith.CmpIPredicate.ult, tid, ptx.imm(D)))  # thread t: head dimension t
        dim = arith.remui(tid, ptx.imm(D))
        row = _value_slot(dim, D)  # its row in the warps' partials
        for colx in range(N):
            mw = [ld(arith.addi(rbase, ptx.imm(k * stride + 4 * (D * N + colx)))) for k in range(4)]
            big = arith.maximumf(arith.maximumf(mw[0], mw[1]), arith.maximumf(mw[2], mw[3]))
            a = [ex2(arith.subf(mw[k], big)) for k in range(4)]
            total = lambda offs: functools.reduce(arith.addf, [arith.mulf(ld(arith.addi(rbase, o)), a[k])
                                                               for k, o in enumerate(offs)])
            val = total([arith.addi(ptx.imm(k * stride + 4 * colx), arith.muli(row, ptx.imm(4 * N))) for k in range(4)])
            _st(arith.addi(obase, arith.shli(arith.addi(ptx.imm(colx * D), dim), ptx.imm(2))), val, live)
            for j in range(4):  # every thread stores the same column statistics
                x = big if j == 0 else total([ptx.imm(k * stride + 4 * (D * N + j * N + colx)) for k in range(4)])
                _st(arith.addi(sbase, ptx.imm(4 * (j * N + colx))), x)

    body(red_ref, o_ref, st_ref, acc, m, l)


# Releasing ring slots without a block barrier: every thread arrives on the slot's "empty" mbarrier (128
# arrivals) when it is done reading it, and only warp 0, which issues the TMA refill, waits for the other
# warps; warps 1-3 may run up to S - 1 blocks ahead (a warpgroup bar.sync per block, commit_smem, would keep
# the four warps in lockstep). Raw PTX mbarriers in an int32
# [S, 2] scratch (8 bytes each, 1024-aligned by Pallas): a Pallas barrier cannot be waited on by one warp.


def _empty_init(ref, S: int):
    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def body(ctx, ref):
        del ctx
        tid = arith.index_cast(ir.IntegerType.get_signless(32), gpu.thread_id(gpu.Dimension.x))
        first = arith.extui(ir.IntegerType.get_signless(32), arith.cmpi(arith.CmpIPredicate.eq, tid, ptx.imm(0)))
        base = ptx.smem_addr(ref)
        for s in range(S):
            llvm.inline_asm(ir.Type.parse("!llvm.void"), [arith.addi(base, ptx.imm(8 * s)), first],
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
        wid, _, _ = ptx.thread()
        addr = ptx.smem_addr(ref)
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [addr],
                        "{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [$0]; }", "r", has_side_effects=True)
        warp0 = arith.extui(i32, arith.cmpi(arith.CmpIPredicate.eq, wid, ptx.imm(0)))
        wait = arith.andi(warp0, arith.shrui(x, ptx.imm(1)))
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [addr, wait, arith.andi(x, ptx.imm(1))],
                        "{ .reg .pred p, w; setp.ne.u32 w, $1, 0; @!w bra DONE; WAIT: "
                        "mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $2; @!p bra WAIT; DONE: }",
                        "r,r,r", has_side_effects=True)

    body(ref, code)


def _kernel(q_gmem, colv_gmem, sched_gmem, codes_gmem, par_gmem, raw_gmem, stats_gmem,
            q_smem, colv_smem, c_smem, p_smem, red_smem, o_smem, st_smem, bars, q_bar, empty_smem, *,
            BT: int, D: int, N: int, S: int, scale2: float, xt: int):
    # q_gmem [BH, N, 2 D] uint8 (prepare_queries' digits) | colv_gmem [BH, 4, N] f32: score scale s_n / 4, sum(q),
    # lo, hi per query row | sched_gmem [B, splits, 4] int32: first token, blocks, and the [max lo, min hi) range
    # inside which no row needs the range mask | codes_gmem [BH, 2, T / wide, ROW_BYTES] uint8 (ring_inputs) |
    # par_gmem [BH, 4, T] key scale/zero, value scale/zero
    # raw_gmem [BH, splits, N, D] f32: out before offsets/normalisation, head dimensions in order (warp_merge),
    # each times its value plane factor | stats_gmem [BH, splits, 4, N] f32: reference max (log2), sum p, sum w,
    # sum w z | xt: tiles of sums after the output's in the accumulator (1: bf16 qparams, 2: f32)
    f32 = jnp.float32
    bh, sp = lax.axis_index("bh"), lax.axis_index("split")
    b = lax.div(bh, q_gmem.shape[0] // sched_gmem.shape[0])
    first, n_blocks = sched_gmem[b, sp, 0], sched_gmem[b, sp, 1]
    lo_max, hi_min = sched_gmem[b, sp, 2], sched_gmem[b, sp, 3]

    _empty_init(empty_smem, S)
    fetch = ptx.start_ring(bh, first, n_blocks, q_gmem, colv_gmem, codes_gmem, par_gmem, q_smem, colv_smem, c_smem,
                           p_smem, bars, q_bar, BT=BT, S=S)
    col = plgpu.Layout.WGMMA.reduce(0)
    tile = lambda x: lax.broadcast_in_dim(x, (64, N), [1])
    qoff, qsum, lo, hi = (tile(ptx.load(colv_smem.at[i], col)) for i in range(4))
    tok0 = plgpu.broadcasted_iota(jnp.int32, (64, 8), 0, layout=plgpu.Layout.WGMMA).astype(f32)
    wgmma = lambda x: plgpu.layout_cast(x, plgpu.Layout.WGMMA)

    def body(j, carry):
        slot = lax.rem(j, S)
        start = first + j * BT
        plgpu.barrier_wait(bars.at[slot])
        inner = ((start >= lo_max) & (start + BT <= hi_min)).astype(f32)
        carry = block(c_smem.at[slot], p_smem.at[slot], q_smem, tok0 + start.astype(f32),
                      wgmma(jnp.full((64, 8), inner, f32)), qoff, qsum, lo, hi, *carry,
                      BT=BT, D=D, N=N, scale2=scale2, XT=xt)
        # this thread is done reading the slot; warp 0 waits for all before the refill
        code = lax.rem(lax.div(j, S), 2) + 2 * (j + S < n_blocks).astype(jnp.int32)
        _release(empty_smem.at[slot], wgmma(jnp.full((64, 8), code, jnp.int32)))

        @pl.when(j + S < n_blocks)
        def _refill():
            fetch(j + S, slot)

        return carry

    zeros = lambda rows: wgmma(jnp.zeros((rows, N), f32))
    init = (zeros(4 * D + 64 * xt), wgmma(jnp.full((64, N), NEG, f32)), zeros(64))
    warp_merge(red_smem, o_smem, st_smem, *lax.fori_loop(0, n_blocks, body, init), D=D, N=N, xt=xt)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, raw_gmem.at[bh, sp])
    plgpu.copy_smem_to_gmem(st_smem, stats_gmem.at[bh, sp])
    plgpu.wait_smem_to_gmem(0)


# ----------------------------------------------------------------------------------------------
# Wrapper
# ----------------------------------------------------------------------------------------------


def decode_attention(q, codes, qparams, lo, hi, *, config: DecodeConfig, scale2: float):
    """The decode body over q [B, H, M, D] (D 64 or 128), codes [B, H, 2, T, D/4] uint8, qparams [B, H, 4, T, 1]
    and per-row ranges lo, hi [B, M] (checked by the caller, hopper.attention.int2_attention_mosaic); scale2:
    the softmax scale times log2(e). Returns the splits' raw partials: raw [B, H, splits, N, D] f32 (head
    dimensions in order, times value_factors' inverse, plus RAW_OFFSET sum(w)) and stats [B, H, splits, 4, N]
    (N: M rounded up to 8)."""
    B, H, M, D = q.shape
    T = codes.shape[3]
    N = -(-M // 8) * 8
    BT, stages = config.block_t, config.stages
    ns = config.num_splits or decode_splits(B, H, T, BT)
    cod, par = ring_inputs(codes, qparams, BT)
    qp, colv, sched = prepare_queries(q, lo, hi, T, ns, BT)
    xt = 1 if par.dtype == jnp.bfloat16 else 2  # tiles of value-zero sums: z in bf16 parts
    scratch = dict(red_smem=plgpu.SMEM((4, D * N + 4 * N), jnp.float32),
                   empty_smem=plgpu.SMEM((stages, 2), jnp.int32))  # one mbarrier per ring slot (release)
    kernel = functools.partial(_kernel, BT=BT, D=D, N=N, S=stages, scale2=scale2, xt=xt)
    # No automatic warpgroup barriers (Pallas puts one before every TMA copy in Lane semantics): the kernel reads
    # no region it writes but in warp_merge, behind its own bar.sync.
    raw, stats = launch(kernel, qp.reshape(B * H, *qp.shape[2:]), colv.reshape(B * H, 4, N), sched, cod, par,
                        raw_shape=(N, D), D=D, BT=BT, stages=stages, scratch=scratch, auto_barriers=False)
    return raw.reshape(B, H, ns, N, D), stats.reshape(B, H, ns, 4, N)

