"""x @ w[layer] for a stacked model's [L, K, N] weights, read in place, in one Pallas (Triton) kernel for few rows.

Inside the scan over stacked layers XLA runs each GEMM as a cuBLAS call that the dynamic-slice fusion hands an address
in the stack; XLA does not autotune those calls, and each contraction runs whole. Unrolled, XLA's Triton GEMMs split
the 8B shape's contractions 4-8 ways at decode's rows (session 23's HLO): 0.26-0.37 ms per 8B step between the two.
Here a grid of (N / bn column blocks) x (splits of K) programs each stream a [K / splits, bn] slab of the layer's
weights past the rows (padded to 16, tl.dot's least), writing f32 partial products [splits, M, N]. The caller sums
the partials where it reads them (`sum_parts`: adds that fuse into their consumer, or the add_norm kernel).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

MAX_ROWS = 64  # decode and verification; a prefill's GEMMs stay in XLA (cuBLAS, compute-bound)


class Tiling(NamedTuple):
    """A program's columns (bn), its contraction tile (bk), the splits of K, and Triton's warps and stages."""
    bn: int
    bk: int
    splits: int
    warps: int = 4
    stages: int = 3


def tiling(K: int, N: int) -> Tiling:
    """The default tiling: 128 columns a program, K split until some 2 programs per H200 SM (132) stream at once,
    each split at least 4 tiles of 64 deep."""
    bn, bk = 128, 64
    splits = 1
    while N // bn * splits < 264 and K % (2 * splits * bk) == 0 and K // (2 * splits) >= 4 * bk:
        splits *= 2
    return Tiling(bn, bk, splits)


def supported(M: int, K: int, N: int, t: Tiling | None = None) -> bool:
    bn, bk, splits = (t or tiling(K, N))[:3]
    return M <= MAX_ROWS and N % bn == 0 and K % (splits * bk) == 0


def _kernel(layer_ref, x_ref, w_ref, o_ref, *, bn: int, bk: int, steps: int):
    # layer_ref [1] int32 | x_ref [Mp, K] the rows | w_ref [L, K, N] the whole stack | o_ref [Mp, bn]: this program's
    # partial product over its split of K (steps tiles of bk) for columns n * bn ..< (n + 1) * bn. The weights are
    # the product's left operand (w^T x^T, as XLA's Triton GEMMs order it): bn columns on the MMA's M side, the few
    # rows on its N side.
    n, s = pl.program_id(0), pl.program_id(1)
    layer = layer_ref[0]
    cols = pl.ds(pl.multiple_of(n * bn, bn), bn)

    def step(t, acc):
        k0 = pl.multiple_of((s * steps + t) * bk, bk)
        w, x = w_ref[layer, pl.ds(k0, bk), cols], x_ref[:, pl.ds(k0, bk)]
        return acc + jnp.dot(w.T, x.T, preferred_element_type=jnp.float32)

    o_ref[...] = lax.fori_loop(0, steps, step, jnp.zeros(o_ref.shape[::-1], jnp.float32)).T


@functools.partial(jax.jit, static_argnames=("t", "interpret"))
def matmul_parts(x, w, layer, t: Tiling | None = None, *, interpret: bool = False):
    """x [..., K] and the stack w [L, K, ...] (trailing axes flattened to N) -> f32 partial products [splits, ...,
    N-shaped tail] of x @ w[layer], layer an int32 scalar: sum them over the first axis (sum_parts) for the product."""
    K, L = x.shape[-1], w.shape[0]
    lead, tail = x.shape[:-1], w.shape[2:]
    N = math.prod(tail)
    rows = x.reshape(-1, K)
    M = rows.shape[0]
    t = t or tiling(K, N)
    bn, bk, splits, warps, stages = t
    if not supported(M, K, N, t):
        raise ValueError(f"stacked_matmul: {M} rows x [{K}, {N}] not supported by tiling {tuple(t)}")
    Mp = max(16, 1 << (M - 1).bit_length())
    rows = jnp.pad(rows, ((0, Mp - M), (0, 0)))
    parts = pl.pallas_call(
        functools.partial(_kernel, bn=bn, bk=bk, steps=K // (splits * bk)),
        grid=(N // bn, splits),
        in_specs=[pl.BlockSpec((1,), lambda n, s: (0,)), pl.BlockSpec((Mp, K), lambda n, s: (0, 0)),
                  pl.BlockSpec((L, K, N), lambda n, s: (0, 0, 0))],
        out_specs=pl.BlockSpec((None, Mp, bn), lambda n, s: (s, 0, n)),
        out_shape=jax.ShapeDtypeStruct((splits, Mp, N), jnp.float32),
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=warps, num_stages=stages),
        interpret=interpret,
        name="stacked_matmul",
    )(jnp.reshape(layer, (1,)).astype(jnp.int32), rows, w.reshape(L, K, N))
    return parts[:, :M].reshape(splits, *lead, *tail)


def sum_parts(parts, dtype):
    """The product from matmul_parts' partials, in dtype: written as adds (not a reduction) so that XLA fuses them
    into the elementwise ops that read the product, where a reduction would be a kernel of its own."""
    return functools.reduce(jnp.add, list(parts)).astype(dtype)


def matmul(x, w, layer, t: Tiling | None = None, *, interpret: bool = False):
    """x [..., K] @ w[layer] in x's dtype (f32 accumulation), for the stack w [L, K, ...]."""
    return sum_parts(matmul_parts(x, w, layer, t, interpret=interpret), x.dtype)
