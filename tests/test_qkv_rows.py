"""q, k, v and the Mosaic kernel's quantised queries in one kernel (pallas/qkv_rows.py) against its reference
(model.turn and int2_mosaic_lean.prepare_imma): in interpret mode on CPU, compiled on a GPU, the model's call of
it, and a decode step's logits with and without it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import attention_split, kvcache, model
from jspec.config import KVConfig, ModelConfig
from jspec.pallas import int2_mosaic, int2_mosaic_lean, qkv_rows as qr

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=256, intermediate_size=128, num_layers=2,
                  num_heads=16, num_kv_heads=4, head_dim=64, max_position=4096)


def _layer(cfg: ModelConfig, dtype, rotated: bool, seed: int = 0):
    """One layer of random weights, with a random R_K (rounded as rotation.py rounds it) and Qwen3 norm weights."""
    lp = model.init_params(cfg, jax.random.PRNGKey(seed), dtype).layers[0]
    rng = np.random.default_rng(seed)
    D = cfg.head_dim
    if rotated:
        r = np.linalg.qr(rng.standard_normal((cfg.num_kv_heads, D, D)))[0]
        lp = lp.replace(rot_k=jnp.asarray(np.swapaxes(r, 1, 2), dtype).astype(jnp.float32))
    if cfg.qk_norm:
        lp = lp.replace(q_norm=jnp.asarray(rng.uniform(0.5, 1.5, D), dtype),
                        k_norm=jnp.asarray(rng.uniform(0.5, 1.5, D), dtype))
    return lp


def _rows(cfg, dtype, rotated, B, n, seed=0):
    """(layer, h, positions, the kernel's y, cos, sin, lohi, lo, hi) for B rows of n new tokens."""
    lp = _layer(cfg, dtype, rotated, seed)
    rng = np.random.default_rng(seed + 1)
    h = jnp.asarray(rng.standard_normal((B, n, cfg.hidden_size)), dtype)
    length = jnp.asarray(rng.integers(0, 3000, B), jnp.int32)
    pos = length[:, None] + jnp.arange(n)
    g = cfg.q_per_kv
    N = -(-g // 8) * 8
    lo, hi = attention_split.history_range(length, 1, g, KVConfig(sink=16, recent=64))
    lohi = jnp.pad(jnp.stack([lo, hi], 1), ((0, 0), (0, 0), (0, N - g))).astype(jnp.float32)
    return lp, h, pos, model.project(lp, h), *model.rope_tables(cfg, pos), lohi, lo, hi


def _close_to_qkv(got, want, dtype):
    """Equal but for the order of R_K's sum: a row element may land one rounding of dtype away (in bf16 few do;
    in float32 most, by an ulp)."""
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        ulp = 2.0 ** -7 if dtype == jnp.bfloat16 else 2.0 ** -20
        np.testing.assert_allclose(a, b, rtol=ulp, atol=ulp * np.abs(b).max())
        assert dtype == jnp.float32 or (a != b).mean() < 0.02


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("rotated", [True, False])
@pytest.mark.parametrize("n", [1, 3])
def test_rows_match_model_qkv(qk_norm, D, rotated, n, dtype=jnp.bfloat16, interpret=True):
    cfg = dataclasses.replace(CFG, head_dim=D, qk_norm=qk_norm, model_type="qwen3" if qk_norm else "llama")
    lp, h, pos, y, cos, sin, *_ = _rows(cfg, dtype, rotated, B=3, n=n)
    args = (y, cos, sin, lp.rot_k, lp.q_norm, lp.k_norm)
    got = qr.qkv_rows(*args, eps=cfg.rms_eps, interpret=interpret)
    _close_to_qkv(got, model.turn(*args, eps=cfg.rms_eps), dtype)


@pytest.mark.parametrize("split", [2, 4])
def test_rows_split_over_columns_match(split, interpret=True):
    """Programs of D / split columns each (R_K's rows of their block) give the same rows."""
    lp, h, pos, y, cos, sin, *_ = _rows(CFG, jnp.bfloat16, True, B=2, n=1)
    run = lambda s: qr.qkv_rows(y, cos, sin, lp.rot_k, split=s, interpret=interpret)
    for a, b in zip(run(split), run(1)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_prepared_queries_are_prepare_immas(D, dtype, interpret=True, exact=True):
    """The digits and row vectors equal prepare_imma's from the kernel's own q (exactly in interpret mode; model.turn's
    q may be an ulp away, and its digits with it)."""
    cfg = dataclasses.replace(CFG, head_dim=D)
    lp, h, pos, y, cos, sin, lohi, lo, hi = _rows(cfg, dtype, True, B=3, n=1, seed=D)
    q, k, v, digits, colv = qr.qkv_rows(y, cos, sin, lp.rot_k, lohi=lohi, eps=cfg.rms_eps, prepare=True,
                                        interpret=interpret)
    _close_to_qkv((q, k, v), model.turn(y, cos, sin, lp.rot_k, eps=cfg.rms_eps), dtype)
    B, H, g = 3, cfg.num_kv_heads, cfg.q_per_kv
    want_digits, want_colv, _ = int2_mosaic_lean.prepare_imma(q.reshape(B, H, g, D), lo, hi, 4096, 4, 128)
    if exact:
        np.testing.assert_array_equal(np.asarray(digits), np.asarray(want_digits))
        np.testing.assert_array_equal(np.asarray(colv), np.asarray(want_colv))
        return
    # compiled, Triton divides in div.full.f32 (not correctly rounded): a slot's fixed-point value may be one off.
    # Bytes in groups of 16: 8 high digits (signed), then the 8 low ones of the same slots.
    def fixed(d):
        x = np.asarray(d).reshape(B, H, -1, D // 8, 2, 8).astype(np.int64)
        return (x[..., 0, :] - 256 * (x[..., 0, :] > 127)) * 256 + x[..., 1, :]

    assert np.abs(fixed(digits) - fixed(want_digits)).max() <= 1
    np.testing.assert_allclose(np.asarray(colv), np.asarray(want_colv), rtol=1e-6)


@pytest.mark.parametrize("prepare", [False, True])
def test_model_qkv_fused_is_qkv_and_prepare_imma(prepare):
    """model.qkv_fused (the model's call of the kernel, lo and hi from the cache's length) against model.qkv and
    int2_attention_mosaic's own prepare_imma with attention_split's history range."""
    kv = KVConfig(sink=16, recent=64)
    lp, h, pos, *_ = _rows(CFG, jnp.bfloat16, True, B=3, n=1)
    length = pos[:, 0]
    q, k, v, prepared = model.qkv_fused(lp, CFG, h, model.rope_tables(CFG, pos), length, kv, prepare)
    _close_to_qkv((q, k, v), model.qkv(lp, CFG, h, pos), jnp.bfloat16)
    if not prepare:
        assert prepared is None
        return
    lo, hi = attention_split.history_range(length, 1, CFG.q_per_kv, kv)
    want = int2_mosaic_lean.prepare_imma(q.reshape(3, CFG.num_kv_heads, CFG.q_per_kv, -1), lo, hi, 4096, 4, 128)
    for a, b in zip(prepared, want[:2]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_digit_matrix_is_a_scaled_selection():
    """Each column picks one head dimension, scaled by a power of two, and every slot appears twice."""
    for D in (64, 128):
        m = qr.digit_matrix(D)
        assert ((m != 0).sum(0) == 1).all() and ((m != 0).sum(1) == 2).all()
        nz = m[m != 0]
        assert np.array_equal(nz, 2.0 ** np.round(np.log2(nz)))


@pytest.mark.parametrize("options", [dict(prepare=True), dict(split=4)])
def test_rows_kernel_lowers_for_cuda(options):
    cfg = CFG
    lp, h, pos, y, cos, sin, lohi, *_ = _rows(cfg, jnp.bfloat16, True, B=2, n=1)
    lohi = lohi if options.get("prepare") else None
    fn = lambda *a: qr.qkv_rows(*a, eps=cfg.rms_eps, interpret=False, **options)
    text = jax.jit(fn).trace(y, cos, sin, lp.rot_k, None, None, lohi).lower(lowering_platforms=("cuda",)).as_text()
    assert "qkv_rows" in text and "triton" in text


def test_fused_rows_only_where_the_lean8_body_runs(monkeypatch):
    """Off by default; on, not off the GPU, for verification chunks, the reference path or g > 8."""
    assert attention_split.FUSED_ROWS is None
    monkeypatch.setattr(attention_split, "FUSED_ROWS", "prepared")
    kv = KVConfig(sink=16, recent=64)
    cache = kvcache.init_cache(CFG, kv, batch=1, capacity=512, lookahead=4)
    on_gpu = jax.default_backend() == "gpu" and int2_mosaic.available()
    assert attention_split.fused_rows(1, 4, 64, cache.layers[0], kv, "pallas") == ("prepared" if on_gpu else None)
    assert not attention_split.fused_rows(5, 4, 64, cache.layers[0], kv, "pallas")
    assert not attention_split.fused_rows(1, 4, 64, cache.layers[0], kv, "reference")
    assert not attention_split.fused_rows(1, 32, 64, cache.layers[0], kv, "pallas")


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_compiled_rows_match_model_qkv(D, qk_norm, dtype):
    test_rows_match_model_qkv(qk_norm, D, True, 1, dtype=dtype, interpret=False)
    if D == 128 and not qk_norm and dtype == jnp.bfloat16:
        test_rows_split_over_columns_match(4, interpret=False)
    if not qk_norm:
        test_prepared_queries_are_prepare_immas(D, dtype, interpret=False, exact=False)


@pytest.mark.gpu
@pytest.mark.skipif(not int2_mosaic.available(), reason="needs a Hopper GPU (wgmma) and Mosaic GPU")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("mode", ["rows", "prepared"])
def test_decode_step_with_fused_rows_matches_xla_rows(dtype, mode, monkeypatch):
    """A decode step of a 2-layer rotated INT2 model through the Mosaic kernel: logits with q, k, v (and with
    "prepared" the quantised queries) from qkv_rows against model.qkv + prepare_imma, from the same cache."""
    cfg = dataclasses.replace(CFG, head_dim=128, hidden_size=512)
    params = model.init_params(cfg, jax.random.PRNGKey(3), dtype)
    params = params.replace(layers=tuple(lp.replace(rot_k=_layer(cfg, dtype, True, i).rot_k)
                                         for i, lp in enumerate(params.layers)))
    kv = KVConfig(sink=16, recent=64)
    cache = kvcache.init_cache(cfg, kv, batch=2, capacity=2048, lookahead=4)
    prompt = jax.random.randint(jax.random.PRNGKey(4), (2, 1500), 0, cfg.vocab_size)
    _, (k, v) = model.forward(params, cfg, prompt, cache, attn_impl="reference")
    cache = kvcache.commit(cache, k, v, jnp.full((2,), 1500, jnp.int32))
    step = lambda: jax.jit(lambda p, t, c: model.forward(p, cfg, t, c, attn_impl="pallas")[0])
    tok = jnp.asarray([[3], [7]])
    xla = step()(params, tok, cache)
    monkeypatch.setattr(attention_split, "FUSED_ROWS", mode)  # read while tracing: a new jit
    assert "qkv_rows" in str(jax.make_jaxpr(step())(params, tok, cache))
    fused = step()(params, tok, cache)
    tol = 2e-2 if dtype == jnp.bfloat16 else 1e-4
    np.testing.assert_allclose(np.asarray(fused), np.asarray(xla), rtol=tol, atol=tol * np.abs(np.asarray(xla)).max())
