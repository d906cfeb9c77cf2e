"""A decode step's q, k and v in one Pallas (Triton) kernel per layer, with the Mosaic kernel's quantised queries.

What XLA ran as about six small kernels per layer of an 8B decode step (H200, benchmarks/NOTES.md session 20):
the R_K reduction (model.rotate, RoPE fused in), three slices copying q, k and v out of the fused QKV
projection for the Pallas calls, and prepare_imma's reduction and digit transpose. One program per (token, KV
head) reads the projection's g + 2 rows of its KV head as they lie and writes
- q [B*n, Hq, D] and k [B*n, Hkv, D]: the query heads' and the key's rows after the Qwen3 norms (if any), RoPE
  and R_K (if rotated), rounded to y's dtype after each step as model.turn rounds them (its f32 product summed in
  another order: XLA's and this kernel's rows may differ by an ulp); v [B*n, Hkv, D] as it lies;
- with `prepare` (decode, n = 1): the lean8 body's quantised queries, digits [B, Hkv, N, 2D] uint8 and the row
  vectors colv [B, Hkv, 4, N] (s / 4, sum(q), lo, hi), as int2_mosaic_lean.prepare_imma makes them from q.
  Its gather of head dimensions into slots, the plane factors and the interleave of the two digits are one
  matrix of powers of two ([D, 2D], exact), so the quantiser works on the row as it will be stored.
Its reference, where the semantics live: model.turn, then int2_mosaic_lean.prepare_imma (tests/test_qkv_rows.py).

Off by default (attention_split.FUSED_ROWS; its "rows" leaves out the quantised queries): on the H200 it is not
yet faster. At B 1 / 128K (8B shape) there are as many programs as KV heads (8), each reading R_K (64 KB) and the
digit matrix (64 KB): 21 us per layer with f32 dots in full precision, 11.6 us with bf16 tensor-core dots, against
~9 us for the XLA kernels it replaces (benchmarks/NOTES.md, session 20). `split` and `warps` are there to find out
where that time goes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

WARPS = 4
SPLIT = 1  # programs per (token, KV head) where the call may split its columns (qkv_rows' split=None)


def supported(g: int, D: int) -> bool:
    """Powers of two (Triton's block shapes) with g >= 4 query heads per KV head (the dot's rows), g <= 16 (the
    quantised rows' tile) and D >= 32."""
    pow2 = lambda x: x > 0 and x & (x - 1) == 0
    return pow2(g) and 4 <= g <= 16 and pow2(D) and D >= 32


@functools.cache
def digit_matrix(D: int) -> np.ndarray:
    """[D, 2D] f32, powers of two and zeros (exact in bf16): a row q in head dimension order @ it = prepare_imma's
    v = q[dims] * 4 / factor with each slot twice, in the byte order of its digits (prepare_imma's transpose):
    column j holds slot k's value where byte j is a digit of k."""
    from jspec.pallas.int2_mosaic_lean import imma_slots

    dims, factor = imma_slots(D)
    slot = np.broadcast_to(np.arange(D)[:, None], (D, 2)).reshape(1, 1, 1, D // 32, 2, 4, 4, 2)
    slot = slot.transpose(0, 1, 2, 5, 3, 7, 4, 6).reshape(2 * D)  # prepare_imma's transpose, on slot numbers
    m = np.zeros((D, 2 * D), np.float32)
    m[dims[slot], np.arange(2 * D)] = 4.0 / factor[slot]
    return m


def _round_even(x):
    """jnp.round (ties to even) as int32 for |x| < 2^22, from floor: Pallas has no Triton lowering of round, and
    XLA folds the magic-number form (x + 1.5 * 2^23) - 1.5 * 2^23 to x."""
    r = jnp.floor(x + 0.5)  # exact: x + 0.5 needs no rounding at these magnitudes
    i = r.astype(jnp.int32)
    return jnp.where((r - x == 0.5) & ((i & 1) == 1), i - 1, i)


def _kernel(*refs, g: int, D: int, eps: float, norm: bool, rot: bool, prep: bool):
    # One program per (token, KV head, column block c): with R_K, rows c of rot_ref give the output columns of
    # block c, the norms and RoPE computed whole by every program. C = D / split columns.
    # q_ref [g, D], k_ref [D] (slot g), v_ref [C] (slot g + 1): the projection's rows | cos_ref, sin_ref [D]
    # qn_ref, kn_ref [D] (norm) | rot_ref [C, D] f32 or bf16: R_K transposed, rows of block c (rot)
    # dm_ref [D, 2D] bf16: digit_matrix | lohi_ref [2, N] f32 (prep)
    # qo_ref [g, C], ko_ref [C], vo_ref [C] | dg_ref [N, 2D] uint8, colv_ref [4, N] f32 (prep)
    it = iter(refs)
    q_ref, k_ref, v_ref, cos_ref, sin_ref = (next(it) for _ in range(5))
    qn_ref, kn_ref = (next(it), next(it)) if norm else (None, None)
    rot_ref = next(it) if rot else None
    dm_ref, lohi_ref = (next(it), next(it)) if prep else (None, None)
    qo_ref, ko_ref, vo_ref = next(it), next(it), next(it)
    f32, bf16, H = jnp.float32, jnp.bfloat16, D // 2
    rnd = lambda x: x.astype(qo_ref.dtype).astype(f32)  # model.qkv's roundings: each step's output in y's dtype
    # bf16 rows: the products on the tensor cores in bf16, exact (R_K's values are bf16's, rotation.py), summed in
    # f32; f32 rows: f32 dots in full precision (Triton would use TF32)
    mm, prec = (bf16, None) if qo_ref.dtype == bf16 else (f32, lax.Precision.HIGHEST)

    def turned(lo, up, w_ref):  # a row's halves [r, D/2] f32 -> norms and RoPE as model.qkv applies them
        if norm:
            inv = lax.rsqrt((jnp.sum(lo * lo, axis=1, keepdims=True) + jnp.sum(up * up, axis=1, keepdims=True)) / D
                            + eps)
            lo, up = (rnd(x * inv * w_ref[sl].astype(f32)[None, :]) for x, sl in ((lo, slice(0, H)), (up, slice(H, D))))
        return (rnd(lo * cos_ref[:H][None, :] + up * sin_ref[:H][None, :]),
                rnd(up * cos_ref[H:][None, :] + lo * sin_ref[H:][None, :]))

    def rotated(lo, up):  # -> [r, D / split]: this block's columns after R_K (no value slices in Triton: two dots)
        dot = lambda a, d: lax.dot_general(a.astype(mm), rot_ref[:, d].astype(mm), (((1,), (1,)), ((), ())),
                                           precision=prec, preferred_element_type=f32)
        return rnd(dot(lo, slice(0, H)) + dot(up, slice(H, D)))

    q = turned(q_ref[:, :H].astype(f32), q_ref[:, H:].astype(f32), qn_ref)  # halves [g, D/2]
    k = lambda sl: jnp.broadcast_to(k_ref[sl].astype(f32)[None, :], (g, H))  # the key as g equal rows: the dot's tile
    k = turned(k(slice(0, H)), k(slice(H, D)), kn_ref)
    first = lambda x: jnp.sum(jnp.where(lax.broadcasted_iota(jnp.int32, x.shape, 0) == 0, x, 0.0), axis=0)  # row 0
    if rot:
        q, k = rotated(*q), rotated(*k)
        qo_ref[...], ko_ref[...] = q.astype(qo_ref.dtype), first(k).astype(ko_ref.dtype)
    else:
        qo_ref[:, :H], qo_ref[:, H:] = q[0].astype(qo_ref.dtype), q[1].astype(qo_ref.dtype)
        ko_ref[:H], ko_ref[H:] = first(k[0]).astype(ko_ref.dtype), first(k[1]).astype(ko_ref.dtype)
    vo_ref[...] = v_ref[...]
    if not prep:
        return
    dg_ref, colv_ref = next(it), next(it)
    # q in bf16 (as prepare_imma quantises it) times powers of two, one per column: exact on the tensor cores
    dot = lambda a, b: lax.dot(a.astype(bf16), b, preferred_element_type=f32)
    v = dot(q, dm_ref[...]) if rot else dot(q[0], dm_ref[:H, :]) + dot(q[1], dm_ref[H:, :])  # [g, 2D]
    big = jnp.max(jnp.abs(v), axis=1)
    s = jnp.where(big > 0, big / 32767.0, 1.0)
    fixed = _round_even(v / s[:, None])  # in [-32767, 32767]
    col = lax.broadcasted_iota(jnp.int32, (g, 2 * D), 1)
    dg_ref[:g, :] = jnp.where((col // 8) % 2 == 0, (fixed >> 8) & 255, fixed & 255).astype(jnp.uint8)
    N = dg_ref.shape[0]
    qb = lambda x: jnp.sum(x.astype(bf16).astype(f32), axis=1)
    colv_ref[0, :g], colv_ref[1, :g] = s / 4.0, qb(q) if rot else qb(q[0]) + qb(q[1])
    if N > g:  # padded rows, as prepare_imma pads q with zeros: no digits, s = 1, sum 0
        dg_ref[g:, :] = jnp.zeros((N - g, 2 * D), jnp.uint8)
        colv_ref[0, g:], colv_ref[1, g:] = jnp.full((N - g,), 0.25, f32), jnp.zeros((N - g,), f32)
    colv_ref[2:, :] = lohi_ref[...]


@functools.partial(jax.jit, static_argnames=("eps", "prepare", "interpret", "warps", "split"))
def qkv_rows(y, cos, sin, rot_t=None, q_norm=None, k_norm=None, lohi=None, *, eps: float = 1e-6,
             prepare: bool = False, interpret: bool = False, warps: int | None = None, split: int | None = None):
    """y [B, n, Hkv, g + 2, D] the QKV projection (bias added; model.Layer.wqkv's slots); cos, sin [B, n, D]
    (model.rope_tables); rot_t [Hkv, D, D] (model.Layer.rot_k: f32; bf16 taken too) or None; q_norm, k_norm [D]
    or None (Qwen3). warps: Triton's warps per program (None: WARPS). split: programs per (token, KV head), each
    writing D / split columns from its rows of R_K (with R_K and without prepare, whose quantiser needs whole
    rows; None: SPLIT where that holds, else 1).

    Returns q [B, n, Hq, D], k and v [B, n, Hkv, D] in y.dtype, as model.qkv; with prepare (n = 1; lohi [B, 2, N]
    f32: each query row's history range, lo then hi, padded rows 0) also the Mosaic lean8 body's digits
    [B, Hkv, N, 2D] and colv [B, Hkv, 4, N] (int2_mosaic_lean.prepare_imma)."""
    B, n, Hkv, slots, D = y.shape
    g = slots - 2
    if not supported(g, D):
        raise ValueError(f"qkv_rows: g {g}, head_dim {D} not supported")
    norm, rot = q_norm is not None, rot_t is not None
    split = split or (SPLIT if rot and not prepare else 1)
    if split != 1 and (not rot or prepare or D % split or (D // split) < 16):
        raise ValueError(f"qkv_rows: split {split} needs R_K, no prepare and D / split >= 16 (D {D})")
    T = B * n
    y = y.reshape(T, Hkv, slots, D)
    C = D // split  # columns per program
    vec = pl.BlockSpec((None, D), lambda i, h, c: (i, 0))
    in_specs = [pl.BlockSpec((None, None, g, D), lambda i, h, c: (i, h, 0, 0)),
                pl.BlockSpec((None, None, None, D), lambda i, h, c: (i, h, g, 0)),
                pl.BlockSpec((None, None, None, C), lambda i, h, c: (i, h, g + 1, c)), vec, vec]
    args = [y, y, y, cos.reshape(T, D).astype(jnp.float32), sin.reshape(T, D).astype(jnp.float32)]
    if norm:
        in_specs += [pl.BlockSpec((D,), lambda i, h, c: (0,))] * 2
        args += [q_norm, k_norm]
    if rot:
        in_specs.append(pl.BlockSpec((None, C, D), lambda i, h, c: (h, c, 0)))
        args.append(rot_t)
    one = pl.BlockSpec((None, None, C), lambda i, h, c: (i, h, c))
    out_specs = [pl.BlockSpec((None, g, C), lambda i, h, c: (i, h, c)), one, one]
    out_shape = [jax.ShapeDtypeStruct((T, Hkv * g, D), y.dtype)] + [jax.ShapeDtypeStruct((T, Hkv, D), y.dtype)] * 2
    if prepare:
        if n != 1:
            raise ValueError(f"qkv_rows: prepare is for decode (n = 1), got n = {n}")
        N = -(-g // 8) * 8
        if lohi is None or lohi.shape != (B, 2, N):
            raise ValueError(f"qkv_rows: lohi must be [B, 2, N] = {(B, 2, N)}")
        in_specs += [pl.BlockSpec((D, 2 * D), lambda i, h, c: (0, 0)),
                     pl.BlockSpec((None, 2, N), lambda i, h, c: (i, 0, 0))]
        args += [jnp.asarray(digit_matrix(D), jnp.bfloat16), lohi.astype(jnp.float32)]
        out_specs += [pl.BlockSpec((None, None, N, 2 * D), lambda i, h, c: (i, h, 0, 0)),
                      pl.BlockSpec((None, None, 4, N), lambda i, h, c: (i, h, 0, 0))]
        out_shape += [jax.ShapeDtypeStruct((B, Hkv, N, 2 * D), jnp.uint8),
                      jax.ShapeDtypeStruct((B, Hkv, 4, N), jnp.float32)]
    outs = pl.pallas_call(
        functools.partial(_kernel, g=g, D=D, eps=float(eps), norm=norm, rot=rot, prep=prepare),
        grid=(T, Hkv, split),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=warps or WARPS, num_stages=1),
        interpret=interpret,
        name="qkv_rows",
    )(*args)
    q, k, v = outs[0].reshape(B, n, Hkv * g, D), outs[1].reshape(B, n, Hkv, D), outs[2].reshape(B, n, Hkv, D)
    return (q, k, v, *outs[3:]) if prepare else (q, k, v)
