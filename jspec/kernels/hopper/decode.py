"""The "lean" per-warp block body of the Mosaic INT2 kernel (int2_mosaic, body="lean"; issue 16).

Same tiles, ring and algebra as int2_mosaic_warp.warp_block (each warp owns 16 of every 64 tokens, mma.sync
m16n8k16, lazy max, one merge at the end), with fewer integer/logic instructions per code. ncu found the
per-warp body bound by the ALU pipe (65% busy: the LOP3/shift unpack, compares, selects); this body cuts:
- Key codes as f16: a code in the 10-bit f16 mantissa under 0x6400 (1024.0) reads as 1024 + code, so
  all four bit pairs of a byte are masked in place (factors 1, 4, 16, 64: no shift for plane 3) and the
  odd bytes need one shift: 9 instructions per 32-bit word of 16 codes instead of 11 (counting one lop3
  per register, see below). Q' is f16 (q / 4^i,
  exact but for f16 subnormals below 2^-14 * 64), and -1024 sum(Q') starts the score accumulator instead
  of being subtracted per score.
- Value codes stay bf16 (W is bf16), split as x, x >> 6 and x >> 12: planes 0-2 of the low byte in place,
  then bits 6-11, then 12-15: 10 instructions per word instead of 11 (factors in VALUE_SPLIT).
- sum(W) and sum(W * value zero) on the tensor core: one more m16n8k16 per column tile whose A rows are
  the value zeros (a bf16 pair of adjacent tokens is one 32-bit load: no conversion) and ones. That drops
  the bf16 -> f32 extraction of W, the value-zero conversions and 8 f32 adds per 16 tokens. With f32
  qparams the zeros are split into bf16 hi + lo (two extra tiles), so the sums stay exact to ~2^-17.
- Each mask-and-magic is one explicit lop3.b32 (int2_mosaic_parts._andor): ptxas emits LLVM's and/or as two
  LOP3s (one immediate per LOP3), so this alone halves the unpack (measured on a PTX microkernel).
- The range mask is computed inside the branch of edge blocks (int2_mosaic_warp evaluates it before its
  scf.if, so LLVM turns the if into selects and every block pays for the compares).

body="lean8" also moves the score product to 8-bit integers (keys="s8"): mma.sync m16n8k32 with the key
codes as u8 A operands, 4 codes per register: planes 0/1 masked in place, planes 2/3 after one shift by 4
(factors 1, 4, 1, 4): 5 instructions per word instead of 9, half the key registers. Q is an int16
fixed-point number per query row, Q_n[slot] = round(q * 4 / f / s_n) (|Q| <= 32767), in two digits (s8
high, u8 low: two products per k-chunk, int32 accumulators combined exactly), so q . c = (256 acc_h +
acc_l) s_n / 4. Q's step is at most 2^-14 max|q_n| (the factor-4 planes; the CPU model: lse within ~5e-5
of the reference where the bf16 bodies are exact in Q). Masking all four planes in place (factors up
to 64, no shift) was 16x coarser: lse off by ~7e-4.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jspec.kernels.hopper import ptx as mp

if mp.plgpu is not None:
    from jspec.kernels.hopper.ptx import arith, ir, mu, plgpu

KEY_OFFSET = 1024.0  # f16 0x6400: a code in the mantissa's low bits reads as 1024 + factor * code
KEY_FACTORS = (1.0, 4.0, 16.0, 64.0)  # bit pair i of a byte, masked in place
IMMA_SHIFT = (0, 0, 4, 4)  # lean8: bit pair i of each byte shifted down by this, then masked in place
_F16_MAGIC = 0x64006400
_ONES = 0x3F803F80  # two bf16 1.0

# The value unpack: (shift of the 32-bit register, mask per 16-bit lane, byte e, plane i, factor): each
# ldmatrix register holds bytes e = 0 (bits 0-7) and e = 1 (bits 8-15) of one 16-bit column per lane.
VALUE_SPLIT = ((0, 0x3, 0, 0, 1.0), (0, 0xC, 0, 1, 4.0), (0, 0x30, 0, 2, 16.0),
               (6, 0x3, 0, 3, 1.0), (6, 0xC, 1, 0, 4.0), (6, 0x30, 1, 1, 16.0),
               (12, 0x3, 1, 2, 1.0), (12, 0xC, 1, 3, 4.0))


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


def prepare_imma(q, lo, hi, T: int, splits: int, BT: int):
    """prepare_warp for keys="s8": Q as two digits per slot, bytes [B, H, N, 2 D] uint8 (row n = 8 nt + g;
    thread column c reads D / 2 bytes at c D / 2: per chunk kc, digit (s8 high, u8 low), half hf, 4 bytes
    of k slots 16 hf + 4 c + b), colv[0] = s_n / 4 (the score scale), the rest as prepare_warp."""
    B, H, M, D = q.shape
    N = -(-M // 8) * 8
    dims, factor = imma_slots(D)
    qb = jnp.pad(q.astype(jnp.bfloat16).astype(jnp.float32), ((0, 0), (0, 0), (0, N - M), (0, 0)))
    v = qb[..., dims] * jnp.asarray(4.0 / factor, jnp.float32)  # [B, H, N, D] slot order
    # max |v| and sum(q) in one variadic reduction (one kernel): the stack of row_vectors then only copies. When it
    # summed q itself, that stack took 3.8 us per layer at batch 1 (H200, session 16), likely a serial sum per row.
    both = lambda a, b: (jnp.maximum(a[0], b[0]), a[1] + b[1])
    big, qsum = jax.lax.reduce((jnp.abs(v), qb), (0.0, 0.0), both, (3,))
    big = big[..., None]
    s = jnp.where(big > 0, big / 32767.0, 1.0)
    fixed = jnp.round(v / s).astype(jnp.int32)  # in [-32767, 32767]
    digits = jnp.stack([(fixed >> 8).astype(jnp.int8).view(jnp.uint8), (fixed & 255).astype(jnp.uint8)], -1)
    digits = digits.reshape(B, H, N, D // 32, 2, 4, 4, 2).transpose(0, 1, 2, 5, 3, 7, 4, 6)  # n, c, kc, dig, hf, b
    # colv built here with its first row (not prepare_warp's, then overwritten: that was a kernel of its own)
    sched = mp._with_inside(mp.schedule(lo, hi, T, splits, BT), lo, hi)
    return digits.reshape(B, H, N, 2 * D), mp.row_vectors(s[..., 0] / 4.0, qsum, lo, hi), sched


def prepare(q, lo, hi, T: int, splits: int, BT: int):
    """int2_mosaic_parts.prepare for the lean body: Q' f16 in its key slots, -1024 sum(Q') as the score offset."""
    return mp.prepare(q, lo, hi, T, splits, BT, key_slots(q.shape[-1]), jnp.float16, -KEY_OFFSET)


def key_slots(D: int):
    """(dim, factor) per column of the key A operand: int2_mosaic_parts.key_slots' dims, KEY_FACTORS."""
    return mp.key_slots(D, KEY_FACTORS)


def value_slots(D: int):
    """(dim, factor) per row of out^T [D, N]: int2_mosaic_parts.warp_value_slots' dims, VALUE_SPLIT's factors."""
    factors = {(e, i): f for _, _, e, i, f in VALUE_SPLIT}
    return mp.warp_value_slots(D, lambda e, i: factors[e, i])


def _keys(base, rows, c, D: int):
    """Key codes of this thread's token rows (g, g + 8) -> {(column tile, row half): f16x2} (key_slots)."""
    kregs = {}
    for hr, u, x in _key_words(base, rows, c, D):
        for q, y in enumerate((x, arith.shrui(x, mp._c(8)))):
            for i in range(4):
                kregs[8 * u + 2 * i + q, hr] = mp._andor(y, 0x00030003 << (2 * i), _F16_MAGIC)
    return kregs


def _key_words(base, rows, c, D: int):
    """(row half, word u, the u-th code word of this thread) for its token rows (g, g + 8), from shared memory."""
    for hr in range(2):
        addr = arith.addi(base, arith.addi(arith.muli(rows[hr], mp._c(D // 4)), arith.muli(c, mp._c(D // 16))))
        nw = D // 64
        asm = "ld.shared.b32 $0, [$1];" if nw == 1 else "ld.shared.v2.b32 {$0, $1}, [$2];"
        for u, x in enumerate(mp._asm_load(addr, nw, asm)):
            yield hr, u, x


def _keys_s8(base, rows, c, D: int):
    """Key codes of this thread's token rows -> {(chunk kc, half hf, row half): u8x4} (imma_slots): each
    word (shifted by IMMA_SHIFT) masked per plane."""
    kregs = {}
    for hr, u, x in _key_words(base, rows, c, D):
        src = {0: x, 4: arith.shrui(x, mp._c(4))}
        for i in range(4):
            kc, hf = (i, u) if D == 128 else (i // 2, i % 2)
            kregs[kc, hf, hr] = arith.andi(src[IMMA_SHIFT[i]], mp._c(0x03030303 << (2 * i - IMMA_SHIFT[i])))
    return kregs


def _scores_s8(kregs, qf, cs, D: int):
    """q . c for one column tile from the u8 key fragments and the digits qf (words in prepare_imma's
    order): rows (g, g + 8) x columns (2c, 2c + 1), 4 f32 (the integer product times cs = s_n / 4)."""
    i32 = ir.IntegerType.get_signless(32)
    imma = lambda kind, a, b, acc4: mp._asm(
        [i32] * 4, [*a, *b, *acc4], f"mma.sync.aligned.m16n8k32.row.col.s32.u8.{kind}.s32 "
        "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};", "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r")
    acc = {"s8": [mp._c(0)] * 4, "u8": [mp._c(0)] * 4}  # high and low digit: two independent chains
    for kc in range(D // 32):
        a = [kregs[kc, 0, 0], kregs[kc, 0, 1], kregs[kc, 1, 0], kregs[kc, 1, 1]]
        for dig, kind in enumerate(("s8", "u8")):
            acc[kind] = imma(kind, a, qf[4 * kc + 2 * dig:4 * kc + 2 * dig + 2], acc[kind])
    f32 = ir.F32Type.get()
    total = [arith.addi(arith.shli(h, mp._c(8)), l) for h, l in zip(acc["s8"], acc["u8"])]  # |.| < 128 * 12 * 2^15
    return [arith.mulf(arith.sitofp(f32, t), cs[k % 2]) for k, t in enumerate(total)]


def _values(base, offset: int, wid, lane, sb: int, D: int):
    """As int2_mosaic_warp._warp_values (same ldmatrix.trans, same slots), with the VALUE_SPLIT unpack."""
    lrow = arith.addi(mp._c(64 * sb), arith.addi(arith.shli(wid, mp._c(4)), arith.addi(
        arith.andi(lane, mp._c(7)), arith.shli(arith.andi(arith.shrui(lane, mp._c(3)), mp._c(1)), mp._c(3)))))
    vaddr = arith.addi(arith.addi(base, mp._c(offset)), arith.muli(lrow, mp._c(D // 4)))
    if D == 128:
        vaddr = arith.addi(vaddr, arith.shli(arith.shrui(lane, mp._c(4)), mp._c(4)))
        mats = mp._asm_load(vaddr, 4, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];")
    else:
        mats = mp._asm_load(vaddr, 2, "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {$0, $1}, [$2];")
    vslots = {}  # (mt, hr, k-half) -> bf16x2 register
    for mi, x in enumerate(mats):
        kh, h = mi % 2, mi // 2
        shifted = {0: x, 6: arith.shrui(x, mp._c(6)), 12: arith.shrui(x, mp._c(12))}
        for shift, mask, e, i, _ in VALUE_SPLIT:
            mt, hr = (4 * e + i, h) if D == 128 else (i, e)
            vslots[mt, hr, kh] = mp._andor(shifted[shift], mask * 0x10001, mp._MAGIC)
    return [[vslots[mt, 0, 0], vslots[mt, 1, 0], vslots[mt, 0, 1], vslots[mt, 1, 1]] for mt in range(D // 16)]


def _zero_pairs(pbase, isz: int, BT: int, tok):
    """The value zeros of tokens tok, tok + 1 (K rows 2c, 2c + 1 of the value product) as bf16x2 A-operand
    registers: [pair] for bf16 qparams (one load), [hi, lo] for f32 (hi + lo = z to ~2^-17)."""
    addr = arith.addi(pbase, arith.muli(arith.addi(tok, mp._c(3 * BT)), mp._c(isz)))
    if isz == 2:
        return mp._asm_load(addr, 1, "ld.shared.b32 $0, [$1];")
    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
    z = [mu.bitcast(r, f32) for r in mp._asm_load(addr, 2, "ld.shared.v2.b32 {$0, $1}, [$2];")]
    pack = lambda a, b: mp._asm([i32], [b, a], "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")[0]  # a: low half
    hi = pack(*z)
    hf = [mu.bitcast(arith.shli(hi, mp._c(16)), f32), mu.bitcast(arith.andi(hi, mp._c(-65536)), f32)]
    return [hi, pack(*(arith.subf(z[k], hf[k]) for k in range(2)))]


def block(c_ref, p_ref, q_ref, tok, interior, qoff, qsum, lo, hi, acc, m, l, *, BT, D, N, scale2, XT, keys="f16",
          late_values=False):
    """One block of BT tokens: (acc [64 (D/16 + XT), N], m, l [64, N]) -> new state.

    As int2_mosaic_warp.warp_block, but acc has XT extra m-tiles after the D/16 output tiles: row g of each
    holds sum_t W_t z_t (z split into XT bf16 parts), row g + 8 of the first sum_t W_t; qoff is -1024
    sum(Q') (the score accumulator's start) and Q' is f16; keys="s8": prepare_imma's digits, qoff the
    score scale s_n / 4. late_values: the value fragments (D/16 x 4 registers) loaded and unpacked after the
    scores, once the key fragments and Q's are dead, not before them: 1.02-1.03x faster (H200, session 16), though
    ptxas gives 144 registers for the lean8 body against 142 (the ring's 63.5 KB of shared memory also caps it at
    3 CTAs per SM)."""
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
        ex2 = lambda x: mp._asm([f32], [x], "ex2.approx.ftz.f32 $0, $1;", "=f,f")[0]
        wid, g, c = mp._thread()
        lane = arith.andi(arith.index_cast(i32, mp.gpu.thread_id(mp.gpu.Dimension.x)), mp._c(31))
        acc_v = mp._pairs(acc, 64 * (MT + XT), N)  # [MT + XT][NT][hr] -> [column 2c, column 2c + 1]
        m_v, l_v = (mp._pairs(x, 64, N)[0] for x in (m, l))  # [NT][hr][2]
        tok_blk = [x[0] for x in mp._pairs(tok, 64, 8)[0][0]]  # rows g, g + 8 -> token index (f32)
        edge = arith.cmpf(arith.CmpFPredicate.OLT, mp._pairs(interior, 64, 8)[0][0][0][0], fc(0.5))
        col = {k: mp._pairs(x, 64, N)[0] for k, x in (("qoff", qoff), ("qsum", qsum), ("lo", lo), ("hi", hi))}
        isz = mu.bitwidth(ir.MemRefType(p_ref.type).element_type) // 8
        pbase, cbase, qbase = mp._smem_addr(p_ref), mp._smem_addr(c_ref), mp._smem_addr(q_ref)
        row_blk = [arith.addi(arith.shli(wid, mp._c(4)), arith.addi(g, mp._c(8 * hr))) for hr in range(2)]
        kpair = arith.addi(arith.shli(wid, mp._c(4)), arith.shli(c, mp._c(1)))  # token of value K row 2c

        def param(i, row):
            addr = arith.addi(pbase, arith.muli(arith.addi(row, mp._c(i * BT)), mp._c(isz)))
            if isz == 2:
                v = mp._asm_load(addr, 1, "ld.shared.u16 $0, [$1];")[0]
                return mu.bitcast(arith.shli(v, mp._c(16)), f32)
            return mu.bitcast(mp._asm_load(addr, 1, "ld.shared.b32 $0, [$1];")[0], f32)

        def mma(kind):
            return lambda a, b, acc4: mp._asm(
                [f32] * 4, [*a, *b, *acc4], f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")

        mma16, mma_bf = mma("f16"), mma("bf16")
        ones, zero = mp._c(_ONES), mp._c(0)
        tau, ninf = fc(mp.TAU), fc(-float("inf"))
        for sb in range(BT // 64):  # each warp's 16 tokens of every 64 in the block
            tok_v = [add(t, fc(64 * sb)) for t in tok_blk]
            tokrow = [arith.addi(r, mp._c(64 * sb)) for r in row_blk]
            ks = [mul(param(0, tokrow[hr]), fc(scale2)) for hr in range(2)]
            kz, vs = ([param(i, tokrow[hr]) for hr in range(2)] for i in (1, 2))
            kregs = (_keys_s8 if keys == "s8" else _keys)(cbase, tokrow, c, D)
            va = None if late_values else _values(cbase, BT * D // 4, wid, lane, sb, D)
            zp = [_zero_pairs(pbase, isz, BT, arith.addi(kpair, mp._c(64 * sb + 8 * kh))) for kh in range(2)]
            xa = [[zp[0][x], ones if x == 0 else zero, zp[1][x], ones if x == 0 else zero] for x in range(XT)]

            for nt in range(NT):
                qaddr = arith.addi(qbase, arith.muli(arith.addi(arith.muli(arith.addi(mp._c(8 * nt), g), mp._c(4)),
                                                                c), mp._c(D // 2)))
                qf = []
                for k in range(D // 32):
                    qf += mp._asm_load(arith.addi(qaddr, mp._c(16 * k)), 4, "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];")
                cq, cs = col["qoff"][nt][0], col["qsum"][nt][0]
                if keys == "s8":
                    s4 = _scores_s8(kregs, qf, cq, D)
                else:
                    chains = [[cq[0], cq[1], cq[0], cq[1]], [fc(0.0)] * 4]  # -1024 sum(Q') starts one chain
                    for kc in range(D // 16):
                        a = [kregs[2 * kc, 0], kregs[2 * kc, 1], kregs[2 * kc + 1, 0], kregs[2 * kc + 1, 1]]
                        chains[kc % 2] = mma16(a, qf[2 * kc:2 * kc + 2], chains[kc % 2])
                    s4 = [add(x, y) for x, y in zip(*chains)]
                s = [mul(ks[hr], sub(s4[2 * hr + e], mul(kz[hr], cs[e]))) for hr in range(2) for e in range(2)]

                flat = mp._if(edge, lambda s=s, nt=nt, tok_v=tok_v: mp._range_masked(  # interior blocks skip it
                    s, tok_v, col["lo"][nt][0], col["hi"][nt][0], ninf), s)
                s = [[flat[0], flat[1]], [flat[2], flat[3]]]
                mref = m_v[nt][0]
                state = mp._lazy_max(s, tau, [mref[0], mref[1], *l_v[nt][0], *l_v[nt][1], *[
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
                    packed = mp._asm([i32], [wv[1], wv[0]], "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")[0]
                    l_v[nt][hr] = [add(l_v[nt][hr][e], p[e]) for e in range(2)]
                    wb.append(mp._asm([i32], [packed], "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r",
                                      side_effects=True)[0])
                if va is None:
                    va = _values(cbase, BT * D // 4, wid, lane, sb, D)
                for mt in range(MT + XT):
                    acc4 = mma_bf(va[mt] if mt < MT else xa[mt - MT], wb, [*acc_v[mt][nt][0], *acc_v[mt][nt][1]])
                    acc_v[mt][nt] = [acc4[0:2], acc4[2:4]]
        pack_small = lambda v: mp._unpairs([v], 64, N)
        return mp._unpairs(acc_v, 64 * (MT + XT), N), pack_small(m_v), pack_small(l_v)

    return body(c_ref, p_ref, q_ref, tok, interior, qoff, qsum, lo, hi, acc, m, l)


__all__ = ["KEY_FACTORS", "KEY_OFFSET", "VALUE_SPLIT", "block", "imma_slots", "key_slots", "prepare_imma",
           "value_slots"]
