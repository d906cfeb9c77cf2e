"""A residual add and the RMSNorm of its sum as one Pallas (Triton) kernel: (x + y, rms_norm(x + y, w)).

In a decode step XLA runs them as three small kernels (the add, a reduction to one f32 per row, and the
normalising convert: session 14's HLO of the 8B step, benchmarks/NOTES.md); at batch 1 each is a launch of
a few microseconds over 8 KB. Here one program per row (batch x token) does all three, in f32, the sum
rounded to x.dtype first as XLA's add is. Opt-in (model.FUSED_ADD_NORM) until measured on the GPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


def supported(E: int) -> bool:
    """Whether the kernel takes rows of E: a power of two (Triton's block shapes), 16 or more."""
    return E >= 16 and E & (E - 1) == 0


def add_rms_norm_reference(x, y, w, eps: float):
    """(x + y, rms_norm(x + y, w, eps)) in jnp, as model.add_norm runs it without the kernel."""
    s = x + y
    sf = s.astype(jnp.float32)
    h = sf * lax.rsqrt(jnp.mean(sf * sf, axis=-1, keepdims=True) + eps) * w.astype(jnp.float32)
    return s, h.astype(x.dtype)


def _kernel(x_ref, y_ref, w_ref, s_ref, h_ref, *, eps: float):
    # x_ref, y_ref [E] one row | w_ref [E] the norm's weight | s_ref, h_ref [E] the sum and its norm
    f32 = jnp.float32
    s = (x_ref[...].astype(f32) + y_ref[...].astype(f32)).astype(s_ref.dtype)
    s_ref[...] = s
    sf = s.astype(f32)
    h = sf * lax.rsqrt(jnp.mean(sf * sf) + eps) * w_ref[...].astype(f32)
    h_ref[...] = h.astype(h_ref.dtype)


@functools.partial(jax.jit, static_argnames=("eps", "interpret"))
def add_rms_norm(x, y, w, eps: float, *, interpret: bool = False):
    """x, y [..., E] of one dtype, w [E] -> (x + y, rms_norm(x + y, w, eps)), both in x.dtype."""
    E = x.shape[-1]
    if not supported(E) or y.shape != x.shape or w.shape != (E,):
        raise ValueError(f"add_rms_norm: x {x.shape}, y {y.shape}, w {w.shape} (E a power of two >= 16)")
    rows = x.reshape(-1, E)
    row = pl.BlockSpec((None, E), lambda r: (r, 0))
    s, h = pl.pallas_call(
        functools.partial(_kernel, eps=float(eps)),
        grid=(rows.shape[0],),
        in_specs=[row, row, pl.BlockSpec((E,), lambda r: (0,))],
        out_specs=[row, row],
        out_shape=[jax.ShapeDtypeStruct(rows.shape, x.dtype)] * 2,
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=4 if E <= 4096 else 8,
                                                                         num_stages=1),
        interpret=interpret,
        name="add_rms_norm",
    )(rows, y.reshape(-1, E), w)
    return s.reshape(x.shape), h.reshape(x.shape)
