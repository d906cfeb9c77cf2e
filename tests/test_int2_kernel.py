"""The INT2 history attention kernel (interpret mode on CPU) and attend_split against the references,
and the whole Pallas path giving the reference path's greedy tokens on the shipped pair."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.attention import rule as attention, split as attention_split
from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig
from jspec.kernels import common, int2_triton as ia, reference
from jspec.runtime import engine


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _kernel_inputs(seed, B, H, M, D, T, scale_dtype, groups=1):
    """Random codes/scales in the cache's layout and per-row ranges; some rows get an empty range."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, H, M, D)), jnp.bfloat16)
    codes = jnp.asarray(rng.integers(0, 256, (B, H, 2, T, D // 4)), jnp.uint8)
    scale = rng.uniform(0.05, 0.5, (B, H, 2, 1, T, groups))
    zero = rng.uniform(0.0, 3.0, (B, H, 2, 1, T, groups))
    qparams = jnp.asarray(np.concatenate([scale, zero], 3).reshape(B, H, 4, T, groups), scale_dtype)
    lo = rng.integers(0, max(1, T // 4), (B, M))
    hi = rng.integers(0, T + 1, (B, M))
    hi[0, ::4] = lo[0, ::4]  # empty ranges (batch row 0 only, so that some rows stay live)
    return q, codes, qparams, jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32)


def _check_kernel(args, *, words=False, interpret=True, **options):
    ref_out, ref_lse = reference.int2_attention_reference(*args)
    config = ia.config_for(args[0].shape[2], **options)
    out, lse = ia.int2_attention(*args, config=config, words=words, interpret=interpret)
    out, lse, ref_lse = np.asarray(out), np.asarray(lse), np.asarray(ref_lse)
    empty = np.asarray(args[4] <= args[3])  # [B, M]
    assert np.all(np.isfinite(out))
    assert np.all(lse[:, :, :][np.broadcast_to(empty[:, None], lse.shape)] == -np.inf)
    assert np.all(out[np.broadcast_to(empty[:, None], lse.shape)] == 0)
    live = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), live)
    assert _rel(out, ref_out) <= 1e-2
    np.testing.assert_allclose(lse[live], ref_lse[live], atol=2e-2, rtol=1e-3)


# (D, query heads per KV head, query positions n, T, scale dtype, unpack uint32 words, options)
KERNEL_CASES = [
    (128, 4, 5, 300, jnp.bfloat16, False, dict(block_t=64, num_splits=3)),
    (64, 8, 6, 200, jnp.float32, False, dict(block_t=32)),
    (128, 1, 1, 77, jnp.bfloat16, True, dict(block_t=64, num_splits=2)),
    (64, 4, 1, 10, jnp.bfloat16, False, {}),
    (128, 8, 6, 150, jnp.float32, True, dict(block_t=32, block_m=16, num_splits=2)),
    (128, 4, 1, 300, jnp.bfloat16, True, dict(min_rows=4, block_t=64, num_splits=3)),  # decode tile, no padding
    (64, 8, 1, 130, jnp.float32, False, dict(min_rows=8, block_t=32, num_splits=2)),
]


@pytest.mark.parametrize("D,g,n,T,sdt,words,options", KERNEL_CASES)
def test_kernel_matches_reference(D, g, n, T, sdt, words, options):
    args = _kernel_inputs(D + g + n + T, 2, 2, g * n, D, T, sdt)
    _check_kernel(args, words=words, **options)


def test_group_smaller_than_row_falls_back_to_reference():
    args = _kernel_inputs(7, 1, 2, 4, 64, 40, jnp.bfloat16, groups=4)
    out, lse = ia.int2_attention(*args, interpret=True)
    ref_out, ref_lse = reference.int2_attention_reference(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), rtol=1e-6, atol=1e-6)


def test_merge_lse_of_a_split_equals_the_whole():
    args = _kernel_inputs(3, 1, 1, 16, 64, 64, jnp.float32)
    lo, hi = args[3], args[4]
    mid = (lo + hi) // 2
    first = reference.int2_attention_reference(*args[:3], lo, jnp.maximum(mid, lo))
    second = reference.int2_attention_reference(*args[:3], jnp.maximum(mid, lo), hi)
    whole = reference.int2_attention_reference(*args)
    out, lse = common.merge_lse(jnp.stack([first[0], second[0]], 2), jnp.stack([first[1], second[1]], 2), axis=2)
    np.testing.assert_allclose(np.asarray(out), np.asarray(whole[0]), rtol=1e-4, atol=1e-5)


# --- attend_split on a real cache -----------------------------------------------------------------

CFG = ModelConfig(model_type="llama", vocab_size=32, hidden_size=256, intermediate_size=64, num_layers=1,
                  num_heads=8, num_kv_heads=2, head_dim=64, max_position=256)


def _rows(rng, B, n, H, D, dtype=jnp.float32):
    # f32 queries: attend_reference's bf16 x bf16 -> f32 value dot has no XLA:CPU kernel.
    return jnp.asarray(rng.standard_normal((B, n, H, D)), dtype)


@pytest.fixture(scope="module")
def cache():
    """One layer, sink 4, recent 8; row 0 holds 40 committed tokens, row 1 none (a fresh prefill)."""
    kv = KVConfig(sink=4, recent=8)
    c = kvcache.init_cache(CFG, kv, batch=2, capacity=96, lookahead=4)
    rng = np.random.default_rng(11)
    k, v = _rows(rng, 2, 40, 2, 64, jnp.bfloat16), _rows(rng, 2, 40, 2, 64, jnp.bfloat16)
    return kv, kvcache.commit(c, k[None], v[None], jnp.asarray([40, 0], jnp.int32))


@pytest.mark.parametrize("n", [1, 5, 20])  # decode, K=4 verification, a chunk longer than R
@pytest.mark.parametrize("noisy", [False, True])  # with Layer.key_noise: the INT2 scores' bias taken out
def test_attend_split_matches_reference(cache, n, noisy):
    kv, c = cache
    rng = np.random.default_rng(n)
    q, k, v = _rows(rng, 2, n, 8, 64), _rows(rng, 2, n, 2, 64), _rows(rng, 2, n, 2, 64)
    layer = c.layer(0)
    key_noise = jnp.asarray([0.5, 2.0]) if noisy else None
    ref = attention.attend_reference(q, k, v, layer, c.length, kv, key_noise)
    split = jax.jit(attention_split.attend_split, static_argnames=("kv", "interpret", "block_t"))
    out = split(q, k, v, layer, c.length, kv=kv, interpret=True, block_t=16, key_noise=key_noise)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, ref) <= 1e-2
    if noisy:  # the shift moves row 0's outputs (its history is INT2), not row 1's (it has none before the chunk)
        plain = attention.attend_reference(q, k, v, layer, c.length, kv)
        assert _rel(ref[0], plain[0]) > 0.05
        if n <= kv.recent:  # a longer chunk reads its own oldest rows as INT2
            np.testing.assert_allclose(ref[1], plain[1], rtol=1e-6, atol=1e-6)


def test_noise_shift_takes_the_bias_of_noisy_keys_out():
    """Keys read with Gaussian noise of variance sigma^2 per coordinate: over many noise draws, the mean weight
    of a noisy key is exp(||q||^2 sigma^2 / (2 D)) times its exact weight (what noise_shift gives), and
    attention over noisy keys minus the shift is closer to the exact output than without it."""
    rng = np.random.default_rng(0)
    D, T, draws, sigma2 = 64, 200, 400, 0.3
    q = jnp.asarray(rng.standard_normal((1, 1, 1, D)), jnp.float32)  # [B, n, H, D]
    keys = jnp.asarray(rng.standard_normal((T, D)), jnp.float32)
    shift = attention_split.noise_shift(q, jnp.asarray([sigma2]), axis=2)[0, 0, 0]
    np.testing.assert_allclose(shift, float(jnp.sum(q**2)) * sigma2 / (2 * D), rtol=1e-6)
    noisy = keys[None] + np.sqrt(sigma2) * rng.standard_normal((draws, T, D)).astype(np.float32)
    ratio = jnp.exp((noisy - keys) @ q[0, 0, 0] / np.sqrt(D)).mean()  # the mean inflation of a weight
    np.testing.assert_allclose(np.log(float(ratio)), float(shift), rtol=0.15)
    # a BF16 window of 8 exact keys beside the noisy history: without the shift the history takes too much weight
    s_hist, s_win = noisy @ q[0, 0, 0] / np.sqrt(D), keys[:8] @ q[0, 0, 0] / np.sqrt(D)
    exact = jax.nn.softmax(jnp.concatenate([keys @ q[0, 0, 0] / np.sqrt(D), s_win]))
    err = lambda c: float(jnp.mean(jnp.abs(jax.vmap(lambda s: jax.nn.softmax(jnp.concatenate([s - c, s_win])))(
        s_hist)[:, T:].sum(-1) - exact[T:].sum())))  # the window's share of the weight, off by
    assert err(shift) < 0.5 * err(0.0)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("words", [False, True])
def test_compiled_kernel_matches_reference(words):
    args = _kernel_inputs(0, 4, 8, 20, 128, 5000, jnp.bfloat16)
    _check_kernel(args, words=words, interpret=False)
    _check_kernel(_kernel_inputs(1, 2, 8, 40, 128, 3001, jnp.float32), words=words, interpret=False,
                  num_splits=4)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("g,min_rows,num_warps", [(4, 4, 1), (4, 8, 2), (8, 8, 1), (4, 16, 4)])
def test_compiled_decode_tiles_match_reference(g, min_rows, num_warps):
    """Decode row tiles smaller than the 16-row mma tile (M = g query heads, one position)."""
    args = _kernel_inputs(2, 2, 8, g, 128, 4099, jnp.bfloat16)
    _check_kernel(args, words=True, interpret=False, min_rows=min_rows, num_warps=num_warps, block_t=64)


def test_unmerged_splits_merge_to_the_merged_result():
    args = _kernel_inputs(5, 2, 2, 20, 64, 200, jnp.float32)
    config = ia.config_for(20, block_t=32, num_splits=3, block_m=8)
    out, lse = ia.int2_attention(*args, config=config, interpret=True)
    parts = ia.int2_attention(*args, config=config, interpret=True, merge=False)
    assert parts[0].shape == (2, 2, 3, 20, 64) and parts[1].shape == (2, 2, 3, 20)
    merged, merged_lse = common.merge_lse(*parts, axis=2)
    np.testing.assert_allclose(np.asarray(merged), np.asarray(out), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(merged_lse), np.asarray(lse))


@pytest.mark.skipif(not engine.DEFAULT_TARGET.is_dir(), reason="shipped checkpoints absent")
def test_shipped_pair_greedy_tokens_equal_with_kernel_and_reference():
    # Small windows so that most of the prompt is read from the INT2 history. The n-gram drafter (no draft
    # model to compile) still makes every round a K + 1 = 3-token verify.
    kv = jspec.KVConfig("int2", sink=4, recent=8)
    gen = jspec.GenerateConfig(max_new_tokens=8, lookahead=2)
    prompt = ("import os\nimport sys\n\n\ndef main(argv):\n    \"\"\"Parse the command line and run.\"\"\"\n"
              "    parser = argparse.ArgumentParser(description=__doc__)\n    parser.add_argument(")
    tokens = {}
    for impl in ("reference", "pallas"):
        eng = jspec.load(draft="ngram", kv=kv, dtype="float32", attn_impl=impl)
        [r] = eng.generate([prompt], gen)
        tokens[impl] = r.token_ids
        assert r.stats.lookahead == 2 and r.stats.rounds >= 1
    assert len(eng.encode(prompt)) > 4 + 8 + 16  # the INT2 history is really read
    assert tokens["pallas"] == tokens["reference"]
