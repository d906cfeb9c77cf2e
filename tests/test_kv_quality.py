"""Smoke test of benchmarks/kv_quality.py on a tiny random model.

Pins what the benchmark relies on: one forward with a tiny empty int2 cache scores exactly what a
chunked prefill through the real cache (commit included) scores, the bytes-per-token figures match the
layout arithmetic, and the evaluation loop produces a sane table (BF16 agrees with itself).
"""

import functools
import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig
from jspec.model import decoder as model, rotation

_SPEC = importlib.util.spec_from_file_location(
    "kv_quality", Path(__file__).resolve().parent.parent / "benchmarks" / "kv_quality.py")
kvq = importlib.util.module_from_spec(_SPEC)
sys.modules["kv_quality"] = kvq  # dataclasses look their module up there
_SPEC.loader.exec_module(kvq)

CFG = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, max_position=64, qk_norm=True)
KV = KVConfig("int2", sink=2, recent=4)
N = 24


def _setup():
    params = model.init_params(CFG, jax.random.key(0), std=0.3)
    tokens = np.random.default_rng(1).integers(0, CFG.vocab_size, (3, N + 1)).astype(np.int32)
    return params, tokens


@functools.partial(jax.jit, static_argnums=1)
def _prefill_step(params, cfg, tokens, cache):
    logits, (k, v) = model.forward(params, cfg, tokens, cache)
    return jax.nn.log_softmax(logits[0], -1), kvcache.commit(cache, k, v, jnp.asarray([tokens.shape[1]]))


def test_window_forward_is_the_decode_semantics():
    params, tokens = _setup()
    x = jnp.asarray(tokens[:1, :-1])
    got = np.asarray(kvq.window_logp(params, CFG, KV, x))
    cache = kvcache.init_cache(CFG, KV, 1, N, jnp.float32)
    parts = []
    for s in (0, N // 2):  # chunked prefill: the second chunk reads INT2 keys from the committed cache
        logp, cache = _prefill_step(params, CFG, x[:, s : s + N // 2], cache)
        parts.append(np.asarray(logp))
    np.testing.assert_allclose(got, np.concatenate(parts), atol=2e-4)
    bf16 = np.asarray(kvq.window_logp(params, CFG, KVConfig("bf16"), x))
    assert np.abs(got - bf16).max() > 1e-3  # INT2 reads really happen at S + R = 6 < N


def test_kv_bytes_per_token_match_the_layout():
    L, H, D = CFG.num_layers, CFG.num_kv_heads, CFG.head_dim
    bf16 = L * H * 2 * D * 2
    assert kvq.kv_bytes_per_token(CFG, KVConfig("bf16"), 2 * kvcache.ALIGN) == bf16
    assert kvq.kv_bytes_per_token(CFG, KVConfig("bf16"), 32) == bf16 * kvcache.ALIGN / 32  # rounded up
    int2 = L * H * 2 * (D // 4 + 2 * 2)  # codes + bf16 (scale, zero), K and V
    windows = L * H * 2 * (KV.sink + KV.recent) * D * 2  # BF16 sink + ring, K and V
    for T in (32, 1000):  # above max_position too: the figure is layout arithmetic, not an allocation
        assert np.isclose(kvq.kv_bytes_per_token(CFG, KV, T), int2 + windows / T)


def test_evaluate_table(tmp_path):
    params, tokens = _setup()
    extra = tmp_path / "rot.safetensors"  # an extra rotation file runs beside the built-in rotations
    rotation.save_rotations(extra, *rotation.hadamard_rotations(CFG), rotation.make_meta(CFG, "hadamard", True, 0))
    rots = kvq.rotation_sets(CFG, extra, {"variant": extra})
    vs = kvq.variants(rotations=("hadamard", "variant"), windows=((2, 4),), clips=("on",))
    assert [v.name for v in vs] == ["bf16", "int2/hadamard/clip-on/S2-R4", "int2/variant/clip-on/S2-R4"]
    res = kvq.evaluate(kvq.rotated_params(params, CFG, rots), CFG, tokens[:2], vs, log=lambda *_: None,
                       tail_from=N // 2)
    assert set(res) == {v.name for v in vs}
    assert res["bf16"]["top1_agree"] == 1.0 and abs(res["bf16"]["kl"]) < 1e-6
    for r in res.values():
        assert np.isfinite(r["ppl"]) and np.isfinite(r["ppl_tail"]) and r["kl"] >= -1e-6
        assert len(r["ppl_windows"]) == 2
    hada, same = res["int2/hadamard/clip-on/S2-R4"], res["int2/variant/clip-on/S2-R4"]
    assert hada["ppl_windows"] == same["ppl_windows"]  # the same rotations, loaded from the file
    gaps = 100 * (np.asarray(hada["ppl_windows"]) / np.asarray(res["bf16"]["ppl_windows"]) - 1)
    np.testing.assert_allclose(hada["gap_windows"]["mean"], gaps.mean(), rtol=1e-6)
    assert "gap_windows" not in res["bf16"]
    table = kvq.markdown(res, kvq.bytes_table(CFG, vs), vs)
    assert table.count("\n") == len(vs) + 1


def test_blocked_forward_is_the_window_forward():
    """kv_blocked.logp (causal query blocks, each key read once from a mixed copy plus the band) scores what
    window_logp scores, for blocks smaller and larger than the windows and per-layer settings."""
    spec = importlib.util.spec_from_file_location(
        "kv_blocked", Path(__file__).resolve().parent.parent / "benchmarks" / "kv_blocked.py")
    kvb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kvb)
    params, tokens = _setup()
    x = jnp.asarray(tokens[:1, :-1])
    for kv in (KVConfig("bf16"), KV, KVConfig("int2", sink=0, recent=9), KVConfig("int2", sink=5, recent=1)):
        want = np.asarray(kvq.window_logp(params, CFG, kv, x))
        for C in (4, 7, 64):
            got = kvb.logp(params, CFG, x, [kv if kv.int2 else None] * CFG.num_layers, C=C)
            np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)
    # per layer: only layer 1 INT2, resumed from layer 1's BF16 input, equals the full forward with that setting
    mixed = [None, KV]
    res = kvb.residuals(params, CFG, x, [None, None])
    np.testing.assert_allclose(np.asarray(kvb.logp(params, CFG, x, mixed, start=(1, res[1]))),
                               np.asarray(kvb.logp(params, CFG, x, mixed)), atol=2e-5)
