"""Session 17, for the next device call: which form of an all-layers INT2 commit is right when compiled.

Session 17's all-layers commit (commit e38d8a3: one Triton kernel, grid (L, B, n, H, 2), a row coded once and
stored under one branch per layer) equalled kvcache.commit_layer bit for bit in interpret mode at three layers,
passed its compiled GPU test at one layer, and wrote wrong caches on the H200 at two (logs17/call4/log.txt).
Here each variant commits random rows into L = 1, 2, 3 random layers, compiled, and is compared with
kvcache.commit_layer per layer as tests/test_int2_commit.py's GPU test does (windows exact, scales to a rounding,
codes equal but at rounding boundaries):
  shared5  e38d8a3's kernel (5-d grid; one coded row, stores under per-layer branches)
  shared3  the same body on a 3-d grid (L x 2, B x n, H): no grid collapsing
  branch5  5-d grid, each layer's branch loading, coding and storing on its own (no value shared by branches)
On the CPU (interpret mode) every variant must print ok at every L: `python commit_probe.py`.
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jspec import kvcache
from jspec.config import KVConfig
from jspec.pallas.int2_commit import _code_row

B, n, H, D, S, W, T = 2, 5, 2, 64, 2, 4, 24


def _stores(out, j, kind, b, h, slot, hist, cp, sp, zp, row, packed, scale, zero, cond):
    win_ref, c_ref, q_ref = out[4 * j + kind], out[4 * j + 2], out[4 * j + 3]

    @pl.when(cond & (slot < win_ref.shape[2]))
    def _():
        win_ref[b, h, pl.ds(slot, 1), :] = row[None].astype(win_ref.dtype)

    @pl.when(cond & (hist < c_ref.shape[3]))
    def _():
        c_ref[b, h, cp, pl.ds(hist, 1), :] = packed[None]
        q_ref[b, h, sp, pl.ds(hist, 1), :] = scale.astype(q_ref.dtype)
        q_ref[b, h, zp, pl.ds(hist, 1), :] = zero.astype(q_ref.dtype)


def _kernel(k4_ref, kf_ref, v4_ref, vf_ref, slot_ref, hist_ref, *refs, clip_k, clip_v, planes, variant, nn):
    L = len(refs) // 8
    out = refs[4 * L:]
    if variant == "shared3":
        lk, bi, h = (pl.program_id(a) for a in range(3))
        l, kind_id, b, i = lk // 2, lk % 2, bi // nn, bi % nn
    else:
        l, b, i, h, kind_id = (pl.program_id(a) for a in range(5))
    slot, hist = slot_ref[b, i], hist_ref[b, i]

    def commit(x4, xf, clip, kind, cp, sp, zp):
        code = lambda: (xf[...],) + _code_row(x4[...].astype(jnp.float32), xf[...].astype(jnp.float32), clip,
                                              out[3].dtype)
        if variant == "branch5":
            for j in range(L):
                @pl.when(l == j)
                def _():
                    _stores(out, j, kind, b, h, slot, hist, cp, sp, zp, *code(), cond=jnp.bool_(True))
        else:
            row, packed, scale, zero = code()
            for j in range(L):
                _stores(out, j, kind, b, h, slot, hist, cp, sp, zp, row, packed, scale, zero, cond=l == j)

    parts = ((k4_ref, kf_ref, clip_k, 0, *planes[0]), (v4_ref, vf_ref, clip_v, 1, *planes[1]))
    for kind, part in enumerate(parts):
        pl.when(kind_id == kind)(functools.partial(commit, *part))


@functools.partial(jax.jit, static_argnames=("clip_k", "clip_v", "planes", "interpret", "variant"))
def commit_all(layers, k, v, slot, hist, *, clip_k, clip_v, planes, interpret, variant):
    L, B_, n_, H_, D_ = k.shape
    bufs = tuple(x for layer in layers for x in layer)
    row4 = lambda x: x.reshape(L, B_, n_, H_, 4, D_ // 4)
    if variant == "shared3":
        grid = (L * 2, B_ * n_, H_)
        idx = lambda lk, bi, h: (lk // 2, bi // n_, bi % n_, h)
    else:
        grid = (L, B_, n_, H_, 2)
        idx = lambda l, b, i, h, _: (l, b, i, h)
    spec4 = pl.BlockSpec((None,) * 4 + (4, D_ // 4), lambda *p: idx(*p) + (0, 0))
    spec = pl.BlockSpec((None,) * 4 + (D_,), lambda *p: idx(*p) + (0,))
    whole = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        functools.partial(_kernel, clip_k=clip_k, clip_v=clip_v, planes=planes, variant=variant, nn=n_),
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in bufs],
        grid=grid,
        in_specs=[spec4, spec, spec4, spec, whole, whole] + [whole] * len(bufs),
        out_specs=[whole] * len(bufs),
        input_output_aliases={6 + j: j for j in range(len(bufs))},
        interpret=interpret,
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=1, num_stages=1),
    )(row4(k), k, row4(v), v, slot, hist, *bufs)
    return tuple(tuple(out[4 * j: 4 * j + 4]) for j in range(L))


def case(seed, L):
    rng = np.random.default_rng(seed)
    kv = KVConfig("int2", sink=S, recent=W, clip_k=0.96, clip_v=0.92)
    layer = lambda: kvcache.LayerKV(
        k=jnp.asarray(rng.normal(size=(B, H, S + W, D)), jnp.bfloat16),
        v=jnp.asarray(rng.normal(size=(B, H, S + W, D)), jnp.bfloat16),
        codes=jnp.asarray(rng.integers(0, 256, (B, H, 2, T, D // 4)), jnp.uint8),
        qparams=jnp.asarray(rng.normal(size=(B, H, 4, T, 1)), jnp.bfloat16), pinned_slots=S)
    layers = [layer() for _ in range(L)]
    k = jnp.asarray(rng.normal(size=(L, B, n, H, D)), jnp.bfloat16)
    v = jnp.asarray(rng.normal(size=(L, B, n, H, D)), jnp.bfloat16)
    slot = jnp.asarray([[0, 3, 5, S + W, S + W], [1, 2, S + W, 4, S + W]], jnp.int32)
    hist = jnp.asarray([[3, 4, 5, T, T], [0, 7, T, 9, 23]], jnp.int32)
    return layers, k, v, slot, hist, kv


def main():
    interpret = jax.default_backend() != "gpu"
    kvcache.FUSED_COMMIT = False  # the reference: the jnp commit, not the per-layer kernel it would pick on a GPU
    for variant in ("shared5", "shared3", "branch5"):
        for L in (1, 2, 3):
            layers, k, v, slot, hist, kv = case(L, L)
            got = commit_all(tuple((x.k, x.v, x.codes, x.qparams) for x in layers), k, v, slot, hist, clip_k=kv.clip_k,
                             clip_v=kv.clip_v, planes=kvcache.INT2_PLANES, interpret=interpret, variant=variant)
            worst = []
            for j, (layer, bufs) in enumerate(zip(layers, got)):
                want = kvcache.commit_layer(layer, k[j], v[j], slot, hist, kv=kv)
                win = max(float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(getattr(want, name), np.float32))))
                          for name, x in zip(("k", "v"), bufs[:2]))
                qp = float(np.max(np.abs(np.asarray(bufs[3], np.float32) - np.asarray(want.qparams, np.float32))
                                  / (np.abs(np.asarray(want.qparams, np.float32)) + 1e-6)))
                codes = float(np.mean(np.asarray(bufs[2]) != np.asarray(want.codes)))
                worst.append((win, qp, codes))
            win, qp, codes = (max(w[i] for w in worst) for i in range(3))
            ok = win == 0 and qp <= 2.0**-7 and codes < 0.01
            print(f"{variant} L {L}: window max diff {win:.3g}, qparams rel {qp:.3g}, codes differing {codes:.4f}: "
                  f"{'ok' if ok else 'WRONG'}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
