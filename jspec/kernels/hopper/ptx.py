"""What the block bodies of the Mosaic INT2 kernel share (int2_mosaic: the wgmma body and the entry point;
int2_mosaic_warp and int2_mosaic_lean: the per-warp mma.sync bodies): Mosaic GPU's imports, inline PTX
(shared-memory loads, the mask-and-magic unpack, scf.if, the per-warp lazy max), which head dimension each
register slot holds, the TMA ring, and the host-side inputs (queries, row vectors, the splits' schedule).
Like the kernel modules, it imports and traces without a GPU."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

try:  # Mosaic GPU pieces: present in jax >= 0.10 builds; import must not need a GPU
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.experimental.mosaic.gpu import fragmented_array as mfa
    from jax.experimental.mosaic.gpu import utils as mu
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu, llvm, vector
except ImportError:  # pragma: no cover
    plgpu = None

_MAGIC = 0x43004300  # two bf16 128.0: a code in the low mantissa bits reads as 128 + code
OFFSET = 128.0  # what the magic leaves on every value code: raw partials carry 128 sum(w) (finish, window_merge)
_NEG = -1e30  # finite start for the running max: fully masked rows stay NaN-free
LN2 = 0.6931471805599453
TAU = 8.0  # log2 headroom of the lazy max (p <= 256: far from bf16/f32 overflow)


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


# ----------------------------------------------------------------------------------------------
# Inline code (Mosaic GPU: raw shared-memory loads, bit tricks, register layouts)
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


def _warp_any(pred):
    """i32 1 in every lane when the i1 pred holds in any lane of the warp, else 0 (vote.sync.any)."""
    i32 = ir.IntegerType.get_signless(32)
    return _asm([i32], [arith.extui(i32, pred)], "{ .reg .pred p, q; setp.ne.u32 p, $1, 0; "
                "vote.sync.any.pred q, p, 0xffffffff; selp.u32 $0, 1, 0, q; }", "=r,r", side_effects=True)[0]


def _lazy_max(s, tau, state):
    """The per-warp bodies' lazy maximum, one warp vote per block. state = [m0, m1, *rest]: the reference
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
    vote = _warp_any(over)

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


# ----------------------------------------------------------------------------------------------
# The TMA ring and the host-side inputs
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


def prepare(q, lo, hi, T: int, splits: int, BT: int, slots=None, dtype=jnp.bfloat16, offset: float = OFFSET):
    """Kernel inputs from the queries and ranges: Q' [B, H, N, D] (in slots = (dims, factor) order, divided by
    the factor: exact; None: key_slots, the wgmma and per-warp bodies'), colv [B, H, 4, N] f32 (offset sum(Q'),
    sum(q), lo, hi) and the split schedule. The lean body passes its own slots, f16 and -1024."""
    B, H, M, D = q.shape
    N = -(-M // 8) * 8
    f32 = jnp.float32
    kdims, kf = key_slots(D) if slots is None else slots
    qb = jnp.pad(q.astype(jnp.bfloat16), ((0, 0), (0, 0), (0, N - M), (0, 0)))  # [B, H, N, D]
    qp = (qb[..., kdims].astype(f32) / kf).astype(dtype)
    qsum = qb.astype(f32).sum(-1)
    return qp, row_vectors(offset * qp.astype(f32).sum(-1), qsum, lo, hi), schedule(lo, hi, T, splits, BT)


def row_vectors(first, qsum, lo, hi):
    """colv [B, H, 4, N] f32: first [B, H, N] (the body's score offset or scale), qsum [B, H, N] (sum(q) of
    each row), lo and hi (padded rows: lo = hi = 0, empty). One stack, written once."""
    B, H, N = qsum.shape
    pad_rows = lambda x: jnp.broadcast_to(jnp.pad(x.astype(jnp.float32), ((0, 0), (0, N - x.shape[1])))[:, None],
                                          (B, H, N))
    return jnp.stack([first, qsum, pad_rows(lo), pad_rows(hi)], 2)


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


def _with_inside(sched, lo, hi):
    """[B, splits, 2] schedule -> [B, splits, 4] with each batch row's [max lo, min hi) (no mask inside)."""
    B, splits = sched.shape[:2]
    inside = jnp.stack([jnp.max(lo, 1), jnp.min(hi, 1)], -1).astype(jnp.int32)  # [B, 2]
    return jnp.concatenate([sched, jnp.broadcast_to(inside[:, None], (B, splits, 2))], -1)
