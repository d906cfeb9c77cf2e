"""The BF16 parts of mixed-cache attention joined with the INT2 kernel's split partials: one Pallas (Triton)
program per (batch row, KV head, query position) (issue 16 item 3: one kernel where XLA ran about nine).

For decode and verification chunks (n <= MAX_CHUNK new rows, none of them old enough to be read as INT2),
the same result as attention_split._bf16_parts_merged: each program holds the g query rows of one GQA group
at one position t = length + i and runs one online softmax over
- the chunk's own rows j <= i (first: the diagonal j = i keeps the running max finite from the start),
- the history splits' normalised partials (out, lse), weighted by exp(lse - max),
- the window slots as they lie in the cache: pinned slot p holds position p (read iff p < length), ring
  slot S + r the latest position p < length with p = r mod W (read iff p >= max(sink, t - R + 1)),
and writes out [B, n, Hq, D] in the queries' layout. Blocks of slots and of splits that do not divide
their count are shifted back to end at the last one, with the slots already seen masked out, so no load
leaves its array. f32 throughout; dots of f32 operands in full precision (Triton would use TF32).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

try:  # the Triton backend module; absent or renamed in some jax builds
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # pragma: no cover
    pltriton = None

MAX_CHUNK = 8  # new rows per call at most (decode: 1, verification: K + 1); longer chunks stay in XLA
BLOCK_SLOTS = 64  # window slots per loop step
BLOCK_SPLITS = 16  # history splits per loop step
WARPS = 4


def supported(n: int, g: int, D: int, slots: int, recent: int) -> bool:
    """Whether the kernel takes a call: n new rows, g query heads per KV head, head_dim D, S + W window slots.
    g and D powers of two (Triton's block shapes), g >= 4 and D >= 16 (its dot tiles), 16 slots or more."""
    pow2 = lambda x: x > 0 and x & (x - 1) == 0
    return n <= min(MAX_CHUNK, recent) and pow2(g) and 4 <= g <= 64 and pow2(D) and D >= 16 and slots >= 16


def _floor_pow2(x: int, cap: int) -> int:
    return min(cap, 1 << (x.bit_length() - 1))


def _kernel(len_ref, q_ref, kw_ref, vw_ref, kn_ref, vn_ref, os_ref, ls_ref, o_ref, *, S: int, sink: int,
            R: int, n: int, scale: float, bw: int, bs: int):
    # len_ref [1] int32 | q_ref [g, D] | kw_ref, vw_ref [S + W, D] window | kn_ref, vn_ref [n, D] chunk rows
    # os_ref [ns, g, D] f32, ls_ref [ns, g] f32 history splits | o_ref [g, D]
    f32 = jnp.float32
    hi = lax.Precision.HIGHEST
    i = pl.program_id(2)
    length = len_ref[0]
    t = length + i
    q = q_ref[...].astype(f32)
    g, D = q.shape
    X, W, ns = kw_ref.shape[0], kw_ref.shape[0] - S, os_ref.shape[0]

    # The chunk's own rows, causal: j <= i.
    s_new = [jnp.where(j <= i, (q * kn_ref[j].astype(f32)[None, :]).sum(axis=1) * scale, -jnp.inf) for j in range(n)]
    m = functools.reduce(jnp.maximum, s_new)  # [g], finite (j = 0 <= i)
    p_new = [jnp.exp(s - m) for s in s_new]
    l = sum(p_new)
    acc = sum(p[:, None] * vn_ref[j].astype(f32)[None, :] for j, p in enumerate(p_new))  # [g, D]

    def update(carry, s, vals):  # s [g, X'] scores (-inf: not read), vals [X', D] f32
        m, l, acc = carry
        m_new = jnp.maximum(m, s.max(axis=1))
        alpha, p = jnp.exp(m - m_new), jnp.exp(s - m_new[:, None])
        return m_new, alpha * l + p.sum(axis=1), alpha[:, None] * acc + jnp.dot(p, vals, precision=hi)

    def splits(c, carry):
        a = jnp.minimum(c * bs, ns - bs)
        fresh = a + jnp.arange(bs) >= c * bs  # [bs]: not in the previous block
        lse = jnp.where(fresh[:, None], ls_ref[pl.ds(a, bs), :], -jnp.inf)  # [bs, g]
        m, l, acc = carry
        m_new = jnp.maximum(m, lse.max(axis=0))
        alpha, w = jnp.exp(m - m_new), jnp.exp(lse - m_new[None, :])  # [g], [bs, g]
        part = (w[:, :, None] * os_ref[pl.ds(a, bs), :, :]).sum(axis=0)  # [g, D]
        return m_new, alpha * l + w.sum(axis=0), alpha[:, None] * acc + part

    def window(c, carry):
        a = jnp.minimum(c * bw, X - bw)
        x = a + jnp.arange(bw)  # slots
        if W:
            last = length - 1
            r = lax.rem(last - (x - S), W)
            pos = jnp.where(x < S, x, last - jnp.where(r < 0, r + W, r))
        else:
            pos = x
        ok = (x >= c * bw) & jnp.where(x < S, x < length, (pos >= jnp.maximum(sink, t - R + 1)) & (pos >= 0))
        k = kw_ref[pl.ds(a, bw), :].astype(q_ref.dtype)
        s = jnp.dot(q_ref[...], k.T, precision=hi, preferred_element_type=f32) * scale  # [g, bw]
        return update(carry, jnp.where(ok[None, :], s, -jnp.inf), vw_ref[pl.ds(a, bw), :].astype(f32))

    carry = lax.fori_loop(0, pl.cdiv(ns, bs), splits, (m, l, acc))
    m, l, acc = lax.fori_loop(0, pl.cdiv(X, bw), window, carry)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("sink", "recent", "pinned", "interpret"))
def window_merge(q, k, v, win_k, win_v, length, out_k, lse_k, *, sink: int, recent: int, pinned: int,
                 interpret: bool = False):
    """q [B, n, Hq, D] rotated queries at positions length + 0..n-1; k, v [B, n, Hkv, D] the chunk's rows;
    win_k, win_v [B, Hkv, S + W, D] the window (S = pinned slots); out_k [B, Hkv, ns, n * g, D] f32 and
    lse_k [B, Hkv, ns, n * g] the INT2 kernel's split partials (row i * g + head in group). Returns
    [B, n, Hq, D] in q.dtype."""
    B, n, Hq, D = q.shape
    H, X = k.shape[2], win_k.shape[2]
    g, ns = Hq // H, out_k.shape[2]
    if not supported(n, g, D, X, recent):
        raise ValueError(f"window_merge: n {n}, g {g}, D {D}, {X} slots, recent {recent} not supported")
    if out_k.shape != (B, H, ns, n * g, D) or lse_k.shape != (B, H, ns, n * g):
        raise ValueError(f"split partials {out_k.shape} / {lse_k.shape} do not match q {q.shape}")
    bs = _floor_pow2(ns, BLOCK_SPLITS)
    kernel = functools.partial(_kernel, S=pinned, sink=sink, R=recent, n=n, scale=float(D**-0.5),
                               bw=_floor_pow2(X, BLOCK_SLOTS), bs=bs)
    rows = pl.BlockSpec((None, None, g, D), lambda b, h, i: (b, i, h, 0))  # q and out: [B, n, Hq, D]
    chunk = pl.BlockSpec((None, n, None, D), lambda b, h, i: (b, 0, h, 0))
    win = pl.BlockSpec((None, None, X, D), lambda b, h, i: (b, h, 0, 0))
    params = None
    if not interpret and pltriton is not None:
        cls = getattr(pltriton, "CompilerParams", None) or getattr(pltriton, "TritonCompilerParams", None)
        params = cls(num_warps=WARPS, num_stages=2)
    return pl.pallas_call(
        kernel,
        grid=(B, H, n),
        in_specs=[pl.BlockSpec((1,), lambda b, h, i: (b,)), rows, win, win, chunk, chunk,
                  pl.BlockSpec((None, None, ns, g, D), lambda b, h, i: (b, h, 0, i, 0)),
                  pl.BlockSpec((None, None, ns, g), lambda b, h, i: (b, h, 0, i))],
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=params,
        interpret=interpret,
        name="window_merge",
    )(length.astype(jnp.int32), q, win_k, win_v, k, v, out_k, lse_k.astype(jnp.float32))
