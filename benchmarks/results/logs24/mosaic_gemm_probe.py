"""Issue 14, prepared in session 24 (not yet run on a GPU): the stacked layers' GEMMs as a Pallas Mosaic GPU kernel
that reads the [L, K, N] weight stack in place at the loop's layer index, with TMA.

Session 24's Pallas Triton kernel (c1b57af) read the weights at 2.3-3.9 TB/s where XLA's Triton GEMMs read at
3.6-4.3; its Triton IR computes every weight element's address with integer tensor ops in the K loop (int64 for w_gu).
Here TMA moves each [bk, bn] weight tile and the rows' [Nr, bk] tile into a shared-memory ring of `stages` slots, and
one warpgroup's wgmma takes the weight tile transposed as A (bn output features on M) and the rows as B (Nr = the rows
rounded up to 8, on N), as XLA's Triton GEMMs order the product. Each CTA runs one split of K for bn columns; the f32
partials [splits, N, Nr] are summed by XLA after the call.

    python mosaic_gemm_probe.py --lower-only        # any host: lowers the kernel for CUDA (no PTX, no run)
    python mosaic_gemm_probe.py --small             # CPU check of the script: small shapes, XLA in the kernel's place
    python mosaic_gemm_probe.py --out DIR           # H200: agreement with XLA; 32 layers per weight and tiling
                                                    # against cuBLAS in the loop (matmul_probe.py's part 1); then
                                                    # session 23's probe layer (norms, the four GEMMs, residual adds)
                                                    # 32 times: unrolled (XLA's Triton GEMMs), scanned with cuBLAS,
                                                    # scanned with the kernel at each weight's best tiling
"""
import argparse
import functools
import itertools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jspec import model


def _kernel(layer_gmem, x_gmem, w_gmem, out_gmem, x_smem, w_smem, o_smem, bars, *, bn: int, bk: int, steps: int,
            stages: int):
    # layer_gmem [1] int32 | x_gmem [Nr, K] bf16 the rows | w_gmem [L, K, N] bf16 the whole stack
    # out_gmem [splits, N, Nr] f32: this CTA's partial product (its split of K, its bn columns), transposed
    # x_smem [stages, Nr, bk], w_smem [stages, bk, bn] (swizzled tiles) | o_smem [bn, Nr] f32 | bars: one per slot
    n, s = lax.axis_index("n"), lax.axis_index("s")
    layer = layer_gmem[0]
    first = s * steps

    def fetch(t, slot):
        k0 = (first + t) * bk
        plgpu.copy_gmem_to_smem(x_gmem.at[:, pl.ds(k0, bk)], x_smem.at[slot], bars.at[slot])
        plgpu.copy_gmem_to_smem(w_gmem.at[layer, pl.ds(k0, bk), pl.ds(n * bn, bn)], w_smem.at[slot], bars.at[slot])

    for t in range(min(stages, steps)):
        fetch(t, t)

    def product(acc_ref):
        def body(t, _):
            slot = lax.rem(t, stages)
            plgpu.barrier_wait(bars.at[slot])
            plgpu.wgmma(acc_ref, w_smem.at[slot].T, x_smem.at[slot].T)  # [bn, bk] @ [bk, Nr]
            plgpu.wgmma_wait(0)  # the slot is read: refill it

            @pl.when(t + stages < steps)
            def _():
                fetch(t + stages, slot)

        lax.fori_loop(0, steps, body, None)
        return acc_ref[...]

    o_smem[...] = pl.run_scoped(product, plgpu.ACC((bn, x_smem.shape[1]), jnp.float32))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, out_gmem.at[s, pl.ds(n * bn, bn)])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("bn", "bk", "splits", "stages"))
def matmul_parts(x, w, layer, *, bn=64, bk=64, splits=1, stages=4):
    """x [M, K] bf16 and the stack w [L, K, N] bf16 -> f32 partials [splits, N, Nr] of (x @ w[layer])^T."""
    M, K = x.shape
    L, _, N = w.shape
    Nr = -(-M // 8) * 8
    if N % bn or K % (splits * bk) or bn % 64 or bk % 64:
        raise ValueError(f"[{K}, {N}] by bn {bn}, bk {bk}, splits {splits}")
    swz = lambda: (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    scratch = dict(x_smem=plgpu.SMEM((stages, Nr, bk), jnp.bfloat16, transforms=swz()),
                   w_smem=plgpu.SMEM((stages, bk, bn), jnp.bfloat16, transforms=swz()),
                   o_smem=plgpu.SMEM((bn, Nr), jnp.float32),
                   bars=plgpu.Barrier(num_arrivals=2, num_barriers=stages))
    kernel = functools.partial(_kernel, bn=bn, bk=bk, steps=K // (splits * bk), stages=stages)
    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((splits, N, Nr), jnp.float32), scratch_types=scratch,
                        grid=(N // bn, splits), grid_names=("n", "s"), kernel_name="stacked_gemm")(
        jnp.reshape(layer, (1,)).astype(jnp.int32), jnp.pad(x, ((0, Nr - M), (0, 0))), w)


def matmul(x, w, layer, **tiling):
    """x [M, K] @ w[layer] for the stack w [L, K, ...] (trailing axes flattened), in x's dtype."""
    M, K = x.shape
    parts = matmul_parts(x, w.reshape(w.shape[0], K, -1), layer, **tiling)
    out = functools.reduce(jnp.add, list(parts))  # adds, not a reduction: they fuse into the consumer
    return out[:, :M].T.astype(x.dtype).reshape(M, *w.shape[2:])


def lower_only():
    for bn, bk, splits, stages, M in [(64, 64, 1, 4, 1), (128, 64, 4, 4, 8), (64, 128, 2, 3, 40)]:
        x = jax.ShapeDtypeStruct((M, 1024), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((3, 1024, 512), jnp.bfloat16)
        f = jax.jit(lambda x, w, i: matmul(x, w, i, bn=bn, bk=bk, splits=splits, stages=stages))
        text = f.trace(x, w, jax.ShapeDtypeStruct((), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
        print("lowered", dict(bn=bn, bk=bk, splits=splits, stages=stages, rows=M), "mosaic_gpu" in text, flush=True)


def timed(fn, args, opts=None, reps=20):
    c = jax.jit(fn).lower(*args).compile(compiler_options=opts)
    out = jax.block_until_ready(c(*args))
    for _ in range(3):
        out = c(*args)
    jax.block_until_ready(out)
    t = time.perf_counter()
    for _ in range(reps):
        out = c(*args)
    jax.block_until_ready(out)
    return out, (time.perf_counter() - t) / reps


def probe_layers(W, M, tilings, scan_options):
    """Session 23's gemm_probe layer 32 times at M rows: unrolled over separate arrays, and scanned over the stacks
    with cuBLAS (under scan_options) and with the kernel; ms per pass."""
    E, F = W["wo"].shape[1], W["w_down"].shape[1]
    L = W["wo"].shape[0]
    lists = {name: [w[i] for i in range(L)] for name, w in W.items()}

    def norm(x):
        xf = x.astype(jnp.float32)
        return (xf * lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype)

    def layer(x, w, i, mm):
        a = mm(norm(x), w, "wqkv", i)[:, :E]  # stands in for attention's output
        x = x + mm(a, w, "wo", i)
        y = mm(norm(x), w, "w_gu", i)
        return x + mm(jax.nn.silu(y[:, :F]) * y[:, F:], w, "w_down", i)

    xla = lambda x, w, name, i: x @ w[name][i]
    mosaic = lambda x, w, name, i: matmul(x, w[name], i, **tilings[name])
    unrolled = lambda x, ws: functools.reduce(lambda x, i: layer(x, ws, i, xla), range(L), x)
    scanned = lambda mm: (lambda x, w: lax.fori_loop(0, L, lambda i, x: layer(x, w, i, mm), x))
    x = jnp.ones((M, E), jnp.bfloat16)
    gb = sum(w.size for w in W.values()) * 2 / 1e9
    rows, ref = [], None
    for variant, fn, args, opts in [("unrolled", unrolled, (x, lists), None),
                                    ("scan, cuBLAS", scanned(xla), (x, W), scan_options),
                                    ("scan, mosaic", scanned(mosaic), (x, W), None)]:
        out, dt = timed(fn, args, opts)
        ref = out if ref is None else ref
        r = dict(rows=M, variant=variant, ms=dt * 1e3, TBps=gb / dt / 1e3,
                 max_diff=float(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)).max()))
        print("layer", r, flush=True)
        rows.append(r)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--lower-only", action="store_true")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    if a.lower_only:
        return lower_only()
    global matmul
    if a.small and jax.default_backend() != "gpu":  # no Mosaic GPU here: the script's logic only
        matmul = lambda x, w, i, **t: (x @ w[i].reshape(w.shape[1], -1)).reshape(x.shape[0], *w.shape[2:])
    res = dict(agree=[], weights=[], layers=[])
    best = {}
    # agreement with XLA at 3 layers, every weight shape's default tiling
    E, F, QKV, L = (256, 512, 384, 4) if a.small else (4096, 14336, 6144, 32)
    key = iter(jax.random.split(jax.random.PRNGKey(0), 32))
    stack = lambda *s: (jax.random.normal(next(key), (L, *s), jnp.float32) * 0.02).astype(jnp.bfloat16)
    W = dict(wqkv=stack(E, QKV), wo=stack(E, E), w_gu=stack(E, 2 * F), w_down=stack(F, E))
    for name, w in W.items():
        for M in (1, 8, 40):
            x = jax.random.normal(next(key), (M, w.shape[1]), jnp.float32).astype(jnp.bfloat16)
            got = matmul(x, w, jnp.int32(L - 1), bn=64, bk=64, splits=4, stages=4).astype(jnp.float32)
            want = jnp.dot(x.astype(jnp.float32), w[L - 1].astype(jnp.float32))
            r = dict(weight=name, rows=M, max_rel=float(jnp.abs(got - want).max() / jnp.abs(want).max()))
            r["ok"] = r["max_rel"] < 1e-2  # bf16 output rounding is ~4e-3
            print("agree", r, flush=True)
            res["agree"].append(r)
    SCAN = dict(model.SCAN_OPTIONS)
    for M in map(int, a.rows.split(",")):
        for name, w in W.items():
            K, N = w.shape[1:]
            x = jnp.ones((M, K), jnp.bfloat16) * 0.1
            gb = w.size * 2 / 1e9
            loop = lambda mm: (lambda x, w: lax.fori_loop(
                0, L, lambda i, acc: acc + mm(x, w, i).astype(jnp.float32), jnp.zeros((M, N), jnp.float32)))
            rows = []
            _, dt = timed(loop(lambda x, w, i: x @ w[i]), (x, w), SCAN)
            rows.append(dict(variant="cublas in the loop", ms=dt * 1e3))
            for bn, bk, splits, stages in itertools.product((64, 128), (64, 128), (1, 2, 4, 8), (4,)):
                if K % (splits * bk) or K // (splits * bk) < 2 or N // bn * splits < (1 if a.small else 66):
                    continue
                try:
                    t = dict(bn=bn, bk=bk, splits=splits, stages=stages)
                    _, dt = timed(loop(lambda x, w, i, t=t: matmul(x, w, i, **t)), (x, w))
                    rows.append(dict(variant="mosaic", tiling=t, ms=dt * 1e3))
                except Exception as e:  # a tiling past shared memory: keep going
                    rows.append(dict(variant="mosaic", tiling=t, error=str(e)[:200]))
            for r in rows:
                r.update(weight=name, rows=M, TBps=gb / r["ms"] if "ms" in r else None)
            top = min((r for r in rows if r["variant"] == "mosaic" and "ms" in r), key=lambda r: r["ms"], default=None)
            for r in (rows[0], top):
                if r:
                    print(name, M, r["variant"], r.get("tiling", ""), f"{r['ms']:.3f} ms {r['TBps']:.2f} TB/s", flush=True)
            res["weights"] += rows
            if top:
                best[M, name] = top["tiling"]
    for M in map(int, a.rows.split(",")):
        if all((M, name) in best for name in W):
            res["layers"] += probe_layers(W, M, {name: best[M, name] for name in W}, SCAN)
    if a.out:
        Path(a.out, "mosaic_gemm_probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
