"""The residual add and the RMS norm that reads it, in one Pallas (Triton) kernel for decode and verification rows.

XLA runs them as three kernels per norm: the add, the norm's sum of squares (a reduction) and its scaling (XLA
fuses no elementwise consumer of a reduction's result into the reduction). At batch 1 they took 1.5 + 1.7 + 1.45
us per norm, 64 norms per 8B step (H200, a profile: docs/kernels.md). Here one program per row writes s = x + y (in
x's dtype, as XLA rounds it) and h = s * rsqrt(mean(s * s) + eps) * w (f32 inside, h in x's dtype): the numbers
of model.add_rms_norm's XLA path but for the order of the sum of squares.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

MAX_ROWS = 512  # rows (tokens) per call at most: decode and verification; a prefill stays in XLA
WARPS = 4


def supported(rows: int, E: int) -> bool:
    """Whether the kernel takes rows of E features: E a power of two (a Triton block), 16 to 16384."""
    return rows <= MAX_ROWS and E & (E - 1) == 0 and 16 <= E <= 16384


def _kernel(layer_ref, x_ref, y_ref, w_ref, s_ref, h_ref, *, eps: float, stacked: bool):
    # layer_ref [1] int32 | x_ref, y_ref [E] | w_ref [E], or with stacked the whole [L, E] stack of which row layer
    # is this norm's | s_ref, h_ref [E]: the sum and its norm
    f32 = jnp.float32
    s = (x_ref[...].astype(f32) + y_ref[...].astype(f32)).astype(s_ref.dtype)
    s_ref[...] = s
    w = w_ref[layer_ref[0], :] if stacked else w_ref[...]
    sf = s.astype(f32)
    r = lax.rsqrt(jnp.mean(sf * sf) + eps)
    h_ref[...] = (sf * r * w.astype(f32)).astype(h_ref.dtype)


@functools.partial(jax.jit, static_argnames=("eps", "interpret"))
def add_norm(x, y, w, layer=None, *, eps: float, interpret: bool = False):
    """x [..., E] the residual, y like x -> (s = x + y, rms_norm(s, w)), both like x. w [E], or with layer (an int32
    scalar) the [L, E] stack of a stacked model, read in place at that layer."""
    E = x.shape[-1]
    rows = x.reshape(-1, E)
    R = rows.shape[0]
    if not supported(R, E):
        raise ValueError(f"add_norm: {R} rows of {E} features not supported")
    row = pl.BlockSpec((None, E), lambda r: (r, 0))
    s, h = pl.pallas_call(
        functools.partial(_kernel, eps=float(eps), stacked=layer is not None),
        grid=(R,),
        in_specs=[pl.BlockSpec((1,), lambda r: (0,)), row, row, pl.BlockSpec(w.shape, lambda r: (0,) * w.ndim)],
        out_specs=[row, row],
        out_shape=[jax.ShapeDtypeStruct(rows.shape, x.dtype)] * 2,
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=WARPS, num_stages=1),
        interpret=interpret,
        name="add_norm",
    )(jnp.reshape(jnp.asarray(0 if layer is None else layer, jnp.int32), (1,)), rows, y.reshape(R, E), w)
    return s.reshape(x.shape), h.reshape(x.shape)
