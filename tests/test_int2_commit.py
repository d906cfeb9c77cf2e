"""The fused INT2 commit (jspec/pallas/int2_commit.py) against kvcache.commit_layer: the same buffers bit
for bit (interpret mode on the CPU), masked slots included; a whole decode with it gives the same greedy
tokens; its Triton kernel lowers for CUDA; on a GPU, the compiled kernel against the jnp commit."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig, Options
from jspec.kernels import int2_commit
from jspec.model import decoder as model

B, n, H, D, S, W, T = 2, 5, 2, 32, 2, 4, 24


def _case(seed, sdt, clips, dtype=jnp.bfloat16):
    """A layer cache with random contents, rows to commit, slots with some out of range, and its KVConfig."""
    rng = np.random.default_rng(seed)
    kv = KVConfig("int2", sink=S, recent=W, clip_k=clips[0], clip_v=clips[1])
    layer = kvcache.LayerKV(
        k=jnp.asarray(rng.normal(size=(B, H, S + W, D)), dtype), v=jnp.asarray(rng.normal(size=(B, H, S + W, D)), dtype),
        codes=jnp.asarray(rng.integers(0, 256, (B, H, 2, T, D // 4)), jnp.uint8),
        qparams=jnp.asarray(rng.normal(size=(B, H, 4, T, 1)), sdt), pinned_slots=S)
    k = jnp.asarray(rng.normal(size=(B, n, H, D)) * rng.uniform(0.1, 3, (B, n, H, 1)), dtype)
    v = jnp.asarray(rng.normal(size=(B, n, H, D)), dtype)
    slot = jnp.asarray([[0, 3, 5, S + W, S + W], [1, 2, S + W, 4, S + W]], jnp.int32)  # S + W: dropped
    hist = jnp.asarray([[3, 4, 5, T, T], [0, 7, T, 9, 23]], jnp.int32)  # T: dropped
    return layer, k, v, slot, hist, kv


def _fused(layer, k, v, slot, hist, kv, interpret=True, **opts):
    """The kernel for one layer (stacks of L = 1)."""
    stacks = tuple(x[None] for x in (layer.k, layer.v, layer.codes, layer.qparams))
    bufs = int2_commit.commit_int2(stacks, k[None], v[None], slot, hist, clip_k=kv.clips[0], clip_v=kv.clips[1],
                                   planes=kvcache.INT2_PLANES, interpret=interpret, **opts)
    return dataclasses.replace(layer, **dict(zip(("k", "v", "codes", "qparams"), (x[0] for x in bufs))))


@pytest.mark.parametrize("sdt", [jnp.bfloat16, jnp.float32], ids=["bf16_scales", "f32_scales"])
@pytest.mark.parametrize("clips", [(0.96, 0.92), (0.0, 0.5), (1.0, 0.0)], ids=["clip", "clip_v_only", "noclip_k"])
def test_fused_commit_equals_commit_layer(sdt, clips):
    args = _case(0, sdt, clips)
    want = kvcache.commit_layer(*args[:5], kv=args[5])
    got = _fused(*args)
    for name in ("k", "v", "codes", "qparams"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name)
    assert not np.array_equal(np.asarray(want.codes), np.asarray(args[0].codes))  # the commit wrote something


def test_fused_commit_in_a_whole_decode_gives_the_same_tokens():
    """Prefill, then greedy decode steps through model.forward and kvcache.commit, float32: the fused
    commit (Options.fused_commit: one kernel for the three layers) and the jnp one give the same tokens and the
    same cache."""
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_position=64)
    kv = KVConfig("int2", sink=2, recent=4)
    params = model.init_params(cfg, jax.random.key(0), std=0.3)
    prompt = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 12)), jnp.int32)

    def step(cache, tokens, options):
        logits, (k, v) = model.forward(params, cfg, tokens, cache)
        return jnp.argmax(logits[:, -1], -1), kvcache.commit(cache, k, v, jnp.full((2,), tokens.shape[1]), options)

    def run(fused):
        options = Options(fused_commit=fused)
        tok, cache = step(kvcache.init_cache(cfg, kv, 2, 32, jnp.float32), prompt, options)
        toks = [tok]
        for _ in range(8):
            tok, cache = step(cache, toks[-1][:, None], options)
            toks.append(tok)
        return np.stack(toks, 1), cache

    (t0, c0), (t1, c1) = run(False), run(True)
    np.testing.assert_array_equal(t1, t0)
    for a, b in zip(jax.tree.leaves(c1), jax.tree.leaves(c0)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _layers_case(L, seed=0, sdt=jnp.bfloat16, dtype=jnp.bfloat16):
    cases = [_case(seed + j, sdt, (0.96, 0.92), dtype) for j in range(L)]
    bufs = tuple(jnp.stack([getattr(c[0], name) for c in cases]) for name in ("k", "v", "codes", "qparams"))
    return cases, bufs, jnp.stack([c[1] for c in cases]), jnp.stack([c[2] for c in cases])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_all_layers_commit_equals_commit_layer_per_layer(dtype):
    """commit_int2 over three layers' [L, ...] stacks: each layer's buffers as commit_layer writes them, bit for
    bit."""
    cases, bufs, k, v = _layers_case(3, dtype=dtype)
    slot, hist, kv = cases[0][3:]
    got = int2_commit.commit_int2(bufs, k, v, slot, hist, clip_k=kv.clips[0], clip_v=kv.clips[1],
                                  planes=kvcache.INT2_PLANES, interpret=True)
    for i, c in enumerate(cases):
        want = kvcache.commit_layer(*c[:5], kv=kv)
        for x, name in zip(got, ("k", "v", "codes", "qparams")):
            np.testing.assert_array_equal(np.asarray(x[i]), np.asarray(getattr(want, name)))


def test_fused_commit_lowers_for_cuda():
    """The Triton kernel itself (not the interpreter) lowers: what the CPU can check of the GPU path."""
    cases, bufs, k, v = _layers_case(2)
    slot, hist, kv = cases[0][3:]
    fn = lambda *a: int2_commit.commit_int2(*a, clip_k=kv.clips[0], clip_v=kv.clips[1], planes=kvcache.INT2_PLANES)
    assert "triton" in jax.jit(fn).trace(bufs, k, v, slot, hist).lower(lowering_platforms=("cuda",)).as_text()


def test_prefill_with_the_fused_commit_leaves_the_jnp_cache(monkeypatch):
    """decode.prefill's fused commit (one kernel for the three layers, interpret mode) leaves the cache the jnp
    commit leaves, float32, over two prefill chunks."""
    from conftest import VOCAB, tiny_tokenizer

    from jspec.config import GenerateConfig, SamplingConfig
    from jspec.decode import loop as decode
    from jspec.io import tokenizer
    from jspec.runtime import engine

    cfg = ModelConfig("llama", VOCAB, 32, 64, 3, 4, 2, 8, max_position=128)
    tok = tokenizer.Tokenizer(tiny_tokenizer().backend_tokenizer, {"eos_token": "</s>"})
    ids = [[(5 * i + 3) % VOCAB for i in range(13)]]

    def start(fused):
        eng = engine.Engine(cfg, model.init_params(cfg, jax.random.key(0), std=0.3), tok, KVConfig("int2", sink=2,
                            recent=4), dtype="float32", options=Options(fused, prefill_chunk=8))
        args = eng.prepare(ids, [SamplingConfig()], [4], GenerateConfig(lookahead=0))
        return decode.start_program(*args).cache

    got, want = start(True), start(False)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(got.length[0]) == 13


def test_the_commit_of_all_layers_lowers_to_one_kernel():
    """The fused commit over four layers' stacks: one call of one Triton kernel. Traced as on a GPU (not in
    interpret mode), lowered for CUDA."""
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_position=64)
    cache = kvcache.init_cache(cfg, KVConfig("int2", sink=2, recent=4), 1, 32, jnp.bfloat16)
    rows = jnp.ones((4, 1, 1, 2, 16), jnp.bfloat16)
    options = Options(platform="gpu")
    commit = jax.jit(lambda c, k, v: kvcache.commit(c, k, v, jnp.ones((1,), jnp.int32), options))
    text = commit.trace(cache, rows, rows).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"call @(commit_int2\w*)", text) == ["commit_int2"]
    assert text.count("__gpu$xla.gpu.triton(") == 1


def test_fused_commit_refuses_groups_smaller_than_a_row():
    layer, k, v, slot, hist, kv = _case(0, jnp.bfloat16, (0.96, 0.92))
    with pytest.raises(ValueError, match="one group per row"):
        _fused(dataclasses.replace(layer, qparams=jnp.zeros((B, H, 4, T, 2), jnp.bfloat16)), k, v, slot, hist, kv)


def test_the_fused_commit_is_the_default_on_one_gpu_only():
    """Options.fused_commit None: on a GPU outside a mesh (GSPMD cannot split the kernel), never on the CPU,
    nor for BF16 caches or groups smaller than a row; True and False force it."""
    layer, *_, kv = _case(0, jnp.bfloat16, (0.96, 0.92))
    grouped = dataclasses.replace(layer, qparams=jnp.zeros((B, H, 4, T, 2), jnp.bfloat16))
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("dp", "tp"))
    on = lambda kv=kv, layer=layer, switch=None, platform="gpu": kvcache._fused_commit(  # noqa: E731
        kv, layer, Options(fused_commit=switch, platform=platform))
    assert Options().fused_commit is None and on(platform=None) == (jax.default_backend() == "gpu")
    assert on() and not on(layer=grouped) and not on(kv=KVConfig("bf16"))
    with jax.set_mesh(mesh):
        assert not on()
    assert not on(switch=False)
    assert not on(platform="cpu") and on(switch=True, platform="cpu") and not on(layer=grouped, switch=True)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("sdt", [jnp.bfloat16, jnp.float32], ids=["bf16_scales", "f32_scales"])
@pytest.mark.parametrize("warps", [int2_commit.WARPS, 4])
def test_compiled_fused_commit_matches_commit_layer(sdt, warps):
    """Compiled: window rows exact; scales and zeros to a rounding of their dtype; codes equal but where a
    value sits on a rounding boundary (the kernel's division may round differently from XLA's). The jnp
    commit_layer, not the kernel it picks by default on a GPU."""
    args = _case(3, sdt, (0.96, 0.92))
    want = kvcache.commit_layer(*args[:5], kv=args[5], options=Options(fused_commit=False))
    got = _fused(*args, interpret=False, warps=warps)
    for name in ("k", "v"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)))
    rtol = 2.0 ** -7 if sdt == jnp.bfloat16 else 1e-6
    np.testing.assert_allclose(np.asarray(got.qparams, np.float32), np.asarray(want.qparams, np.float32), rtol=rtol)
    assert np.mean(np.asarray(got.codes) != np.asarray(want.codes)) < 0.01


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_compiled_all_layers_commit_matches_commit_layer(dtype):
    """Compiled, three layers: each as the jnp commit_layer writes it, to the tolerances of the test above."""
    cases, bufs, k, v = _layers_case(3, seed=3, dtype=dtype)
    slot, hist, kv = cases[0][3:]
    got = int2_commit.commit_int2(bufs, k, v, slot, hist, clip_k=kv.clips[0], clip_v=kv.clips[1],
                                  planes=kvcache.INT2_PLANES)
    for i, c in enumerate(cases):
        g = [x[i] for x in got]
        want = kvcache.commit_layer(*c[:5], kv=kv, options=Options(fused_commit=False))
        np.testing.assert_array_equal(np.asarray(g[0]), np.asarray(want.k))
        np.testing.assert_array_equal(np.asarray(g[1]), np.asarray(want.v))
        np.testing.assert_allclose(np.asarray(g[3], np.float32), np.asarray(want.qparams, np.float32), rtol=2.0**-7)
        assert np.mean(np.asarray(g[2]) != np.asarray(want.codes)) < 0.01


def test_a_stack_past_int32_offsets_commits_with_jnp(monkeypatch):
    """The fused kernel indexes the whole [L, ...] stacks with int32 offsets: a stack of MAX_INDEXED elements or
    more commits with jnp (the same cache), the fused kernel never called. Here the limit is lowered to the test's
    codes stack."""
    from jspec.kernels import common

    cases, bufs, k, v = _layers_case(3)
    slot, hist, kv = cases[0][3:]
    layers = kvcache.LayerKV(*bufs, pinned_slots=S)
    cache = kvcache.KVCache(layers=layers, length=jnp.zeros((B,), jnp.int32), kv=kv, capacity=T)
    n_commit = jnp.full((B,), n, jnp.int32)
    want = kvcache.commit(cache, k, v, n_commit, Options(fused_commit=False))
    monkeypatch.setattr(common, "MAX_INDEXED", layers.codes.size)
    monkeypatch.setattr(kvcache, "_commit_fused", lambda *a, **kw: pytest.fail("the fused kernel was called"))
    got = kvcache.commit(cache, k, v, n_commit, Options(fused_commit=True))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
def test_a_commit_into_a_stack_of_over_2_31_bytes_writes_its_own_slots():
    """The 8B shape's codes stack at batch 1 / 128K (32 layers, 8 KV heads, 131216 slots: 2.15e9 bytes, past int32
    offsets; the fused kernel wrote at wrapped offsets there: an illegal address on an H100): one row committed to
    the last layer's last history slot by kvcache.commit lands there and nowhere else."""
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=1024, intermediate_size=64, num_layers=32,
                      num_heads=32, num_kv_heads=8, head_dim=128, max_position=140000)
    kv = KVConfig("int2", sink=64, recent=256)
    cache = kvcache.init_cache(cfg, kv, 1, 131216, jnp.bfloat16)
    assert cache.layers.codes.size >= 2**31
    T = cache.layers.codes.shape[-2]
    cache = cache.replace(length=jnp.full((1,), T - 1, jnp.int32))
    rng = np.random.default_rng(0)
    k, v = (jnp.asarray(rng.normal(size=(32, 1, 1, 8, 128)), jnp.bfloat16) for _ in range(2))
    got = jax.jit(lambda c: kvcache.commit(c, k, v, jnp.ones((1,), jnp.int32), Options(platform="gpu")))(cache)
    codes = got.layers.codes
    want = kvcache.quantize_kv(k[31, 0, 0], v[31, 0, 0], kv, cache.layers.qparams.dtype)[0]
    # codes equal but where a value sits on a rounding boundary (4 of 512 on an H100), as the compiled tests above
    assert np.mean(np.asarray(codes[31, 0, :, :, T - 1]) != np.asarray(want)) < 0.01
    assert not bool(jnp.any(codes[:, :, :, :, : T - 1]))  # nothing written elsewhere
