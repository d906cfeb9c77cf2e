"""The layer loop: the forward's lax.scan over the [L, ...] stacks, unrolled Options.layer_unroll layers per trip.
In float32 a rolled loop (unroll 1, the CPU's default) and a partly unrolled one (2 of 3 layers per trip) give
every step the logits and cache of the fully unrolled one (the GPU's default), for both KV modes, both commits
(jnp and the fused Pallas kernel in interpret mode), the split path with window_merge reading the window stacks
(interpret mode) and an EAGLE-3 head's taps; the engine's greedy tokens are the same with a draft, and load(scan_layers=True) rolls it."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig, Options
from jspec.model import decoder as model
from jspec.decode.state import Drafter, DraftMode

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3,
                  num_heads=4, num_kv_heads=2, head_dim=16, max_position=64)
KVS = {"bf16": KVConfig("bf16"), "int2": KVConfig("int2", sink=2, recent=4)}
_COMPILE = {"xla_backend_optimization_level": 0}


@functools.partial(jax.jit, static_argnums=(1, 5), compiler_options=_COMPILE)
def _step(params, cfg, tokens, cache, n_commit, options):
    logits, (k, v), feats = model.forward_taps(params, cfg, tokens, cache, (0, 2, 3), options=options)
    return logits, feats, kvcache.commit(cache, k, v, n_commit, options)


def _run(params, kv, options=Options()):
    """A 12-token prefill (rows commit 12 and 9), then three decode steps: logits, taps and the cache."""
    rng = np.random.default_rng(0)
    cache = kvcache.init_cache(CFG, kv, 2, 32, jnp.float32)
    out = []
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (2, 12)), jnp.int32)
    n = jnp.asarray([12, 9], jnp.int32)
    for _ in range(4):
        logits, feats, cache = _step(params, CFG, tokens, cache, n, options)
        out += [logits, feats]
        tokens, n = jnp.argmax(logits[:, -1:], -1).astype(jnp.int32), jnp.ones(2, jnp.int32)
    return out, cache


@pytest.mark.parametrize("mode", ["bf16", "int2"])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("unroll", [1, 2])
def test_a_rolled_layer_loop_matches_the_unrolled_one(mode, fused, unroll):
    if fused and mode == "bf16":
        pytest.skip("the fused commit is INT2's")
    params = model.init_params(CFG, jax.random.key(0), std=0.3)
    want, cache = _run(params, KVS[mode], Options(fused_commit=fused, layer_unroll=True))
    got, rolled = _run(params, KVS[mode], Options(fused_commit=fused, layer_unroll=unroll))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(rolled), jax.tree.leaves(cache)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 5])
def test_the_scan_hands_window_merge_each_layers_window_stacks(n, monkeypatch):
    """Through the split path with the fused window (interpret mode on the CPU): a decode (n = 1) or
    verification (n = 5) step passes window_merge the [L, ...] window stacks and the loop's layer index
    (LayerKV.window_stacks), and its logits with the loop rolled are the unrolled loop's, float32 (a wrong layer's
    window would change them)."""
    from jspec.attention import split as attention_split

    calls = []
    merge = attention_split.window_merge

    def recording_merge(qkv, win_k, *args, **kwargs):
        calls.append(win_k.ndim)
        return merge(qkv, win_k, *args, **kwargs)

    monkeypatch.setattr(attention_split, "window_merge", recording_merge)  # a spy: records what it is handed
    # 4 query heads per KV head (window_merge's least), head_dim 64 (the Triton INT2 kernel's least)
    cfg = dataclasses.replace(CFG, num_heads=8, hidden_size=128, head_dim=64)
    kv = KVConfig("int2", sink=8, recent=8)
    params = model.init_params(cfg, jax.random.key(5), std=0.3)
    prompt = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 30)), jnp.int32)
    tokens = jnp.tile(jnp.asarray([[3], [7]], jnp.int32), (1, n))

    def step(unroll):
        cache = kvcache.init_cache(cfg, kv, 2, 48, jnp.float32)
        _, (k, v) = model.forward(params, cfg, prompt, cache)
        cache = kvcache.commit(cache, k, v, jnp.asarray([30, 22], jnp.int32))
        options = Options(fused_window=True, layer_unroll=unroll)
        return model.forward(params, cfg, tokens, cache, attn_impl="pallas", options=options)[0]

    jax.clear_caches()  # the layers' jitted block traces afresh: one recorded call per trace
    want = step(True)
    assert calls == [5]  # the stacks whole [L, B, Hkv, S + W, D], not a layer's slice
    got = step(1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_engine_with_a_rolled_layer_loop_gives_the_same_greedy_tokens(mode):
    """Through the Engine at K = 3, two prompts of different lengths: target and draft with the layer loop rolled
    against unrolled. The draft is the target itself (every draft accepted: commits of K + 1 rows) and a random
    one."""
    from jspec.config import GenerateConfig, SamplingConfig
    from jspec.runtime.engine import Engine

    target = model.init_params(CFG, jax.random.key(0), std=0.3)
    dcfg = dataclasses.replace(CFG, num_layers=2)
    prompts = [list(range(3, 14)), list(range(20, 27))]
    for cfg, draft in ((CFG, target), (dcfg, model.init_params(dcfg, jax.random.key(7), std=0.3))):
        out = []
        for unroll in (True, 1):
            eng = Engine(cfg=CFG, params=target, tokenizer=None, kv=KVS[mode], dtype="float32",
                         drafter=Drafter(draft, mode=DraftMode.MODEL, model_cfg=cfg),
                         options=Options(layer_unroll=unroll))
            rows = eng.generate_ids(prompts, [SamplingConfig()] * 2, [12, 9], GenerateConfig(12, lookahead=3))
            out.append([(tokens, stats.accepted) for tokens, stats in rows])
        assert out[1] == out[0] and len(out[0][0][0]) == 12


def test_load_with_scan_layers(hf_model_dir, tmp_path, monkeypatch):
    """jspec.load(scan_layers=True), a model draft at lookahead auto (its costs measured with the loop rolled): the
    layer loop rolled (Options.layer_unroll = 1), the tokens of the default load, and every program of both
    compiled with model.SCAN_OPTIONS (the weights are slices of the stacks either way)."""
    import jspec
    from jspec.runtime import programs

    monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))
    options, compile_all = [], programs.compile_all

    def recorded(lowered, opts=None):
        options.extend(opts or [None] * len(lowered))
        return compile_all(lowered, opts)

    monkeypatch.setattr(programs, "compile_all", recorded)
    path = hf_model_dir("llama")
    load = lambda scan: jspec.load(path, draft=path, kv=jspec.KVConfig("bf16"), dtype="float32", scan_layers=scan,
                                   options=Options(layer_unroll=True))
    gen = jspec.GenerateConfig(max_new_tokens=8)
    default = load(False)
    [want] = default.generate([[5, 6, 7, 8, 9, 5, 6]], gen)
    assert default.options.unroll is True and options and all(o == model.SCAN_OPTIONS for o in options)
    options.clear()
    eng = load(True)
    assert eng.options.unroll == 1
    [got] = eng.generate([[5, 6, 7, 8, 9, 5, 6]], gen)
    assert got.token_ids == want.token_ids and got.stats.lookahead == want.stats.lookahead
    assert options and all(o == model.SCAN_OPTIONS for o in options)


def test_the_mosaic_kernel_in_a_scan_over_stacked_caches_lowers_for_cuda():
    """What the CPU can check of the GPU path: the Mosaic kernel inside a lax.scan, reading each layer of a stacked
    cache [L, B, H, ...] at the loop's index, lowers for CUDA (one kernel call site for all layers)."""
    from jspec.kernels.hopper import attention as im

    if im.plgpu is None:
        pytest.skip("needs jax's Mosaic GPU")

    def layers(q, C, P, lo, hi):
        one = lambda acc, cp: (acc + im.int2_attention_mosaic(q, *cp, lo, hi)[0], None)
        return jax.lax.scan(one, jnp.zeros(q.shape, jnp.float32), (C, P))[0]

    shapes = [((1, 2, 4, 128), jnp.bfloat16), ((3, 1, 2, 2, 512, 32), jnp.uint8), ((3, 1, 2, 4, 512, 1), jnp.bfloat16),
              ((1, 4), jnp.int32), ((1, 4), jnp.int32)]
    text = jax.jit(layers).trace(*[jax.ShapeDtypeStruct(*s) for s in shapes]).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("mosaic_gpu") >= 1 and "while" in text


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("n", [1, 5])
def test_compiled_rolled_step_matches_the_unrolled_one(n):
    """On a GPU, a decode (n = 1) and a verification (n = 5) step of a 2-layer rotated INT2 model through the
    Pallas kernels (the Mosaic kernel where wgmma exists, window_merge, the fused commit), compiled with
    SCAN_OPTIONS: the rolled layer loop's logits and cache against the unrolled one's, float32."""
    cfg = dataclasses.replace(CFG, num_layers=2, hidden_size=512, head_dim=128, max_position=4096)
    params = model.init_params(cfg, jax.random.key(3), jnp.float32, std=0.3)
    kv = KVConfig("int2", sink=16, recent=64)
    prompt = jax.random.randint(jax.random.key(4), (2, 1500), 0, cfg.vocab_size)

    def run(p, unroll):
        cache = kvcache.init_cache(cfg, kv, 2, 2048, jnp.float32, lookahead=4)
        _, (k, v) = model.forward(p, cfg, prompt, cache, attn_impl="reference")
        cache = kvcache.commit(cache, k, v, jnp.full((2,), 1500, jnp.int32))

        def step(p, t, c):
            logits, (k, v) = model.forward(p, cfg, t, c, attn_impl="pallas", options=Options(layer_unroll=unroll))
            return logits, kvcache.commit(c, k, v, jnp.full((2,), n, jnp.int32))

        tok = jnp.tile(jnp.asarray([[3], [7]]), (1, n))
        return jax.jit(step).lower(p, tok, cache).compile(compiler_options=model.compile_options())(p, tok, cache)

    # Full f32 products: the GEMMs may use TF32 by default, and their roundings differ by ~1e-3 (H200).
    with jax.default_matmul_precision("highest"):
        (want, cache), (got, rolled) = run(params, True), run(params, 1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4 * np.abs(want).max())
    for a, b in zip(jax.tree.leaves(rolled), jax.tree.leaves(cache)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("rows", [1, 3])
def test_the_bf16_head_stays_bf16_under_scan_options(rows):
    """numerics.logits_f32 compiled with SCAN_OPTIONS (XLA's Triton GEMMs off): the program's top level makes no
    f32 copy of the [E, V] head (a one-row product of unnamed algorithm made one every step), and f32 logits."""
    from jspec.numerics import logits_f32

    E, V = 4096, 32768
    x = jax.random.normal(jax.random.key(0), (rows, 1, E), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (E, V), jnp.bfloat16) * 0.05
    compiled = jax.jit(logits_f32).lower(x, w).compile(compiler_options=dict(model.SCAN_OPTIONS))
    entry = compiled.as_text().split("\nENTRY ", 1)[1].split("\n}", 1)[0]
    assert f"= f32[{E},{V}]" not in entry
    got = compiled(x, w)
    want = jnp.einsum("bne,ev->bnv", x.astype(jnp.float32), w.astype(jnp.float32), precision="highest")
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-3, atol=1e-3)


def test_engine_with_an_eagle3_head_over_a_rolled_layer_loop():
    """An EAGLE-3 head drafting from the taps of a target whose layer loop is rolled (the scan's per-layer
    residuals): the tokens and accepted drafts of the unrolled loop."""
    from jspec.config import GenerateConfig, SamplingConfig
    from jspec.model import head
    from jspec.runtime.engine import Engine

    target = model.init_params(CFG, jax.random.key(0), std=0.3)
    hcfg = head.HeadConfig(head.layer_config(CFG, 2, 1, 48), CFG.vocab_size, (0, 1, 2))
    hp = head.init_head(hcfg, jax.random.key(11), std=0.3)
    out = []
    for unroll in (True, 1):
        eng = Engine(cfg=CFG, params=target, tokenizer=None, kv=KVS["int2"], dtype="float32",
                     drafter=Drafter(head=hp, mode=DraftMode.HEAD, head_cfg=hcfg), options=Options(layer_unroll=unroll))
        rows = eng.generate_ids([list(range(3, 14))], [SamplingConfig()], [10], GenerateConfig(10, lookahead=2))
        out.append([(tokens, stats.accepted) for tokens, stats in rows])
    assert out[1] == out[0] and len(out[0][0][0]) == 10
