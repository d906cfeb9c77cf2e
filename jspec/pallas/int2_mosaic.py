"""Split-K attention over the OSCAR INT2 history on Hopper (Pallas Mosaic GPU, wgmma).

Same contract as int2_attention.int2_attention (rows [B, H, M, D], the cache's codes and qparams,
per-row INT2 key ranges [lo, hi)), built for the H200's wgmma instead of Triton's small dots.

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
    from jax._src.lib.mlir.dialects import arith, gpu, llvm
except ImportError:  # pragma: no cover
    plgpu = None

if plgpu is not None:
    mosaic_keys.install()  # the same kernel, the same cache key, whatever the process lowered before

BLOCK_T = 64  # tokens per block: the wgmma M tile of the score product, K tile of the value product
STAGES = 4  # blocks in flight per CTA (TMA ring)
ROW_BYTES = 128  # the codes' TMA box rows: 128 bytes (4 tokens at D = 128) instead of one token's 32
APPROX = False  # ex2.approx for exp2: measured no faster (benchmarks/NOTES.md), so exact by default
_MAGIC = 0x43004300  # two bf16 128.0: a code in the low mantissa bits reads as 128 + code
_OFFSET = 128.0
_NEG = -1e30  # finite start for the running max: fully masked rows stay NaN-free
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


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
                factor[8 * ct + 2 * c + e] = _FACTOR[i]
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


def _plane(y, i):
    """bf16x2 (as i32) 128 + f_i code for the bit pair i of the low byte of each 16-bit half of y."""
    if i == 3:
        y, i = arith.shrui(y, _c(6)), 0
    return arith.ori(arith.andi(y, _c(0x00030003 << (2 * i))), _c(_MAGIC))


def _plane_shifted(y, i):
    """As _plane, with a run-time plane index i (i32): shifted down, factor 1."""
    return arith.ori(arith.andi(arith.shrui(y, arith.shli(i, _c(1))), _c(0x00030003)), _c(_MAGIC))


def _as_bf16x2(x):
    return mu.bitcast(x, ir.VectorType.get((2,), ir.BF16Type.get()))


def _fragment(regs):
    return mfa.FragmentedArray(_registers=regs, _layout=mfa.WGMMA_LAYOUT, _is_signed=None)


def unpack_keys(ref, BT: int, D: int, raw: bool = False):
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
                            regs[mt, 8 * u + 2 * i + q, 0, 0, hr, 0, 0, 0, 0] = _as_bf16x2(x if raw else _plane(y, i))
        return _fragment(regs)

    return body(ref)


def unpack_values(ref, BT: int, D: int, raw: bool = False):
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
                            v = _plane(y, 2 * mt + hr)
                        else:
                            v = _plane_shifted(y, arith.addi(arith.shli(arith.shrui(w, _c(1)), _c(1)), _c(hr)))
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


def _kernel(q_gmem, colv_gmem, sched_gmem, codes_gmem, par_gmem, raw_gmem, stats_gmem,
            q_smem, colv_smem, c_smem, p_smem, w_smem, o_smem, st_smem, bars, q_bar, *,
            BT: int, D: int, N: int, S: int, scale2: float, ablate: tuple = ()):
    # q_gmem [BH, N, D] bf16 (Q' : permuted, divided by the plane factor) | colv_gmem [BH, 4, N] f32:
    # 128 sum(Q'), sum(q), lo, hi per query row | sched_gmem [B, splits, 2] int32: first token, blocks
    # codes_gmem [BH, 2, T, D/4] uint8 | par_gmem [BH, 4, T] key scale/zero, value scale/zero
    # raw_gmem [BH, splits, D, N] f32: out^T before offsets/normalisation (rows as value_slots)
    # stats_gmem [BH, splits, 4, N] f32: running max (log2), sum p, sum w, sum w z
    f32 = jnp.float32
    row = plgpu.Layout.WGMMA.reduce(1)  # one value per token (row of the [BT, N] tiles)
    col = plgpu.Layout.WGMMA.reduce(0)  # one value per query row
    bh, sp = lax.axis_index("bh"), lax.axis_index("split")
    H = q_gmem.shape[0] // sched_gmem.shape[0]
    b = lax.div(bh, H)
    first, n_blocks = sched_gmem[b, sp, 0], sched_gmem[b, sp, 1]

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
    qoff, qsum = _load(colv_smem.at[0], col), _load(colv_smem.at[1], col)
    lo, hi = _load(colv_smem.at[2], col), _load(colv_smem.at[3], col)
    bcol = lambda x: lax.broadcast_in_dim(x, (BT, N), [1])
    brow = lambda x: lax.broadcast_in_dim(x, (BT, N), [0])
    tok0 = plgpu.broadcasted_iota(jnp.int32, (BT, N), 0, layout=plgpu.Layout.WGMMA).astype(f32)

    def body(j, carry):
        m, l_t, w_t, z_t, acc = carry
        slot = lax.rem(j, S)
        plgpu.barrier_wait(bars.at[slot])
        if "empty" in ablate:  # the TMA ring alone
            plgpu.commit_smem()
            pl.when(j + S < n_blocks)(lambda: fetch(j + S, slot))
            return carry
        ck = None if "noscore" in ablate else unpack_keys(c_smem.at[slot, 0], BT, D, "nokunpack" in ablate)
        cv = None if "novalue" in ablate else unpack_values(c_smem.at[slot, 1], BT, D, "novunpack" in ablate)
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
            s = brow(ks) * (s_raw - bcol(qoff) - brow(kz) * bcol(qsum))
            if "nomask" not in ablate:
                tok = tok0 + (first + j * BT).astype(f32)
                s = jnp.where((tok >= bcol(lo)) & (tok < bcol(hi)), s, -jnp.inf)
            m_new = m if "nomax" in ablate else jnp.maximum(m, s.max(axis=0))
            alpha = jnp.exp2(m - m_new)
            p = s - bcol(m_new) if "noexp" in ablate else jnp.exp2(s - bcol(m_new))
            wv = (p * brow(vs)).astype(jnp.bfloat16)
            wf = wv.astype(f32)
            a2 = bcol(alpha)
            l_t, w_t, z_t = l_t * a2 + p, w_t * a2 + wf, z_t * a2 + wf * brow(vz)
        if cv is not None:
            w_smem.T[...] = plgpu.layout_cast(wv, plgpu.Layout.WGMMA_TRANSPOSED)
        else:
            l_t = l_t + wv.astype(f32)
        plgpu.commit_smem()  # W visible to the tensor core; every thread is done reading this slot

        @pl.when(j + S < n_blocks)
        def _refill():
            fetch(j + S, slot)

        if cv is None:
            return m_new, l_t, w_t, z_t, acc
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


def default_splits(B: int, H: int, T: int, BT: int = BLOCK_T, target: int = 528, min_blocks: int = 4) -> int:
    """Enough splits for about `target` CTAs (4 per SM on 132 SMs), at least min_blocks blocks each."""
    want = max(1, -(-target // max(1, B * H)))
    return max(1, min(want, T // (min_blocks * BT)))


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
                                             "row_bytes", "ablate"))
def int2_attention_mosaic(q, codes, qparams, lo, hi, *, sm_scale=None, num_splits=None, stages=STAGES,
                          block_t=BLOCK_T, approx=APPROX, merge=True, row_bytes=ROW_BYTES, ablate=()):
    """int2_attention on Hopper: same arguments and results (see int2_attention.int2_attention).

    q [B, H, M, D]; codes [B, H, 2, T, D/4] uint8; qparams [B, H, 4, T, 1] (bf16 or f32); lo, hi
    [B, M] int32. Returns out [B, H, M, D] f32 and lse [B, H, M] (merge=True) or the splits'
    partials out [B, H, splits, M, D], lse [B, H, splits, M] (merge=False). block_t: tokens per
    block (64 or 128); approx: the approximate exp2 instruction; stages: blocks in flight per CTA.
    row_bytes: bytes per TMA row of codes (D / 4: one token per row; 128: several).
    ablate: stages of the block body to leave out (ABLATIONS; wrong results, for timing only).
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
        return (out, lse) if merge else (out[:, :, None], lse[:, :, None])

    if block_t not in (64, 128):
        raise ValueError(f"block_t {block_t}: 64 or 128")
    BT, N = block_t, -(-M // 8) * 8
    ns = num_splits or default_splits(B, H, T, BT)
    qp, colv, sched = prepare(q, lo, hi, T, ns, BT)
    f32 = jnp.float32
    par = _tma_ready(qparams.reshape(B * H, 4, T), 2, 16 // qparams.dtype.itemsize)
    # The codes as TMA rows of `wide` tokens (same bytes, same order; wider rows move faster).
    wide = row_bytes // (D // 4)
    cod = _tma_ready(codes.reshape(B * H, 2, T, D // 4), 2, max(BT, wide) if T < BT else wide)
    par = _tma_ready(par, 2, BT) if T < BT else par
    cod = cod.reshape(B * H, 2, cod.shape[2] // wide, row_bytes)

    swz = lambda: (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    kernel = functools.partial(_kernel, BT=BT, D=D, N=N, S=stages, scale2=float(sm_scale) * _LOG2E,
                               ablate=tuple(ablate))
    raw, stats = plgpu.kernel(
        kernel,
        out_type=(jax.ShapeDtypeStruct((B * H, ns, D, N), f32), jax.ShapeDtypeStruct((B * H, ns, 4, N), f32)),
        scratch_types=dict(
            q_smem=plgpu.SMEM((N, D), jnp.bfloat16, transforms=swz()),
            colv_smem=plgpu.SMEM((4, N), f32),
            c_smem=plgpu.SMEM((stages, 2, BT // wide, row_bytes), jnp.uint8),
            p_smem=plgpu.SMEM((stages, 4, BT), par.dtype),
            w_smem=plgpu.SMEM((N, BT), jnp.bfloat16, transforms=swz()),
            o_smem=plgpu.SMEM((D, N), f32),
            st_smem=plgpu.SMEM((4, N), f32),
            bars=plgpu.Barrier(num_arrivals=2, num_barriers=stages),  # two copies per block: codes, scales
            q_bar=plgpu.Barrier(num_arrivals=2),  # queries, row vectors
        ),
        grid=(B * H, ns),
        grid_names=("bh", "split"),
        compiler_params=plgpu.CompilerParams(approx_math=approx, lowering_semantics=plgpu.LoweringSemantics.Lane),
        kernel_name="int2_attention_mosaic",
    )(qp.reshape(B * H, N, D), colv.reshape(B * H, 4, N), sched, cod, par)
    out, lse = finish(raw.reshape(B, H, ns, D, N), stats.reshape(B, H, ns, 4, N), M)
    return merge_lse(out, lse, axis=2) if merge else (out, lse)


@functools.partial(jax.jit, static_argnames=("T", "splits", "BT"))
def prepare(q, lo, hi, T: int, splits: int, BT: int = BLOCK_T):
    """Kernel inputs from the queries and ranges: Q' [B, H, N, D] bf16 (key_slots order, divided by the
    plane factor: exact), colv [B, H, 4, N] f32 (128 sum(Q'), sum(q), lo, hi) and the split schedule."""
    B, H, M, D = q.shape
    N = -(-M // 8) * 8
    kdims, kf = key_slots(D)
    f32 = jnp.float32
    qb = jnp.pad(q.astype(jnp.bfloat16), ((0, 0), (0, 0), (0, N - M), (0, 0)))  # [B, H, N, D]
    qp = (qb[..., kdims].astype(f32) / kf).astype(jnp.bfloat16)
    pad_rows = lambda x: jnp.pad(x.astype(f32), ((0, 0), (0, N - M)))  # padded rows: lo = hi = 0, empty
    colv = jnp.stack([_OFFSET * qp.astype(f32).sum(-1), qb.astype(f32).sum(-1),
                      jnp.broadcast_to(pad_rows(lo)[:, None], (B, H, N)),
                      jnp.broadcast_to(pad_rows(hi)[:, None], (B, H, N))], 2)
    return qp, colv, schedule(lo, hi, T, splits, BT)


@functools.partial(jax.jit, static_argnames=("M",))
def finish(raw, stats, M: int):
    """Kernel partials -> normalised out [B, H, splits, M, D] f32 and lse [B, H, splits, M] (natural log)."""
    vdims, vf = value_slots(raw.shape[-2])
    m, l, sw, zw = (stats[..., i, :] for i in range(4))  # [B, H, ns, N]
    c = (raw - _OFFSET * sw[..., None, :]) * jnp.asarray(1.0 / vf, jnp.float32)[:, None] - zw[..., None, :]
    c = c[..., np.argsort(vdims), :]  # value_slots order -> head dimension order
    live = l > 0
    out = jnp.where(live[..., None, :], c / jnp.where(live, l, 1.0)[..., None, :], 0.0)
    lse = jnp.where(live, (m + jnp.log2(jnp.where(live, l, 1.0))) * _LN2, -jnp.inf)
    return jnp.swapaxes(out, -1, -2)[..., :M, :], lse[..., :M]
