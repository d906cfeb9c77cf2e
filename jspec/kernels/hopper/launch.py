"""What the Mosaic INT2 kernel's bodies (decode.py, verify.py) share at launch: the scratch of the TMA ring and the
partials, the lowering parameters, the grid of (KV head, split) CTAs, and the plane factors of the value rows.
Imports and traces without a GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jspec.kernels.hopper.prepare import ROW_BYTES
from jspec.kernels.hopper.ptx import plgpu


def launch(kernel, q, colv, sched, cod, par, *, raw_shape: tuple, D: int, BT: int, stages: int, scratch: dict,
           auto_barriers: bool):
    """Runs a body's kernel on the grid (KV head bh, split): one CTA of one warpgroup per split of each KV head.

    q [BH, ...] (the body's queries, copied whole into q_smem unless scratch gives q_smem a layout), colv
    [BH, 4, N] f32 (row vectors), sched [B, splits, 4] int32, cod and par (prepare.ring_inputs). raw_shape: one
    split's raw partial (the body's layout, f32); scratch: the body's own shared memory beside the ring's and the
    partials' (kernel keywords); auto_barriers: whether Pallas puts a warpgroup barrier before each TMA copy (off
    where the body orders its shared memory itself). Returns raw [BH, splits, *raw_shape], stats [BH, splits, 4, N]."""
    BH, N, ns = q.shape[0], colv.shape[-1], sched.shape[1]
    f32 = jnp.float32
    ring = dict(q_smem=plgpu.SMEM(q.shape[1:], q.dtype),
                colv_smem=plgpu.SMEM((4, N), f32),
                c_smem=plgpu.SMEM((stages, 2, BT // (ROW_BYTES // (D // 4)), ROW_BYTES), jnp.uint8),
                p_smem=plgpu.SMEM((stages, 4, BT), par.dtype),
                o_smem=plgpu.SMEM(raw_shape, f32),
                st_smem=plgpu.SMEM((4, N), f32),
                bars=plgpu.Barrier(num_arrivals=2, num_barriers=stages),  # two copies per block: codes, scales
                q_bar=plgpu.Barrier(num_arrivals=2))  # queries, row vectors
    params = plgpu.CompilerParams(approx_math=False, lowering_semantics=plgpu.LoweringSemantics.Lane,
                                  unsafe_no_auto_barriers=not auto_barriers)
    out_type = (jax.ShapeDtypeStruct((BH, ns, *raw_shape), f32), jax.ShapeDtypeStruct((BH, ns, 4, N), f32))
    return plgpu.kernel(kernel, out_type=out_type, scratch_types={**ring, **scratch}, grid=(BH, ns),
                        grid_names=("bh", "split"), compiler_params=params,
                        kernel_name="int2_attention_mosaic")(q, colv, sched, cod, par)


def value_factors(slots) -> np.ndarray:
    """[D] f32: 1 / the plane factor of each head dimension's value row, from a body's value_slots(D) = (dim,
    factor) per row (exact: powers of two)."""
    dims, factor = slots
    return (1.0 / factor[np.argsort(dims)]).astype(np.float32)
