"""Host-side inputs of the Mosaic INT2 kernel's bodies (decode.py, verify.py): the cache's codes and scales as
TMA rows, the per-query-row vectors, and the splits' schedule. Plain jnp: runs anywhere."""

from __future__ import annotations

import jax.numpy as jnp

# The codes' TMA box rows: 128 bytes (4 tokens at D = 128, 8 at D = 64) instead of one token's D / 4 (same
# bytes, same order; wider rows move faster: measured on the H200, docs/kernels.md).
ROW_BYTES = 128


def tma_ready(x, T_axis: int, multiple: int):
    """Pads axis T_axis to a multiple (TMA needs 16-byte row strides; only odd-sized caches pay a copy)."""
    T = x.shape[T_axis]
    if T % multiple == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[T_axis] = (0, -T % multiple)
    return jnp.pad(x, pad)


def ring_inputs(codes, qparams, BT: int):
    """codes [B, H, 2, T, D/4] uint8, qparams [B, H, 4, T, 1] -> the ring's operands: codes [B H, 2, T' / wide,
    ROW_BYTES] (rows of wide = ROW_BYTES / (D / 4) tokens) and qparams [B H, 4, T'], T padded where TMA needs
    it (to a block where T < BT)."""
    B, H, _, T, D4 = codes.shape
    par = tma_ready(qparams.reshape(B * H, 4, T), 2, 16 // qparams.dtype.itemsize)
    wide = ROW_BYTES // D4
    cod = tma_ready(codes.reshape(B * H, 2, T, D4), 2, max(BT, wide) if T < BT else wide)
    par = tma_ready(par, 2, BT) if T < BT else par
    return cod.reshape(B * H, 2, cod.shape[2] // wide, ROW_BYTES), par


def row_vectors(first, qsum, lo, hi):
    """colv [B, H, 4, N] f32: first [B, H, N] (the body's score offset or scale), qsum [B, H, N] (sum(q) of
    each row), lo and hi (padded rows: lo = hi = 0, empty). One stack, written once."""
    B, H, N = qsum.shape
    pad_rows = lambda x: jnp.broadcast_to(jnp.pad(x.astype(jnp.float32), ((0, 0), (0, N - x.shape[1])))[:, None],
                                          (B, H, N))
    return jnp.stack([first, qsum, pad_rows(lo), pad_rows(hi)], 2)


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


def with_inside(sched, lo, hi):
    """[B, splits, 2] schedule -> [B, splits, 4] with each batch row's [max lo, min hi) (no mask inside)."""
    B, splits = sched.shape[:2]
    inside = jnp.stack([jnp.max(lo, 1), jnp.min(hi, 1)], -1).astype(jnp.int32)  # [B, 2]
    return jnp.concatenate([sched, jnp.broadcast_to(inside[:, None], (B, splits, 2))], -1)
