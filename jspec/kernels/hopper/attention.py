"""Split-K attention over the OSCAR INT2 history on Hopper (Pallas Mosaic GPU): the entry point.

Same contract as int2_triton.int2_attention (rows [B, H, M, D], the cache's codes and qparams, per-row INT2 key
ranges [lo, hi)), built for the H200's tensor cores instead of Triton's small dots. One body per use, each with
its tunables in a frozen config:
- decode (decode.py, DecodeConfig): up to DECODE_MAX_ROWS query rows per KV head; per-warp mma.sync with an
  8-bit integer score product, a lazy max, ring slots released through mbarriers;
- verification (verify.py, VerifyConfig): more rows; wgmma with the tokens as M, a lop3 unpack, the range mask
  in edge blocks only.
The bodies were chosen as the fastest measured on the H200 (docs/kernels.md); the alternatives measured
against them are on the branch kernel-experiments. prepare.py builds the host-side inputs, ptx.py holds the
inline code both share. The reference both are tested against is jspec.kernels.reference.int2_attention_reference.

Mosaic GPU has no interpret mode: on CPU (and GPUs without wgmma) use the Triton kernel or the reference; this
module only imports and traces there (the tests lower it for CUDA on the CPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jspec.kernels.common import LN2, LOG2E, RAW_OFFSET, merge_lse
from jspec.kernels.hopper import decode, verify
from jspec.kernels.hopper.decode import DECODE_MAX_ROWS, DecodeConfig
from jspec.kernels.hopper.launch import value_factors
from jspec.kernels.hopper.ptx import plgpu
from jspec.kernels.hopper.verify import VerifyConfig
from jspec.kernels.reference import int2_attention_reference

__all__ = ["DECODE_MAX_ROWS", "MAX_ROWS", "DecodeConfig", "VerifyConfig", "available", "finish",
           "int2_attention_mosaic"]

# Query rows per KV head (GQA group x query positions) one call takes: they are wgmma's N, and Q', W and
# the f32 output tile grow with them in shared memory (about 0.9 KB per row: 256 rows asked 258 KB of the
# H200's 227 KB, measured). Decode and verify (K <= 16) have a few dozen; a longer prefill chunk goes to
# the Triton kernel (attention.split).
MAX_ROWS = 128


def available() -> bool:
    """Whether this jax has Mosaic GPU and the default device can run it (wgmma: compute capability 9.x; a CPU
    device has no compute capability)."""
    if plgpu is None:
        return False
    cc = getattr(jax.devices()[0], "compute_capability", "0")
    return str(cc).split(".")[0] == "9"


@functools.partial(jax.jit, static_argnames=("config", "sm_scale", "merge"))
def int2_attention_mosaic(q, codes, qparams, lo, hi, *, config: DecodeConfig | VerifyConfig | None = None,
                          sm_scale=None, merge=True):
    """int2_attention on Hopper: same arguments and results (see int2_triton.int2_attention).

    q [B, H, M, D]; codes [B, H, 2, T, D/4] uint8; qparams [B, H, 4, T, 1] (bf16 or f32); lo, hi [B, M] int32.
    Returns out [B, H, M, D] f32 and lse [B, H, M] (merge=True) or the splits' partials out [B, H, splits, M, D],
    lse [B, H, splits, M] (merge=False). merge="raw": the decode body's partials as the kernel leaves them, raw
    [B, H, splits, N, D], stats [B, H, splits, 4, N] and value factors [D], for window_merge to finish them itself
    (two XLA kernels fewer per layer); from the verification body, as merge=False.
    config: the body and its tunables, DecodeConfig() or VerifyConfig() (None: DecodeConfig() for up to
    DECODE_MAX_ROWS rows, M rounded up to 8, else VerifyConfig()).
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
        return (out, lse) if merge is True else (out[:, :, None], lse[:, :, None])  # "raw": as False

    if config is None:
        config = DecodeConfig() if -(-M // 8) * 8 <= DECODE_MAX_ROWS else VerifyConfig()
    scale2 = float(sm_scale) * LOG2E
    if isinstance(config, DecodeConfig):
        raw, stats = decode.decode_attention(q, codes, qparams, lo, hi, config=config, scale2=scale2)
        if merge == "raw":
            return raw, stats, value_factors(decode.value_slots(D))
        out, lse = finish(raw, stats, M, decode_layout=True)
    else:
        raw, stats = verify.verify_attention(q, codes, qparams, lo, hi, config=config, scale2=scale2)
        out, lse = finish(raw, stats, M, decode_layout=False)
    return merge_lse(out, lse, axis=2) if merge is True else (out, lse)


@functools.partial(jax.jit, static_argnames=("M", "decode_layout"))
def finish(raw, stats, M: int, decode_layout: bool):
    """Kernel partials -> normalised out [B, H, splits, M, D] f32 and lse [B, H, splits, M] (natural log).
    decode_layout: the decode body's raw [.., N, D], head dimensions in order; else the verification body's
    raw [.., D, N], rows as verify.value_slots."""
    m, l, sw, zw = (stats[..., i, :, None] for i in range(4))  # [B, H, ns, N, 1]
    if decode_layout:
        factors = value_factors(decode.value_slots(raw.shape[-1]))
    else:
        raw = jnp.swapaxes(raw[..., np.argsort(verify.value_slots(raw.shape[-2])[0]), :], -1, -2)  # -> [.., N, D]
        factors = value_factors(verify.value_slots(raw.shape[-1]))
    c = (raw - RAW_OFFSET * sw) * jnp.asarray(factors) - zw
    live = l > 0
    out = jnp.where(live, c / jnp.where(live, l, 1.0), 0.0)
    lse = jnp.where(live, (m + jnp.log2(jnp.where(live, l, 1.0))) * LN2, -jnp.inf)[..., 0]
    return out[..., :M, :], lse[..., :M]
