"""What the two block bodies of the Mosaic INT2 kernel (decode.py, verify.py) share on the device: Mosaic GPU's
imports, inline PTX (shared-memory loads, the mask-and-magic unpack, a warp vote, scf.if), register containers,
and the TMA ring. Like the kernel modules, it imports and traces without a GPU."""

from __future__ import annotations

import functools

import numpy as np
from jax.experimental import pallas as pl

try:  # Mosaic GPU pieces: present in jax >= 0.10 builds; import must not need a GPU
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.experimental.mosaic.gpu import fragmented_array as mfa
    from jax.experimental.mosaic.gpu import utils as mu
    from jax._src.lib.mlir import ir  # the MLIR bindings inline_mgpu bodies build with (no public module)
    from jax._src.lib.mlir.dialects import arith, gpu, llvm, scf, vector
except ImportError:  # pragma: no cover
    plgpu = None

MAGIC = 0x43004300  # two bf16 128.0: a code in the low mantissa bits reads as 128 + code (common.RAW_OFFSET)
# Bit pair i of a byte lands at value 128 + PLANE_FACTORS[i] * code (plane: 0-2 masked in place, 3 shifted).
PLANE_FACTORS = (1.0, 4.0, 16.0, 1.0)


def imm(v, ty=None):
    """An i32 (or ty) constant."""
    return mu.c(v, ty or ir.IntegerType.get_signless(32))


def thread():
    """(warp 0..3, row group g 0..7, column c 0..3) of this thread in its warpgroup."""
    i32 = ir.IntegerType.get_signless(32)
    tid = arith.remui(arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x)), imm(128))
    lane = arith.andi(tid, imm(31))
    return arith.shrui(tid, imm(5)), arith.shrui(lane, imm(2)), arith.andi(lane, imm(3))


def smem_addr(ref):
    return llvm.ptrtoint(ir.IntegerType.get_signless(32), mu.memref_ptr(ref))


def asm_load(addr, n: int, asm: str):
    """n 32-bit registers from shared memory (side effects: stays after the barrier wait)."""
    i32 = ir.IntegerType.get_signless(32)
    outs = ",".join(["=r"] * n)
    if n == 1:
        return [llvm.inline_asm(i32, [addr], asm, outs + ",r", has_side_effects=True)]
    st = llvm.inline_asm(llvm.StructType.get_literal([i32] * n), [addr], asm, outs + ",r", has_side_effects=True)
    return [llvm.extractvalue(i32, st, [k]) for k in range(n)]


def asm(types, args, code, constraints, side_effects=False):
    """Inline PTX with len(types) results."""
    if len(types) == 1:
        return [llvm.inline_asm(types[0], args, code, constraints, has_side_effects=side_effects)]
    st = llvm.inline_asm(llvm.StructType.get_literal(types), args, code, constraints, has_side_effects=side_effects)
    return [llvm.extractvalue(t, st, [k]) for k, t in enumerate(types)]


def and_or(y, mask: int, magic: int):
    """(y & mask) | magic as one explicit lop3.b32 (LUT 0xEA): ptxas (13.0) emits the and/or pair that LLVM
    writes as two LOP3s, since a LOP3 takes one immediate (measured on a PTX microkernel)."""
    i32 = ir.IntegerType.get_signless(32)
    return llvm.inline_asm(i32, [y], f"lop3.b32 $0, $1, {mask:#x}, {magic:#x}, 0xEA;", "=r,r")


def plane(y, i):
    """bf16x2 (as i32) 128 + f_i code for the bit pair i of the low byte of each 16-bit half of y
    (factor PLANE_FACTORS[i])."""
    if i == 3:
        y, i = arith.shrui(y, imm(6)), 0
    return and_or(y, 0x00030003 << (2 * i), MAGIC)


def warp_any(pred):
    """i32 1 in every lane when the i1 pred holds in any lane of the warp, else 0 (vote.sync.any)."""
    i32 = ir.IntegerType.get_signless(32)
    return asm([i32], [arith.extui(i32, pred)], "{ .reg .pred p, q; setp.ne.u32 p, $1, 0; "
               "vote.sync.any.pred q, p, 0xffffffff; selp.u32 $0, 1, 0, q; }", "=r,r", side_effects=True)[0]


def if_else(cond, then, vals):
    """scf.if: then() when cond (warp-uniform i1) else vals."""
    try:
        op = scf.IfOp(cond, [v.type for v in vals], has_else=True)
    except TypeError:  # older bindings
        op = scf.IfOp(cond, [v.type for v in vals], hasElse=True)
    with ir.InsertionPoint(op.then_block):
        scf.yield_(then())
    with ir.InsertionPoint(op.else_block):
        scf.yield_(vals)
    return list(op.results)


def pairs(arr, rows: int, N: int):
    """A (rows, N) f32 WGMMA fragment's registers as [rows / 64][N / 8][hr] -> [v0, v1] (f32 scalars)."""
    regs = arr.registers.reshape(rows // 64, N // 8, 2)
    get = lambda v, i: vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([i]))
    return [[[[get(regs[a, b, h], 0), get(regs[a, b, h], 1)] for h in range(2)] for b in range(N // 8)]
            for a in range(rows // 64)]


def unpairs(vals, rows: int, N: int):
    """pairs' inverse: the nested f32 scalars as a (rows, N) WGMMA fragment."""
    f32 = ir.F32Type.get()
    regs = np.empty(mfa.WGMMA_LAYOUT.registers_shape((rows, N)), dtype=object)
    flat = regs.reshape(rows // 64, N // 8, 2)
    for a, b, h in np.ndindex(rows // 64, N // 8, 2):
        flat[a, b, h] = vector.from_elements(ir.VectorType.get((2,), f32), vals[a][b][h])
    return mfa.FragmentedArray(_registers=regs, _layout=mfa.WGMMA_LAYOUT, _is_signed=None)


def load(ref, layout):
    """plgpu.load of a whole ref in a register layout."""
    try:
        return plgpu.load(ref, layout=layout)
    except TypeError:  # jax 0.10: the index is a required argument
        return plgpu.load(ref, (), layout=layout)


def start_ring(bh, first, n_blocks, q_gmem, colv_gmem, codes_gmem, par_gmem, q_smem, colv_smem, c_smem, p_smem,
               bars, q_bar, *, BT: int, S: int):
    """Loads the queries and row vectors, primes the TMA ring with the first S blocks of this CTA's split and
    returns fetch(j, slot), which loads block j (codes and scales) into a slot of the ring."""

    def fetch(j, slot):
        start = first + j * BT
        rows = c_smem.shape[2]  # a block's codes per plane as TMA rows of several tokens (prepare.ROW_BYTES)
        plgpu.copy_gmem_to_smem(codes_gmem.at[bh, :, pl.ds(start // (BT // rows), rows), :], c_smem.at[slot],
                                bars.at[slot])
        plgpu.copy_gmem_to_smem(par_gmem.at[bh, :, pl.ds(start, BT)], p_smem.at[slot], bars.at[slot])

    plgpu.copy_gmem_to_smem(q_gmem.at[bh], q_smem, q_bar)
    plgpu.copy_gmem_to_smem(colv_gmem.at[bh], colv_smem, q_bar)
    for s in range(S):
        pl.when(s < n_blocks)(functools.partial(fetch, s, s))
    plgpu.barrier_wait(q_bar)
    return fetch
