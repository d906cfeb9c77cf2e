"""Split-K decode attention over the OSCAR INT2 history (Pallas, Triton backend).

Queries of one KV head are packed into the matmul M dimension (GQA group x query positions), so one
pass over a KV head's packed codes serves every query row that shares it. Each query row has its own
INT2 key range [lo, hi) (the attention rule gives a query at t the history [S, t-R]); the kernel
returns, per row, the softmax-normalised partial output and the log-sum-exp over exactly that range,
which the caller merges with the BF16 parts.

Dequantisation is folded around the dots (per token, G = D): a key is k = s (c - z), so
    q.k = s (q.c) - s z sum(q),
and for values sum_t p_t s_t (c_t - z_t) = (p s) @ C - sum_t p_t s_t z_t. Codes never become f32:
bits are OR-ed into the mantissa of a bf16 constant (4.0 = 0x4080; code c in mantissa bits 5-6 reads
as 4 + c exactly), so unpacking is shift/and/or on integers, no int->float conversion, and the +4
offset is folded into the zero point. Group sizes G < D run through the pure-jnp reference.

Codes may be given as the cache stores them (uint8 [.., D/4], planar: bit pair i of byte j is dim
j + i D/4) or viewed as uint32 words [.., D/16] (four bytes at once: two bf16 lanes per 32-bit op).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jspec.int2.planes import code_plane, qparam_plane
from jspec.kernels.common import LN2, LOG2E, NEG, merge_lse
from jspec.kernels.reference import int2_attention_reference

try:  # the Triton backend module; absent or renamed in some jax builds
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # pragma: no cover
    pltriton = None

_MAGIC = 0x4080  # bf16 bits of 4.0; with code c in mantissa bits 5-6 the value is 4 + c
_OFFSET = 4.0


# ----------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------


def _bf16(bits16):
    return lax.bitcast_convert_type(bits16, jnp.bfloat16)


def _shl(x, n):
    return x << n if n >= 0 else x >> -n


def _plane_u8(codes, i: int):
    """[BT, D/4] uint8 -> quarter i as [BT, D/4] bf16 holding 4 + code."""
    return _bf16(((_shl(codes, 5 - 2 * i) & 0x60).astype(jnp.uint16)) | _MAGIC)


def _halves(x):
    """uint32 holding two bf16 -> (low, high) bf16."""
    return _bf16(x.astype(jnp.uint16)), _bf16((x >> 16).astype(jnp.uint16))


def _plane_u32(words, i: int):
    """[BT, D/16] uint32 -> quarter i as [BT, D/4] bf16 holding 4 + code.

    One 32-bit op places the codes of bytes 0 and 2 (or 1 and 3) of a word into two bf16 lanes; two
    nested 2-way stacks (tt.join) restore the byte order e0 e1 e2 e3.
    """
    BT, W = words.shape
    even = (_shl(words, 5 - 2 * i) & 0x00600060) | (_MAGIC * 0x10001)  # bytes 0, 2
    odd = ((words >> (3 + 2 * i)) & 0x00600060) | (_MAGIC * 0x10001)  # bytes 1, 3
    e0, e2 = _halves(even)
    e1, e3 = _halves(odd)
    quad = jnp.stack([jnp.stack([e0, e2], axis=-1), jnp.stack([e1, e3], axis=-1)], axis=-1)
    return quad.reshape(BT, 4 * W)


def _cdiv(a, b):
    return lax.div(a + b - 1, b)  # non-negative operands: truncating division is the floor


def _kernel(q_ref, kc_ref, ks_ref, kz_ref, vc_ref, vs_ref, vz_ref, lo_ref, hi_ref, o_ref, lse_ref, *,
            block_t: int, num_splits: int, sm_scale: float, aligned: bool):
    # q_ref [M, D] bf16 | kc_ref, vc_ref [T, D/4] uint8 or [T, D/16] uint32 | ks, kz, vs, vz [T]
    # lo_ref, hi_ref [M] int32 (INT2 key range per query row) | o_ref [M, D] f32 | lse_ref [M] f32
    M, D = q_ref.shape
    T, D4 = kc_ref.shape[0], D // 4
    f32 = jnp.float32
    plane = _plane_u8 if kc_ref.dtype == jnp.uint8 else _plane_u32
    lo, hi = lo_ref[...], hi_ref[...]
    scale2 = sm_scale * LOG2E  # scores in the log2 domain: exp2 is the native instruction

    # This split's share of the union of the rows' ranges, in whole blocks.
    nonempty = hi > lo
    first = jnp.min(jnp.where(nonempty, lo, T))
    last = jnp.max(jnp.where(nonempty, hi, 0))
    begin = lax.div(first, block_t) * block_t
    chunk = _cdiv(_cdiv(jnp.maximum(last - begin, 0), num_splits), block_t) * block_t
    start = begin + pl.program_id(2) * chunk
    n_blocks = _cdiv(jnp.clip(last - start, 0, chunk), block_t)

    qs = [q_ref[:, pl.ds(i * D4, D4)] for i in range(4)]  # 4 x [M, D/4] bf16
    qsum = sum(qi.astype(f32).sum(axis=1) for qi in qs)  # [M]

    def body(j, carry):
        m, l, zacc, *acc = carry
        s0 = start + j * block_t
        a = jnp.minimum(s0, T - block_t)  # last block is shifted back, never read out of bounds
        if aligned:
            a = pl.multiple_of(a, block_t)
        rows = pl.ds(a, block_t)
        ks = ks_ref[rows].astype(f32) * scale2  # per-token factors: [BT] work, not [M, BT]
        kzs = ks * (kz_ref[rows].astype(f32) + _OFFSET)
        kc = kc_ref[rows, :]
        # One quarter unpacked at a time, right before its dot: one code tile live, not four.
        qc = sum(jnp.dot(qs[i], plane(kc, i).T, preferred_element_type=f32) for i in range(4))  # [M, BT]
        s = qc * ks[None, :] - qsum[:, None] * kzs[None, :]
        pos = (a - jnp.maximum(lo, s0))[:, None] + jnp.arange(block_t)[None, :]  # >= 0: past lo and s0
        valid = (pos >= 0) & (pos < (hi - jnp.maximum(lo, s0))[:, None])
        s = jnp.where(valid, s, -jnp.inf)

        m_new = jnp.maximum(m, s.max(axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        vs, vz = vs_ref[rows].astype(f32), vz_ref[rows].astype(f32)
        # Round p*s to bf16 once and use the same rounded weights for the zero term: the error is
        # then a perturbation of the weights, not a cancellation between two large sums.
        ps = (p * vs[None, :]).astype(jnp.bfloat16)
        zacc = alpha * zacc + (ps.astype(f32) * (vz + _OFFSET)[None, :]).sum(axis=1)
        vc = vc_ref[rows, :]
        acc = [alpha[:, None] * acc[i] + jnp.dot(ps, plane(vc, i), preferred_element_type=f32) for i in range(4)]
        return (m_new, alpha * l + p.sum(axis=1), zacc, *acc)

    init = (jnp.full((M,), NEG, f32), jnp.zeros((M,), f32), jnp.zeros((M,), f32))
    init += tuple(jnp.zeros((M, D4), f32) for _ in range(4))
    m, l, zacc, *acc = lax.fori_loop(0, n_blocks, body, init)

    inv = 1.0 / jnp.where(l > 0, l, 1.0)
    for i in range(4):
        o_ref[:, pl.ds(i * D4, D4)] = (acc[i] - zacc[:, None]) * inv[:, None]
    lse_ref[...] = jnp.where(l > 0, (m + jnp.log2(jnp.where(l > 0, l, 1.0))) * LN2, -jnp.inf)


# ----------------------------------------------------------------------------------------------
# Wrapper
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """The kernel's tunables (a static argument of int2_attention: part of its compile key).

    block_t: tokens per loop step; min_rows: pad M up to this (a power of two; Triton accepts tiles under the
    16-row mma shape, and 4 rows + 1 warp beat 16 rows + 4 warps by 1.36x at n=1); block_m: rows per program at
    most; num_warps, num_stages: Triton launch; num_splits: splits of the history (None: splits_for_programs
    aims at about target_programs programs, B x Hkv x row tiles x splits), min_blocks: fewest loop steps per
    split."""

    block_t: int = 64
    min_rows: int = 4
    block_m: int = 64
    num_warps: int = 1
    num_stages: int = 3
    num_splits: int | None = None
    target_programs: int = 1056
    min_blocks: int = 4

    def __post_init__(self):
        pow2 = lambda x: x >= 1 and x & (x - 1) == 0
        if not (pow2(self.block_t) and self.block_t >= 16):
            raise ValueError(f"block_t {self.block_t}: a power of two >= 16 (Triton blocks)")
        if not (pow2(self.min_rows) and pow2(self.block_m)):
            raise ValueError(f"min_rows {self.min_rows}, block_m {self.block_m}: powers of two")
        if min(self.num_warps, self.num_stages, self.target_programs, self.min_blocks) < 1:
            raise ValueError(f"{self}: warps, stages, target programs and min blocks must be >= 1")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits {self.num_splits}: None or >= 1")


# Measured on the H200 (docs/kernels.md, v3: sweep at B=8, T=32K; splits at B=1, 32K/128K; repeats at
# B=8/32). Keyed by the query rows per KV head M: decode (M <= 8: GQA group x 1 position) and verification
# (K=4: 20 rows). target_programs 1056 vs 528: 1.3-1.5x at B=1, equal within 3% at B >= 8.
DECODE = TritonConfig()
VERIFY = TritonConfig(min_rows=16, num_warps=2)


def config_for(M: int, **overrides) -> TritonConfig:
    """The measured config for M query rows per KV head (DECODE up to 8 rows, else VERIFY), fields overridden."""
    return dataclasses.replace(DECODE if M <= 8 else VERIFY, **overrides)


def _pow2_at_least(x: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, (x - 1).bit_length()))


def splits_for_programs(B: int, programs: int, T: int, block_t: int, target: int = 1056, min_blocks: int = 4) -> int:
    """Splits of the history for about `target` programs in all (B x `programs` per batch row x splits, rounded
    up to a power of two), but at least min_blocks blocks of history per split."""
    want = _pow2_at_least(-(-target // max(1, B * programs)))
    return max(1, min(want, T // (min_blocks * block_t)))


def _compiler_params(num_warps: int, num_stages: int):
    cls = getattr(pltriton, "CompilerParams", None) or getattr(pltriton, "TritonCompilerParams", None)
    return None if cls is None else cls(num_warps=num_warps, num_stages=num_stages)


def as_words(codes):
    """uint8 [..., D/4] -> uint32 [..., D/16] (little-endian view; a storage option for the kernel)."""
    return lax.bitcast_convert_type(codes.reshape(*codes.shape[:-1], -1, 4), jnp.uint32)


@functools.partial(jax.jit, static_argnames=("config", "sm_scale", "words", "merge", "interpret"))
def int2_attention(q, codes, qparams, lo, hi, *, config: TritonConfig | None = None, sm_scale=None, words=True,
                   merge=True, interpret=False):
    """Attention of each query row over its INT2 key range.

    q: [B, Hkv, M, D] rotated queries (cast to bf16); codes: [B, Hkv, 2, T, D/4] uint8 (or [.., D/16]
    uint32, see as_words) and qparams: [B, Hkv, 4, T, D/G], planes as the cache lays them out
    (jspec.int2.planes: CODE_PLANES, QPARAM_PLANES; the kernel reads each plane in place); lo, hi: [B, M]
    int32, row m reads keys lo <= p < hi. Returns out [B, Hkv, M, D] f32 (normalised over the range; 0
    where empty) and lse [B, Hkv, M] f32 (-inf where empty). G < D falls back to
    int2_attention_reference. words: view uint8 codes as uint32 inside the jit (measured free on the
    H200) and unpack two codes per 32-bit op. config: the tunables (None: config_for(M), DECODE or VERIFY).
    merge=False returns the splits' partials unmerged, out [B, Hkv, splits, M, D] and lse [B, Hkv,
    splits, M], for a caller that merges them with partials of its own (merge_lse) in one pass.
    """
    B, H, M, D = q.shape
    T = codes.shape[3]
    if D % 64 or D & (D - 1):
        raise ValueError(f"head_dim {D} must be a power of two >= 64 (Triton dots need D/4 >= 16)")
    packed32 = codes.dtype == jnp.uint32
    if codes.shape != (B, H, 2, T, D // (16 if packed32 else 4)) or qparams.shape[:4] != (B, H, 4, T):
        raise ValueError(f"codes {codes.shape} / qparams {qparams.shape} do not match q {q.shape}")
    if lo.shape != (B, M) or hi.shape != (B, M):
        raise ValueError(f"lo/hi must be [B, M] = {(B, M)}, got {lo.shape}/{hi.shape}")
    sm_scale = D**-0.5 if sm_scale is None else sm_scale
    if words and codes.dtype == jnp.uint8:
        codes = as_words(codes)
    if qparams.shape[-1] != 1:  # G < D: per-group scales are not folded in the kernel
        out, lse = int2_attention_reference(q, codes, qparams, lo, hi, sm_scale=sm_scale)
        return (out, lse) if merge else (out[:, :, None], lse[:, :, None])

    cfg = config_for(M) if config is None else config
    # Rows: pad M to a power of two >= min_rows, then tile by block_m.
    Mp = _pow2_at_least(M, cfg.min_rows)
    bm = min(cfg.block_m, Mp)
    Mb = Mp // bm
    qp = jnp.pad(q.astype(jnp.bfloat16), ((0, 0), (0, 0), (0, Mp - M), (0, 0))).reshape(B, H * Mb, bm, D)
    lo_p = jnp.pad(lo.astype(jnp.int32), ((0, 0), (0, Mp - M))).reshape(B, Mb, bm)
    hi_p = jnp.pad(hi.astype(jnp.int32), ((0, 0), (0, Mp - M))).reshape(B, Mb, bm)  # padded rows: empty

    # Keys: a block never reads past T (see the kernel); tiny histories are padded up to one block.
    bt = cfg.block_t
    while bt > 16 and bt > T:
        bt //= 2
    if T < bt:
        padT = lambda x: jnp.pad(x, ((0, 0),) * 3 + ((0, bt - T),) + ((0, 0),) * (x.ndim - 4))
        codes, qparams = padT(codes), padT(qparams)
    Tp = codes.shape[3]
    ns = cfg.num_splits or splits_for_programs(B, H * Mb, Tp, bt, cfg.target_programs, cfg.min_blocks)

    kernel = functools.partial(_kernel, block_t=bt, num_splits=ns, sm_scale=float(sm_scale),
                               aligned=Tp % bt == 0)
    # Each plane of the cache's arrays is its own operand: the same buffer is passed once per plane and
    # the block spec picks the plane, so nothing is sliced or copied outside the kernel.
    code_spec = lambda plane: pl.BlockSpec((None, None, None, Tp, codes.shape[-1]),
                                           lambda b, h, s: (b, lax.div(h, Mb), plane, 0, 0))
    vec_spec = lambda plane: pl.BlockSpec((None, None, None, Tp), lambda b, h, s: (b, lax.div(h, Mb), plane, 0))
    row_spec = pl.BlockSpec((None, None, bm), lambda b, h, s: (b, lax.rem(h, Mb), 0))
    qv = qparams.reshape(B, H, 4, Tp)  # [.., T, 1] -> [.., T]: one scale per token
    # The kernel's operands kc, ks, kz, vc, vs, vz: planes of the cache's arrays, in kvcache's plane order.
    planes = [spec for kind in "kv" for spec in (code_spec(code_plane(kind)), vec_spec(qparam_plane(f"scale_{kind}")),
                                                   vec_spec(qparam_plane(f"zero_{kind}")))]
    out, lse = pl.pallas_call(
        kernel,
        grid=(B, H * Mb, ns),
        in_specs=[pl.BlockSpec((None, None, bm, D), lambda b, h, s: (b, h, 0, 0)), *planes, row_spec, row_spec],
        out_specs=[pl.BlockSpec((None, None, None, bm, D), lambda b, h, s: (b, h, s, 0, 0)),
                   pl.BlockSpec((None, None, None, bm), lambda b, h, s: (b, h, s, 0))],
        out_shape=[jax.ShapeDtypeStruct((B, H * Mb, ns, bm, D), jnp.float32),
                   jax.ShapeDtypeStruct((B, H * Mb, ns, bm), jnp.float32)],
        compiler_params=None if interpret else _compiler_params(cfg.num_warps, cfg.num_stages),
        interpret=interpret,
        name="int2_attention",
    )(qp, codes, qv, qv, codes, qv, qv, lo_p, hi_p)
    if not merge:  # [B, H*Mb, ns, bm, ..] -> [B, H, ns, M, ..]
        split_rows = lambda x: jnp.moveaxis(x.reshape(B, H, Mb, ns, bm, *x.shape[4:]), 3, 2).reshape(
            B, H, ns, Mp, *x.shape[4:])[:, :, :, :M]
        return split_rows(out), split_rows(lse)
    out, lse = merge_lse(out, lse, axis=2)  # [B, H*Mb, bm, D], [B, H*Mb, bm]
    return out.reshape(B, H, Mp, D)[:, :, :M], lse.reshape(B, H, Mp)[:, :, :M]
