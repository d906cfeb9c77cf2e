"""The BF16 window parts and split merge as two kernels (pallas/window_merge.py) against the XLA path of
attend_split, in interpret mode on CPU and compiled on a GPU."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.attention import split as attention_split
from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig
from jspec.kernels import window_merge as wm
from jspec.kernels.hopper import attention as int2_mosaic, decode
from jspec.kernels.hopper.launch import value_factors

CFG = ModelConfig(model_type="llama", vocab_size=32, hidden_size=256, intermediate_size=64, num_layers=1,
                  num_heads=8, num_kv_heads=2, head_dim=64, max_position=512)
SPLIT = jax.jit(attention_split.attend_split, static_argnames=("kv", "interpret", "kernel", "fused_window",
                                                               "block_t", "num_splits"))


def _inputs(sink, recent, n, dtype):
    """A one-layer cache whose rows hold 250 committed tokens, 30 (ring slots not yet filled) and none, and
    a chunk of n new rows: (kv, attend_split's array arguments)."""
    kv = KVConfig(sink=sink, recent=recent)
    lengths = jnp.asarray([250, 30, 0], jnp.int32)
    c = kvcache.init_cache(CFG, kv, batch=3, capacity=320, lookahead=4)
    rng = np.random.default_rng(sink + recent + n)
    rows = lambda T, h: jnp.asarray(rng.standard_normal((3, T, h, 64)), dtype)
    c = kvcache.commit(c, rows(250, 2)[None], rows(250, 2)[None], lengths)
    return kv, (rows(n, 8), rows(n, 2), rows(n, 2), c.layer(0), c.length)


# (sink, recent, splits): a window of 8 + 8 slots (one block) and 3 splits (one block); 8 + 70 slots (a
# shifted-back last block) and 20 splits (a shifted-back second block).
@pytest.mark.parametrize("sink,recent,splits", [(8, 8, 3), (8, 70, 20)])
@pytest.mark.parametrize("n", [1, 5])  # decode, K = 4 verification
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("noisy", [False, True])  # Layer.key_noise given: the splits' lse (or raw maxima) shifted
def test_fused_window_matches_xla_parts(sink, recent, splits, n, dtype, noisy, interpret=True, kernel="auto"):
    kv, args = _inputs(sink, recent, n, dtype)
    assert wm.supported(n, 4, 64, args[3].k.shape[2], recent)
    # block_t and num_splits go to the Triton kernel (the Mosaic one picks its own splits)
    options = dict(kv=kv, interpret=interpret, kernel=kernel, block_t=16, num_splits=splits,
                   key_noise=jnp.asarray([0.5, 2.0]) if noisy else None)
    assert "window_merge" in str(jax.make_jaxpr(lambda *a: SPLIT(*a, fused_window=True, **options))(*args))
    ref = SPLIT(*args, fused_window=False, **options)
    out = SPLIT(*args, fused_window=True, **options)
    assert out.shape == args[0].shape and out.dtype == dtype
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=tol, atol=tol)


def test_fused_window_lowers_for_cuda():
    """The Triton kernel itself (not the interpreter) lowers: what the CPU can check of the GPU path."""
    kv, args = _inputs(8, 70, 5, jnp.bfloat16)
    fn = lambda *a: attention_split.attend_split(*a, kv=kv, kernel="triton", fused_window=True, interpret=False)
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "window_merge" in text and "triton" in text


def _stacked_window(layer, index: int = 1):
    """layer with window_stacks: its window as layer `index` of 3-layer [L, ...] stacks, the others random."""
    rng = np.random.default_rng(7)
    noise = lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype)
    stacks = [[noise(w), noise(w), noise(w)] for w in (layer.k, layer.v)]
    stacks[0][index], stacks[1][index] = layer.k, layer.v
    return layer.replace(window_stacks=(*map(jnp.stack, stacks), jnp.int32(index)))


def test_fused_window_reads_layer_i_of_stacked_windows():
    """In a loop over a stacked cache's layers (LayerKV.window_stacks: the [L, ...] window stacks and the layer's
    index), window_merge reads layer i's window out of the stacks itself (interpret mode): the result of that
    layer's own window, and not of another layer's."""
    kv, (q, k, v, layer, length) = _inputs(8, 70, 5, jnp.float32)
    options = dict(kv=kv, fused_window=True, interpret=True, block_t=16, num_splits=20)
    want = SPLIT(q, k, v, layer, length, **options)
    np.testing.assert_allclose(np.asarray(SPLIT(q, k, v, _stacked_window(layer), length, **options)),
                               np.asarray(want), rtol=1e-6, atol=1e-6)
    other = _stacked_window(layer).replace(window_stacks=(*_stacked_window(layer).window_stacks[:2], jnp.int32(0)))
    assert not np.allclose(np.asarray(SPLIT(q, k, v, other, length, **options)), np.asarray(want), atol=1e-3)


def test_stacked_windows_lower_for_cuda():
    """The Triton kernel reading window stacks lowers for CUDA (what the CPU can check of the GPU path)."""
    kv, (q, k, v, layer, length) = _inputs(8, 70, 5, jnp.bfloat16)
    fn = lambda *a: attention_split.attend_split(*a, kv=kv, kernel="triton", fused_window=True, interpret=False)
    text = jax.jit(fn).trace(q, k, v, _stacked_window(layer), length).lower(lowering_platforms=("cuda",)).as_text()
    assert "window_parts" in text and "triton" in text


@pytest.mark.parametrize("n", [1, 5])
def test_raw_mosaic_partials_match_finished_ones(n, ns=20):
    """window_merge finishing the Mosaic decode body's raw partials itself (merge="raw") equals it merging
    what int2_mosaic.finish makes of them: random raw tiles and stats, empty splits (l = 0, max -1e30) included."""
    kv, (q, k, v, layer, length) = _inputs(8, 70, n, jnp.float32)
    B, H, D, M = 3, 2, 64, n * 4
    N = -(-M // 8) * 8
    rng = np.random.default_rng(n)
    l = rng.uniform(0.5, 40, (B, H, ns, N)) * (rng.uniform(size=(B, H, ns, N)) > 0.2)
    m = np.where(l > 0, rng.normal(0, 4, (B, H, ns, N)), -1e30)
    sw, zw = rng.uniform(0, 2, (B, H, ns, N)) * (l > 0), rng.normal(0, 1, (B, H, ns, N)) * (l > 0)
    raw = jnp.asarray(128 * sw[..., None] + rng.normal(0, 3, (B, H, ns, N, D)) * (l > 0)[..., None], jnp.float32)
    stats = jnp.asarray(np.stack([m, l, sw, zw], 3), jnp.float32)
    qkv = wm.join_slots(q, k, v)
    merge = lambda splits: wm.window_merge(qkv, layer.k, layer.v, length, splits, sink=kv.sink, recent=kv.recent,
                                           pinned=layer.pinned_slots, interpret=True)
    want = merge(int2_mosaic.finish(raw, stats, M, decode_layout=True))
    got = merge((raw, stats, value_factors(decode.value_slots(D))))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_raw_partials_lower_for_cuda():
    kv, (q, k, v, layer, length) = _inputs(8, 70, 1, jnp.bfloat16)
    splits = (jnp.zeros((3, 2, 20, 8, 64)), jnp.zeros((3, 2, 20, 4, 8)), value_factors(decode.value_slots(64)))
    fn = lambda *a: wm.window_merge(*a, sink=kv.sink, recent=kv.recent, pinned=layer.pinned_slots)
    text = jax.jit(fn).trace(wm.join_slots(q, k, v), layer.k, layer.v, length, splits).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "window_parts" in text and "triton" in text


def test_fused_window_under_a_mesh_matches_xla_parts():
    """Under a (dp 1, tp 2) mesh of two CPU devices attend_split runs per device on its KV heads
    (attention_split.per_shard); the fused path there (interpret mode) equals the XLA path, also reading layer 1
    of window stacks (LayerKV.window_stacks, each device its KV heads of every layer) and given q, k and v joined."""
    code = textwrap.dedent("""
        import functools, jax, jax.numpy as jnp, numpy as np
        from jspec.attention import split as attention_split
        from jspec.runtime import sharding
        from test_window_merge import _inputs, _stacked_window
        kv, (q, k, v, layer, length) = _inputs(8, 70, 5, jnp.float32)
        mesh = sharding.make_mesh("tp=2,dp=1")
        outs = []
        for fused, lay in ((False, layer), (True, layer), (True, _stacked_window(layer))):
            fn = functools.partial(attention_split.attend_split, interpret=True, fused_window=fused, block_t=16)
            run = attention_split.per_shard(fn, mesh)
            outs.append(np.asarray(jax.jit(run, static_argnums=5)(q, k, v, lay, length, kv)))
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outs[2], outs[0], rtol=1e-5, atol=1e-5)
        # q, k and v also handed over joined (model.qkv_slots' array), sharded by per_shard over its KV heads
        qkv = attention_split.join_slots(q, k, v)
        joined = jax.jit(run, static_argnums=5)(q, k, v, layer, length, kv, qkv)
        np.testing.assert_allclose(np.asarray(joined), outs[0], rtol=1e-5, atol=1e-5)
        # Layer.key_noise [Hkv], split over tp with the KV heads: as without the mesh
        noise = jnp.asarray([0.5, 2.0])
        alone = jax.jit(fn, static_argnames="kv")(q, k, v, layer, length, kv=kv, key_noise=noise)
        meshed = jax.jit(run, static_argnums=5)(q, k, v, layer, length, kv, key_noise=noise)
        np.testing.assert_allclose(np.asarray(meshed), np.asarray(alone), rtol=1e-5, atol=1e-5)
        assert not np.allclose(np.asarray(meshed), outs[0], atol=1e-3)
        assert "window_merge" in str(jax.make_jaxpr(attention_split.per_shard(functools.partial(
            attention_split.attend_split, interpret=True, fused_window=True), mesh), static_argnums=5)(
            q, k, v, layer, length, kv))
        print("ok")
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))  # jspec from this checkout, installed or not
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                       cwd=Path(__file__).parent)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_unsupported_shapes_are_refused():
    assert wm.supported(5, 4, 128, 320, 256)
    assert not wm.supported(9, 4, 64, 64, 256)  # a chunk longer than MAX_CHUNK
    assert not wm.supported(5, 4, 64, 64, 4)  # a chunk longer than the recent window (rows read as INT2)
    assert not wm.supported(1, 6, 64, 64, 256)  # g not a power of two
    assert not wm.supported(1, 4, 64, 8, 256)  # fewer than 16 window slots


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("kernel", ["triton", "mosaic"])
@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("noisy", [False, True])
def test_compiled_fused_window_matches_xla_parts(kernel, n, dtype, noisy):
    if kernel == "mosaic" and not int2_mosaic.available():
        pytest.skip("the Mosaic kernel needs wgmma")
    test_fused_window_matches_xla_parts(8, 70, 20, n, dtype, noisy, interpret=False, kernel=kernel)
