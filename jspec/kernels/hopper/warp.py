"""The per-warp block body of the Mosaic INT2 kernel (int2_mosaic, body="warp"; the lean bodies build on it):
mma.sync, no cross-warp synchronisation inside a block.

Warp w owns tokens 16 w .. 16 w + 15 of each 64-token block and keeps its own softmax state and output.
Scores^T [16 tokens, 8 columns] per column tile: mma.m16n8k16 over D (A: the unpacked key codes, the same
fragments int2_mosaic.unpack_keys builds; B: Q' from shared memory, stored in fragment order by prepare_warp).
P (as bf16 W = p * value scale) becomes the B operand of the value product by two movmatrix.trans,
and out^T [D, 8] += C_V^T [D, 16 tokens] @ W with C_V^T from ldmatrix.trans (rows as warp_value_slots).
The running max is lazy: a warp rescales only when a score exceeds its reference by more than TAU
(one vote per block), so p <= 2^TAU. The 4 warps' partials are merged once, through shared memory.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jspec.kernels.hopper import decode as lean
from jspec.kernels.hopper.ptx import (_NEG, TAU, _asm, _asm_load, _c, _if, _lazy_max, _load, _pairs, _plane,
                                            _range_masked, _smem_addr, _start_ring, _thread, _unpairs, _with_inside,
                                            plgpu, prepare)

if plgpu is not None:
    from jspec.kernels.hopper.ptx import arith, gpu, ir, llvm, mu, vector


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


@functools.partial(jax.jit, static_argnames=("T", "splits", "BT", "lean_body"))
def prepare_warp(q, lo, hi, T: int, splits: int, BT: int, lean_body: bool = False):
    """prepare for the per-warp body: Q' in mma B-fragment order ([N/8, g, c, D/16, 2, 2] per head: thread
    (g, c) reads its fragments of column tile nt contiguously) and the schedule with each batch row's
    [max lo, min hi) (no range mask needed inside). lean_body: the lean body's Q' (int2_mosaic_lean.prepare)."""
    qp, colv, sched = (lean.prepare if lean_body else prepare)(q, lo, hi, T, splits, BT)
    B, H, N, D = qp.shape
    frag = qp.reshape(B, H, N // 8, 8, D // 16, 2, 4, 2).transpose(0, 1, 2, 3, 6, 4, 5, 7).reshape(B, H, N, D)
    return frag, colv, _with_inside(sched, lo, hi)
