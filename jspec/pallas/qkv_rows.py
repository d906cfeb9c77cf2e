"""A decode step's q, k and v in one Pallas (Triton) kernel per layer, with the Mosaic kernel's quantised queries.

What XLA ran as about six small kernels per layer of an 8B decode step (H200, benchmarks/NOTES.md session 20):
the R_K reduction (model.rotate, RoPE fused in), three slices copying q, k and v out of the fused QKV
projection for the Pallas calls, and prepare_imma's reduction and digit transpose. One program per (token, KV
head) reads the projection's g + 2 rows of its KV head as they lie and writes
- q [B*n, Hq, D] and k [B*n, Hkv, D]: the query heads' and the key's rows after the Qwen3 norms (if any), RoPE
  and R_K (if rotated), rounded to y's dtype after each step as model.qkv rounds them (its f32 product summed in
  another order: XLA's and this kernel's rows may differ by an ulp); v [B*n, Hkv, D] as it lies;
- with `prepare` (decode, n = 1): the lean8 body's quantised queries, digits [B, Hkv, N, 2D] uint8 and the row
  vectors colv [B, Hkv, 4, N] (s / 4, sum(q), lo, hi), as int2_mosaic_lean.prepare_imma makes them from q.
  Its gather of head dimensions into slots, the plane factors and the interleave of the two digits are one
  matrix of powers of two ([D, 2D], exact), so the quantiser works on the row as it will be stored.

Off by default (attention_split.FUSED_ROWS): on the H200 it is not yet faster. At B 1 / 128K (8B shape) the
program count is the number of KV heads (8), each reading R_K (64 KB) and the digit matrix (64 KB): 21 us per layer
with f32 dots in full precision, 11.6 us with bf16 tensor-core dots, against ~9 us for the XLA kernels it replaces
(benchmarks/NOTES.md, session 20).
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


def supported(g: int, D: int) -> bool:
    """Powers of two (Triton's block shapes) with g >= 4 query heads per KV head (the dot's rows), g <= 16 (the
    quantised rows' tile) and D >= 32."""
    pow2 = lambda x: x > 0 and x & (x - 1) == 0
    return pow2(g) and 4 <= g <= 16 and pow2(D) and D >= 32


@functools.cache
def digit_matrix(D: int) -> np.ndarray:
    """[D, 2D] f32 (powers of two and zeros: exact in bf16): row q (natural order) @ it = prepare_imma's v = q[dims] * 4 / factor, each slot twice, in the
    byte order of its digits (prepare_imma's transpose): column j holds slot k's value where byte j is a digit of k."""
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
    it = iter(refs)
    q_ref, k_ref, v_ref, cos_ref, sin_ref = (next(it) for _ in range(5))
    qn_ref, kn_ref = (next(it), next(it)) if norm else (None, None)
    rot_ref = next(it) if rot else None
    dm_ref, lohi_ref = (next(it), next(it)) if prep else (None, None)
    qo_ref, ko_ref, vo_ref = next(it), next(it), next(it)
    f32, bf16, H = jnp.float32, jnp.bfloat16, D // 2
    hi = lax.Precision.HIGHEST
    rnd = lambda x: x.astype(qo_ref.dtype).astype(f32)  # model.qkv's roundings: each step's output in y's dtype
    # bf16 rows: the products on the tensor cores in bf16, exact (R_K's values are bf16's, rotation.py), summed in
    # f32; f32 rows: f32 dots in full precision (Triton would use TF32)
    mm, prec = (bf16, None) if qo_ref.dtype == bf16 else (f32, hi)

    def turned(lo, up, w_ref):  # a row's halves [r, D/2] f32 -> norms, RoPE and R_K as model.qkv applies them
        if norm:
            inv = lax.rsqrt((jnp.sum(lo * lo, axis=1, keepdims=True) + jnp.sum(up * up, axis=1, keepdims=True)) / D
                            + eps)
            lo, up = (rnd(x * inv * w_ref[sl].astype(f32)[None, :]) for x, sl in ((lo, slice(0, H)), (up, slice(H, D))))
        lo, up = (rnd(lo * cos_ref[:H][None, :] + up * sin_ref[:H][None, :]),
                  rnd(up * cos_ref[H:][None, :] + lo * sin_ref[H:][None, :]))
        if not rot:
            return lo, up
        # R_K transposed, [D (out), D (in)] f32, in quarters: no value slices in Triton
        dot = lambda a, e, d: lax.dot_general(a.astype(mm), rot_ref[e, d].astype(mm), (((1,), (1,)), ((), ())),
                                              precision=prec, preferred_element_type=f32)
        first, second = slice(0, H), slice(H, D)
        return (rnd(dot(lo, first, first) + dot(up, first, second)),
                rnd(dot(lo, second, first) + dot(up, second, second)))

    qlo, qup = turned(q_ref[:, :H].astype(f32), q_ref[:, H:].astype(f32), qn_ref)  # [g, D/2] each
    k = lambda sl: jnp.broadcast_to(k_ref[sl].astype(f32)[None, :], (g, H))  # the key as g equal rows: the dot's tile
    klo, kup = turned(k(slice(0, H)), k(slice(H, D)), kn_ref)
    qo_ref[:, :H], qo_ref[:, H:] = qlo.astype(qo_ref.dtype), qup.astype(qo_ref.dtype)
    first = lax.broadcasted_iota(jnp.int32, (g, H), 0) == 0
    ko_ref[:H] = jnp.sum(jnp.where(first, klo, 0.0), axis=0).astype(ko_ref.dtype)  # row 0 (all rows are equal)
    ko_ref[H:] = jnp.sum(jnp.where(first, kup, 0.0), axis=0).astype(ko_ref.dtype)
    vo_ref[...] = v_ref[...]
    if not prep:
        return
    dg_ref, colv_ref = next(it), next(it)
    # q in bf16 (as prepare_imma quantises it) times powers of two, one per column: exact on the tensor cores
    qlo, qup = qlo.astype(bf16), qup.astype(bf16)
    v = (lax.dot(qlo, dm_ref[:H, :], preferred_element_type=f32)
         + lax.dot(qup, dm_ref[H:, :], preferred_element_type=f32))  # [g, 2D]
    qlo, qup = qlo.astype(f32), qup.astype(f32)
    big = jnp.max(jnp.abs(v), axis=1)
    s = jnp.where(big > 0, big / 32767.0, 1.0)
    fixed = _round_even(v / s[:, None])  # in [-32767, 32767]
    col = lax.broadcasted_iota(jnp.int32, (g, 2 * D), 1)
    dg_ref[:g, :] = jnp.where((col // 8) % 2 == 0, (fixed >> 8) & 255, fixed & 255).astype(jnp.uint8)
    N = dg_ref.shape[0]
    colv_ref[0, :g], colv_ref[1, :g] = s / 4.0, jnp.sum(qlo, axis=1) + jnp.sum(qup, axis=1)
    if N > g:  # padded rows, as prepare_imma pads q with zeros: no digits, s = 1, sum 0
        dg_ref[g:, :] = jnp.zeros((N - g, 2 * D), jnp.uint8)
        colv_ref[0, g:], colv_ref[1, g:] = jnp.full((N - g,), 0.25, f32), jnp.zeros((N - g,), f32)
    colv_ref[2:, :] = lohi_ref[...]


@functools.partial(jax.jit, static_argnames=("eps", "prepare", "interpret"))
def qkv_rows(y, cos, sin, rot_t=None, q_norm=None, k_norm=None, lohi=None, *, eps: float = 1e-6,
             prepare: bool = False, interpret: bool = False):
    """y [B, n, Hkv, g + 2, D] the QKV projection (bias added; model.Layer.wqkv's slots); cos, sin [B, n, D]
    (model.rope_tables); rot_t [Hkv, D, D] f32 (model.Layer.rot_k) or None; q_norm, k_norm [D] or None (Qwen3).

    Returns q [B, n, Hq, D], k and v [B, n, Hkv, D] in y.dtype, as model.qkv; with prepare (n = 1; lohi [B, 2, N]
    f32: each query row's history range, lo then hi, padded rows 0) also the Mosaic lean8 body's digits
    [B, Hkv, N, 2D] and colv [B, Hkv, 4, N] (int2_mosaic_lean.prepare_imma)."""
    B, n, Hkv, slots, D = y.shape
    g = slots - 2
    if not supported(g, D):
        raise ValueError(f"qkv_rows: g {g}, head_dim {D} not supported")
    norm, rot = q_norm is not None, rot_t is not None
    T = B * n
    y = y.reshape(T, Hkv, slots, D)
    row = lambda s: pl.BlockSpec((None, None, None, D), lambda i, h: (i, h, s, 0))
    vec = pl.BlockSpec((None, D), lambda i, h: (i, 0))
    in_specs = [pl.BlockSpec((None, None, g, D), lambda i, h: (i, h, 0, 0)), row(g), row(g + 1), vec, vec]
    args = [y, y, y, cos.reshape(T, D).astype(jnp.float32), sin.reshape(T, D).astype(jnp.float32)]
    if norm:
        in_specs += [pl.BlockSpec((D,), lambda i, h: (0,))] * 2
        args += [q_norm, k_norm]
    if rot:
        in_specs.append(pl.BlockSpec((None, D, D), lambda i, h: (h, 0, 0)))
        args.append(rot_t.astype(jnp.float32))
    one = pl.BlockSpec((None, None, D), lambda i, h: (i, h, 0))
    out_specs = [pl.BlockSpec((None, g, D), lambda i, h: (i, h, 0)), one, one]
    out_shape = [jax.ShapeDtypeStruct((T, Hkv * g, D), y.dtype)] + [jax.ShapeDtypeStruct((T, Hkv, D), y.dtype)] * 2
    if prepare:
        if n != 1:
            raise ValueError(f"qkv_rows: prepare is for decode (n = 1), got n = {n}")
        N = -(-g // 8) * 8
        if lohi is None or lohi.shape != (B, 2, N):
            raise ValueError(f"qkv_rows: lohi must be [B, 2, N] = {(B, 2, N)}")
        in_specs += [pl.BlockSpec((D, 2 * D), lambda i, h: (0, 0)), pl.BlockSpec((None, 2, N), lambda i, h: (i, 0, 0))]
        args += [jnp.asarray(digit_matrix(D), jnp.bfloat16), lohi.astype(jnp.float32)]
        out_specs += [pl.BlockSpec((None, None, N, 2 * D), lambda i, h: (i, h, 0, 0)),
                      pl.BlockSpec((None, None, 4, N), lambda i, h: (i, h, 0, 0))]
        out_shape += [jax.ShapeDtypeStruct((B, Hkv, N, 2 * D), jnp.uint8), jax.ShapeDtypeStruct((B, Hkv, 4, N), jnp.float32)]
    outs = pl.pallas_call(
        functools.partial(_kernel, g=g, D=D, eps=float(eps), norm=norm, rot=rot, prep=prepare),
        grid=(T, Hkv),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=WARPS, num_stages=1),
        interpret=interpret,
        name="qkv_rows",
    )(*args)
    q, k, v = outs[0].reshape(B, n, Hkv * g, D), outs[1].reshape(B, n, Hkv, D), outs[2].reshape(B, n, Hkv, D)
    return (q, k, v, *outs[3:]) if prepare else (q, k, v)
