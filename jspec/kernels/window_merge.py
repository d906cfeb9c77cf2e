"""The BF16 parts of mixed-cache attention joined with the INT2 kernel's split partials in two Pallas (Triton)
kernels per layer, where XLA ran about nine (issue 16 item 3).

For decode and verification chunks (n <= MAX_CHUNK new rows, none of them old enough to be read as INT2),
the same result as attention.split._bf16_parts_merged. Every (batch row, KV head, query position t =
length + i) has its g query rows of one GQA group and U units of work, each a program of `window_parts`:
- a block of BLOCK_SPLITS history splits: their normalised partials (out, lse) weighted by exp(lse - max), or
  the Mosaic decode body's raw ones (hopper.attention's merge="raw"), finished here: two XLA kernels fewer;
- a block of BLOCK_SLOTS window slots as they lie in the cache: pinned slot p holds position p (read iff
  p < length), ring slot S + r the latest position p < length with p = r mod W (read iff p >= max(sink,
  t - R + 1));
- unit 0 also the chunk's own rows j <= i (the diagonal j = i keeps its max finite);
each written as a softmax part (max, sum of exponentials, weighted sum of values). `window_merge` joins
the U parts of each row under their common max and writes out [B, n, Hq, D] in the queries' layout.
Units, not one program looping over all of it: at batch 1 there are only Hkv (8) rows of programs, and
one loop of ten dependent loads per program measured as slow as XLA's kernels (H200, docs/kernels.md).
Blocks that do not divide their count are shifted back to end at the last element, what they repeat
masked out, so no load leaves its array. f32 throughout; dots of f32 operands in full precision (Triton
would use TF32).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jspec.kernels.common import LN2, RAW_OFFSET

MAX_CHUNK = 8  # new rows per call at most (decode: 1, verification: K + 1); longer chunks stay in XLA
BLOCK_SLOTS = 64  # window slots per program
BLOCK_SPLITS = 16  # history splits per program
WARPS = 4


def supported(n: int, g: int, D: int, slots: int, recent: int) -> bool:
    """Whether the kernel takes a call: n new rows, g query heads per KV head, head_dim D, S + W window slots.
    g and D powers of two (Triton's block shapes), g >= 4 and D >= 16 (its dot tiles), 16 slots or more."""
    pow2 = lambda x: x > 0 and x & (x - 1) == 0
    return n <= min(MAX_CHUNK, recent) and pow2(g) and 4 <= g <= 64 and pow2(D) and D >= 16 and slots >= 16


def _floor_pow2(x: int, cap: int) -> int:
    return min(cap, 1 << (x.bit_length() - 1))


def _partial(s, vals):
    """Softmax partial of scores s [g, X] (-inf: not read) over vals [X, D] f32: (max, sum of exp, exp @ vals),
    the max -inf and the rest 0 where a row reads nothing."""
    m = s.max(axis=1)
    p = jnp.exp(s - jnp.where(m == -jnp.inf, 0.0, m)[:, None])
    return m, p.sum(axis=1), jnp.dot(p, vals, precision=lax.Precision.HIGHEST)


def _parts_kernel(len_ref, layer_ref, q_ref, kw_ref, vw_ref, kn_ref, vn_ref, *refs, S: int, sink: int, R: int,
                  n: int, scale: float, bw: int, bs: int, stacked: bool):
    # len_ref [1] int32 | layer_ref [1] int32 | q_ref [g, D] (qkv's query slots) | kw_ref, vw_ref [S + W, D] the
    # window, or with stacked the whole [L, B, Hkv, S + W, D] stacks, of which this row's is (layer, b, h) |
    # kn_ref, vn_ref [n, D] chunk rows (qkv's k and v slots)
    # refs: the history splits, normalised (os_ref [ns, g, D] f32, ls_ref [ns, g] f32) or raw (raw_ref [ns, g, D],
    # st_ref [ns, 4, g] f32, inv_ref [D] f32: hopper.attention's merge="raw"), then
    # m_ref, l_ref [g], acc_ref [g, D]: this unit's part
    f32 = jnp.float32
    split_refs, (m_ref, l_ref, acc_ref) = refs[:-3], refs[-3:]
    b, h, i, u = (pl.program_id(axis) for axis in range(4))
    length = len_ref[0]
    q = q_ref[...]
    g, D = q.shape
    X, W, ns = kw_ref.shape[-2], kw_ref.shape[-2] - S, split_refs[0].shape[0]
    n_split_units = pl.cdiv(ns, bs)

    def chunk():  # the chunk's own rows j <= i (causal: j = 0 is always read), a row at a time (n is no power of 2)
        qf = q.astype(f32)
        row = lambda ref, j: ref[j].astype(f32)[None, :]  # [1, D]
        s = [jnp.where(j <= i, (qf * row(kn_ref, j)).sum(axis=1) * scale, -jnp.inf) for j in range(n)]
        m = functools.reduce(jnp.maximum, s)  # [g], finite
        p = [jnp.exp(sj - m) for sj in s]
        return m, sum(p), sum(pj[:, None] * row(vn_ref, j) for j, pj in enumerate(p))

    def splits():  # unit u < n_split_units: bs splits, their normalised partials weighted by exp(lse - max)
        a = jnp.minimum(u * bs, ns - bs)  # a last block shifted back to end at ns; what it repeats is masked
        fresh = (a + jnp.arange(bs) >= u * bs)[:, None]  # [bs, 1]
        if len(split_refs) == 3:
            return raw_splits(pl.ds(a, bs), fresh, *split_refs)
        os_ref, ls_ref = split_refs
        lse = jnp.where(fresh, ls_ref[pl.ds(a, bs), :], -jnp.inf)  # [bs, g]
        m = lse.max(axis=0)
        w = jnp.exp(lse - jnp.where(m == -jnp.inf, 0.0, m)[None, :])
        return m, w.sum(axis=0), (w[:, :, None] * os_ref[pl.ds(a, bs), :, :]).sum(axis=0)

    def raw_splits(blk, fresh, raw_ref, st_ref, inv_ref):
        # hopper.attention.finish's work on the way: split s holds l_s = sum 2^(x - m_s) over its keys (log2 units) and
        # values times their plane factors (1 / inv) plus RAW_OFFSET sum(w) (sw) and less sum(w z) (zw). Weighted by
        # 2^(m_s - max), the offsets and factors are linear in the splits: applied once, after the sum.
        m2 = jnp.where(fresh, st_ref[blk, 0, :], -jnp.inf)  # [bs, g]; an empty split's max is -1e30: weight 0
        mx = m2.max(axis=0)
        w = jnp.exp((m2 - jnp.where(mx == -jnp.inf, 0.0, mx)[None, :]) * LN2)
        wsum = lambda x: (w * x).sum(axis=0)[:, None]  # [bs, g] -> [g, 1]
        acc = (w[:, :, None] * raw_ref[blk, :, :]).sum(axis=0)  # [g, D]
        c = (acc - RAW_OFFSET * wsum(st_ref[blk, 2, :])) * inv_ref[...][None, :] - wsum(st_ref[blk, 3, :])
        return mx * LN2, wsum(st_ref[blk, 1, :])[:, 0], c

    def window():  # the other units: bw window slots each
        c = u - n_split_units
        a = jnp.minimum(c * bw, X - bw)
        x = a + jnp.arange(bw)  # slots
        if W:
            last = length - 1
            r = lax.rem(last - (x - S), W)  # truncating: made non-negative below
            pos = jnp.where(x < S, x, last - jnp.where(r < 0, r + W, r))
        else:
            pos = x
        ok = (x >= c * bw) & jnp.where(x < S, x < length, (pos >= jnp.maximum(sink, length + i - R + 1)) & (pos >= 0))

        def slots(ref):  # [bw, D]: this row's window slots a ..< a + bw
            return ref[layer_ref[0], b, h, pl.ds(a, bw), :] if stacked else ref[pl.ds(a, bw)]

        k = slots(kw_ref).astype(q.dtype)
        s = jnp.dot(q, k.T, precision=lax.Precision.HIGHEST, preferred_element_type=f32) * scale  # [g, bw]
        return _partial(jnp.where(ok[None, :], s, -jnp.inf), slots(vw_ref).astype(f32))

    def store(part):
        m_ref[...], l_ref[...], acc_ref[...] = part

    def joined(x, y):  # two parts as one; x's max may be -inf, y's is finite
        m = jnp.maximum(x[0], y[0])
        wx, wy = jnp.exp(x[0] - m), jnp.exp(y[0] - m)
        return m, wx * x[1] + wy * y[1], wx[:, None] * x[2] + wy[:, None] * y[2]

    n_units = n_split_units + pl.cdiv(X, bw)

    @pl.when(u == 0)  # the first unit of splits and the chunk's rows (there is always one split)
    def _():
        store(joined(splits(), chunk()))

    @pl.when((u > 0) & (u < n_split_units))
    def _():
        store(splits())

    @pl.when((u >= n_split_units) & (u < n_units))
    def _():
        store(window())

    @pl.when(u >= n_units)  # the units past the last, up to a power of two: empty
    def _():
        store((jnp.full((g,), -jnp.inf, f32), jnp.zeros((g,), f32), jnp.zeros((g, D), f32)))


def _merge_kernel(m_ref, l_ref, acc_ref, o_ref):
    # m_ref, l_ref [U, g], acc_ref [U, g, D] the units' parts | o_ref [g, D]
    m = m_ref[...]
    mx = m.max(axis=0)  # finite: unit 0 holds the chunk's diagonal
    w = jnp.exp(m - mx[None, :])  # 0 for empty units
    num = (w[:, :, None] * acc_ref[...]).sum(axis=0)
    o_ref[...] = (num / (w * l_ref[...]).sum(axis=0)[:, None]).astype(o_ref.dtype)


def join_slots(q, k, v):
    """q [B, n, Hq, D], k and v [B, n, Hkv, D] -> [B, n, Hkv, g + 2, D] (window_merge's qkv; model.qkv_slots'
    layout): a copy, for callers that hold them apart."""
    B, n, H, D = k.shape
    return jnp.concatenate([q.reshape(B, n, H, -1, D), k[:, :, :, None], v[:, :, :, None]], axis=3)


@functools.partial(jax.jit, static_argnames=("sink", "recent", "pinned", "interpret"))
def window_merge(qkv, win_k, win_v, length, splits, layer=None, *, sink: int, recent: int, pinned: int,
                 interpret: bool = False):
    """qkv [B, n, Hkv, g + 2, D] (model.qkv_slots' layout): each KV head's g rotated queries at positions length +
    0..n-1, then the chunk's k row and v row, read in place (slices of it would each be copied for the call);
    win_k, win_v [B, Hkv, S + W, D] the window (S = pinned slots), or with layer (an int32 scalar) the [L, B, Hkv,
    S + W, D] stacks of a stacked cache, read in place at that layer (XLA copied a slice for the call: 0.27 ms per
    8B step at B 8, H200); splits: the INT2 kernel's split partials (row i * g + head in group), normalised
    (out [B, Hkv, ns, n * g, D] f32, lse [B, Hkv, ns, n * g]) or as the Mosaic decode body leaves them
    (hopper.attention's merge="raw": raw [B, Hkv, ns, N, D], stats [B, Hkv, ns, 4, N], value factors [D]; N >= n * g).
    Returns [B, n, Hq, D] in qkv.dtype."""
    B, n, H, slots, D = qkv.shape
    g, X, ns = slots - 2, win_k.shape[-2], splits[0].shape[2]
    if not supported(n, g, D, X, recent):
        raise ValueError(f"window_merge: n {n}, g {g}, D {D}, {X} slots, recent {recent} not supported")
    raw = len(splits) == 3
    N = splits[1].shape[-1] if raw else n * g
    want = ((B, H, ns, N, D), (B, H, ns, 4, N), (D,)) if raw else ((B, H, ns, n * g, D), (B, H, ns, n * g))
    if tuple(x.shape for x in splits) != want or N < n * g:
        raise ValueError(f"split partials {[x.shape for x in splits]} do not match qkv {qkv.shape}")
    bs, bw = _floor_pow2(ns, BLOCK_SPLITS), _floor_pow2(X, BLOCK_SLOTS)
    U = 1 << (-(-ns // bs) + -(-X // bw) - 1).bit_length()  # units: blocks of splits, then of slots; a power of two
    stacked = layer is not None
    kernel = functools.partial(_parts_kernel, S=pinned, sink=sink, R=recent, n=n, scale=float(D**-0.5), bw=bw, bs=bs,
                               stacked=stacked)
    rows = pl.BlockSpec((None, None, g, D), lambda b, h, i, *_: (b, i, h, 0))  # out: [B, n, Hq, D]
    queries = pl.BlockSpec((None, None, None, g, D), lambda b, h, i, u: (b, i, h, 0, 0))  # qkv's first g slots
    chunk = lambda slot: pl.BlockSpec((None, n, None, None, D), lambda b, h, i, u: (b, 0, h, slot, 0))
    win = pl.BlockSpec(win_k.shape, lambda *_: (0,) * 5) if stacked else \
        pl.BlockSpec((None, None, X, D), lambda b, h, i, u: (b, h, 0, 0))
    part = lambda *shape: pl.BlockSpec((None,) * 4 + shape, lambda b, h, i, u: (b, h, i, u) + (0,) * len(shape))
    parts = [jax.ShapeDtypeStruct((B, H, n, U, *shape), jnp.float32) for shape in ((g,), (g,), (g, D))]
    rows_of_i = pl.BlockSpec((None, None, ns, g, D), lambda b, h, i, u: (b, h, 0, i, 0))  # out or raw: i's g rows
    if raw:  # the stats' columns of position i; the factors whole
        split_specs = [rows_of_i, pl.BlockSpec((None, None, ns, 4, g), lambda b, h, i, u: (b, h, 0, 0, i)),
                       pl.BlockSpec((D,), lambda *_: (0,))]
        splits = (splits[0], splits[1], jnp.asarray(splits[2], jnp.float32))
    else:
        split_specs = [rows_of_i, pl.BlockSpec((None, None, ns, g), lambda b, h, i, u: (b, h, 0, i))]
        splits = (splits[0], splits[1].astype(jnp.float32))
    m, l, acc = pl.pallas_call(
        kernel,
        grid=(B, H, n, U),
        in_specs=[pl.BlockSpec((1,), lambda b, h, i, u: (b,)), pl.BlockSpec((1,), lambda *_: (0,)), queries, win, win,
                  chunk(g), chunk(g + 1), *split_specs],
        out_specs=[part(g), part(g), part(g, D)],
        out_shape=parts,
        compiler_params=_params(interpret),
        interpret=interpret,
        name="window_parts",
    )(length.astype(jnp.int32), jnp.reshape(jnp.asarray(0 if layer is None else layer, jnp.int32), (1,)), qkv, win_k,
      win_v, qkv, qkv, *splits)
    whole = lambda *shape: pl.BlockSpec((None, None, None, U, *shape), lambda b, h, i: (b, h, i, 0) + (0,) * len(shape))
    return pl.pallas_call(
        _merge_kernel,
        grid=(B, H, n),
        in_specs=[whole(g), whole(g), whole(g, D)],
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct((B, n, H * g, D), qkv.dtype),
        compiler_params=_params(interpret),
        interpret=interpret,
        name="window_merge",
    )(m, l, acc)


def _params(interpret: bool):
    return None if interpret else pltriton.CompilerParams(num_warps=WARPS, num_stages=1)
