"""The mixed KV cache (jspec/kvcache.py) under the attention rule (jspec/attention.py).

Invariants: cached decode == one full forward; chunking a prefill changes nothing; dead slots past a
row's length are never read; with S + R covering the sequence INT2 mode is BF16 mode; a masked commit
writes only the rows it is given the count of. One tiny float32 model with two layers; every test uses
the same few forward shapes (24, 8, 5 and 1 tokens) so that each compiles once.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import layers_of
from jspec.cache import kvcache
from jspec.config import ConfigError, KVConfig, ModelConfig, model_config_from_hf
from jspec.int2 import quant
from jspec.model import decoder as model

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, max_position=64)
BF16 = KVConfig("bf16")
INT2 = KVConfig("int2", sink=2, recent=4, group_size=8)  # INT2 is read from t = S + R = 6 on
WIDE = KVConfig("int2", sink=4, recent=20, group_size=8)  # S + R = N: every read is BF16
KVS = {"bf16": BF16, "int2": INT2}
N, CAP = 24, 32  # tokens per row, cache capacity
LENS = np.array([N, 17], np.int32)  # per-row lengths of the batch (rows are right-padded)
# Compile without LLVM optimization: the same XLA programs for a fraction of the CPU time.
_COMPILE = {"xla_backend_optimization_level": 0}


@functools.cache
def _params():
    # std 0.3: attention far from uniform, so that reading a key in INT2 instead of BF16 shows.
    return model.init_params(CFG, jax.random.key(0), std=0.3)


@functools.cache
def _tokens():
    return jnp.asarray(np.random.default_rng(1).integers(0, CFG.vocab_size, (2, N)), jnp.int32)


@functools.partial(jax.jit, static_argnums=1, compiler_options=_COMPILE)
def _step(params, cfg, tokens, cache, n_commit):
    """One forward of tokens [B, n] at cache.length, then the masked commit of n_commit [B] rows."""
    logits, (k, v) = model.forward(params, cfg, tokens, cache)
    return logits, kvcache.commit(cache, k, v, n_commit)


def _empty(kv, batch=2):
    return kvcache.init_cache(CFG, kv, batch, CAP, jnp.float32)


def _full(kv):
    """Logits [B, N, V] of one forward over all N tokens (empty cache: the rule inside one chunk)."""
    return np.asarray(_step(_params(), CFG, _tokens(), _empty(kv), jnp.zeros(2, jnp.int32))[0])


def _prefill(cache, chunks, lens=LENS):
    """Feeds _tokens() in chunks of the given sizes, committing only each row's first lens[b] tokens.

    Returns the logits [B, N, V] of every fed position and the cache.
    """
    out, start = [], 0
    for c in chunks:
        n = jnp.asarray(np.clip(lens - start, 0, c), jnp.int32)
        logits, cache = _step(_params(), CFG, _tokens()[:, start : start + c], cache, n)
        out.append(np.asarray(logits))
        start += c
    assert start == N
    return np.concatenate(out, 1), cache


def _decode(cache, steps):
    """Feeds each row's next token (_tokens() at its length) one at a time; logits [B, steps, V]."""
    out = []
    for _ in range(steps):
        tok = jnp.take_along_axis(_tokens(), jnp.minimum(cache.length, N - 1)[:, None], 1)
        logits, cache = _step(_params(), CFG, tok, cache, jnp.ones(2, jnp.int32))
        out.append(np.asarray(logits[:, 0]))
    return np.stack(out, 1), cache


def _prompted(kv, prompt=(8, 3)):
    """A cache after prefilling prompts of different lengths (one chunk of 8, padded)."""
    cache = _empty(kv)
    prompt = jnp.asarray(prompt, jnp.int32)
    logits, cache = _step(_params(), CFG, _tokens()[:, :8], cache, prompt)
    return np.asarray(logits), cache


@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_cached_decode_equals_full_forward(mode):
    kv = KVS[mode]
    full = _full(kv)
    prefill, cache = _prompted(kv, (8, 3))
    np.testing.assert_allclose(prefill[0], full[0, :8], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(prefill[1, :3], full[1, :3], rtol=1e-5, atol=1e-5)
    steps, cache = _decode(cache, N - 8)  # row 0 decodes 8..23, row 1 decodes 3..18
    np.testing.assert_array_equal(np.asarray(cache.length), [N, N - 5])
    np.testing.assert_allclose(steps[0], full[0, 8:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(steps[1], full[1, 3 : N - 5], rtol=1e-5, atol=1e-5)
    if not kv.int2:  # with a BF16 cache, no cache at all is the same model
        plain, _ = model.forward(_params(), CFG, _tokens())
        np.testing.assert_allclose(np.asarray(plain), full, rtol=1e-5, atol=1e-5)


def test_int2_is_really_read():
    # The windows are small enough that the rule reads INT2 keys, first at t = S + R (key p = S): the
    # logits move there and not before, which pins both ends of the rule.
    diff = np.abs(_full(INT2) - _full(BF16)).max(axis=(0, 2))  # [N]
    S_R = INT2.sink + INT2.recent
    assert diff[:S_R].max() < 1e-5
    assert diff[S_R] > 1e-2


def _assert_caches_close(a: kvcache.KVCache, b: kvcache.KVCache, lens):
    """Live slots of two caches agree (positions < lens[b]; ring slots holding those positions)."""
    np.testing.assert_array_equal(np.asarray(a.length), np.asarray(b.length))
    for la, lb in zip(layers_of(a), layers_of(b)):
        pa, pb = la.parts(), lb.parts()
        for name in ("pinned_k", "pinned_v", "ring_k", "ring_v"):
            x, y = np.asarray(pa[name]), np.asarray(pb[name])
            for r, n in enumerate(lens):
                live = _live_slots(name, x.shape[2], n, la.pinned_slots)
                np.testing.assert_allclose(x[r, :, live], y[r, :, live], rtol=1e-5, atol=1e-5, err_msg=name)
        if a.kv.int2:
            for kind in "kv":
                for r, n in enumerate(lens):
                    ca, cb = np.asarray(pa[f"codes_{kind}"]), np.asarray(pb[f"codes_{kind}"])
                    np.testing.assert_array_equal(ca[r, :, :n], cb[r, :, :n])
                    for f in ("scale", "zero"):
                        np.testing.assert_allclose(np.asarray(pa[f"{f}_{kind}"], np.float32)[r, :, :n],
                                                   np.asarray(pb[f"{f}_{kind}"], np.float32)[r, :, :n],
                                                   rtol=1e-2, atol=1e-5)


def _live_slots(name, size, n, S):
    if name.startswith("pinned"):
        return np.arange(min(size, n))
    return np.unique(np.arange(max(n - size, S), n) % size)  # ring: the last W positions >= S


@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_chunked_prefill_equals_unchunked(mode):
    kv = KVS[mode]
    ref_logits, ref_cache = _prefill(_empty(kv), (N,))
    for chunks in [(8, 8, 8), (5, 8, 1, 8, 1, 1), (1,) * N]:
        logits, cache = _prefill(_empty(kv), chunks)
        for r, n in enumerate(LENS):
            np.testing.assert_allclose(logits[r, :n], ref_logits[r, :n], rtol=1e-5, atol=1e-5,
                                       err_msg=str(chunks))
        _assert_caches_close(cache, ref_cache, LENS)


def _poison(cache: kvcache.KVCache, seed=0) -> kvcache.KVCache:
    """Huge finite garbage in every slot a row does not hold live: sink and INT2 history at positions
    >= length, ring slots not yet written (length < W). Shared ring slots of live positions stay."""
    rng = np.random.default_rng(seed)
    lens = np.asarray(cache.length)

    def garbage(x, dead, scale, axis=2):  # dead [B, size] along `axis` of x
        x = np.asarray(x)
        g = rng.uniform(-1, 1, x.shape) * scale if x.dtype != np.uint8 else rng.integers(0, 256, x.shape)
        shape = [1] * x.ndim
        shape[0], shape[axis] = dead.shape
        return jnp.asarray(np.where(dead.reshape(shape), g, x).astype(x.dtype))

    def dead(size):  # [B, size]: slot index >= the row's length
        return np.arange(size)[None] >= lens[:, None]

    layers = []
    for layer in layers_of(cache):
        window = np.concatenate([dead(layer.pinned_slots), dead(layer.ring_slots)], 1)  # pinned, then ring slots
        upd = dict(k=garbage(layer.k, window, 1e30), v=garbage(layer.v, window, 1e30))
        if cache.kv.int2:
            # scale and zero around 1e15 keep the dequantized garbage (c - z) * s finite in f32
            T = layer.history_slots
            upd.update(codes=garbage(layer.codes, dead(T), 0, axis=3),
                       qparams=garbage(layer.qparams, dead(T), 1e15, axis=3))
        layers.append(dataclasses.replace(layer, **upd))
    return cache.replace(layers=model.stack_layers(layers))


@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_poisoned_dead_slots_change_nothing(mode):
    kv = KVS[mode]
    _, cache = _prompted(kv, (8, 3))  # row 1: ring slots 3..7 and positions >= 3 are dead
    poisoned = _poison(cache)
    assert any(not np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(cache), jax.tree.leaves(poisoned)))
    clean, _ = _decode(cache, 10)
    dirty, _ = _decode(poisoned, 10)
    assert np.isfinite(dirty).all()
    np.testing.assert_array_equal(dirty, clean)
    # Poisoning an empty cache: a prefill reads nothing from it.
    clean, _ = _prefill(_empty(kv), (8, 8, 8))
    dirty, _ = _prefill(_poison(_empty(kv), seed=1), (8, 8, 8))
    np.testing.assert_array_equal(dirty, clean)


def test_int2_equals_bf16_when_windows_cover_the_sequence():
    assert WIDE.sink + WIDE.recent >= N
    # One chunk over an empty cache: bit-identical.
    np.testing.assert_array_equal(_full(WIDE), _full(BF16))
    # Reading cached keys: the INT2 branch of attend_reference adds a second, all-zero value dot and
    # fuses differently, which reassociates f32 sums (~5e-7 on the attention output); no INT2 value
    # is read, so logits agree to float rounding and every argmax is the same.
    prefill = lambda kv: _prefill(_empty(kv), (8, 8, 8))[0]
    decode = lambda kv: _decode(_prompted(kv, (8, 3))[1], 12)[0]
    for wide, bf16 in [(prefill(WIDE), prefill(BF16)), (decode(WIDE), decode(BF16))]:
        np.testing.assert_allclose(wide, bf16, rtol=1e-5, atol=2e-5)
        np.testing.assert_array_equal(wide.argmax(-1), bf16.argmax(-1))


_commit = jax.jit(kvcache.commit, compiler_options=_COMPILE)


def _rows(seed, B, n):
    """Random new rows: [L, B, n, Hkv, D] keys and values."""
    keys = jax.random.split(jax.random.key(seed), 2 * CFG.num_layers)
    shape = (B, n, CFG.num_kv_heads, CFG.head_dim)
    rows = [jax.random.normal(k, shape, jnp.float32) for k in keys]
    return jnp.stack(rows[: CFG.num_layers]), jnp.stack(rows[CFG.num_layers :])


@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_masked_commit(mode):
    kv = KVS[mode]
    B, n = 3, 5
    c0 = kvcache.init_cache(CFG, kv, B, CAP, jnp.float32)
    k, v = _rows(0, B, 10)
    c0 = _poison(_commit(c0, k, v, jnp.asarray([10, 3, 7], jnp.int32)))  # ring wraps in row 0
    len0 = np.asarray(c0.length)
    n_commit = np.array([0, 2, n], np.int32)
    k, v = _rows(1, B, n)
    c1 = _commit(c0, k, v, jnp.asarray(n_commit))
    np.testing.assert_array_equal(np.asarray(c1.length), len0 + n_commit)
    # Rows past n_commit never reach the cache: garbage there gives a bit-identical cache.
    junk = lambda x: jnp.where(jnp.arange(n)[None, :, None, None] >= n_commit[:, None, None, None], 1e30, x)
    c2 = _commit(c0, junk(k), junk(v), jnp.asarray(n_commit))
    for x, y in zip(jax.tree.leaves(c1), jax.tree.leaves(c2)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for l0, l1, kl, vl in zip(layers_of(c0), layers_of(c1), k, v):
        _check_commit_layer(l0, l1, "k", np.asarray(kl), len0, n_commit, kv.clips[0], kv)
        _check_commit_layer(l0, l1, "v", np.asarray(vl), len0, n_commit, kv.clips[1], kv)


def _check_commit_layer(l0, l1, kind, x, len0, n_commit, clip, kv):
    """Slots of the committed positions hold the new rows x [B, n, Hkv, D]; all others are unchanged."""
    p0, p1 = l0.parts(), l1.parts()
    S, W = l0.pinned_slots, l0.ring_slots
    for b in range(len(len0)):
        pos = len0[b] + np.arange(n_commit[b])
        new = x[b, : n_commit[b]].transpose(1, 0, 2)  # [Hkv, n_commit, D]
        _check_slots(p0[f"pinned_{kind}"][b], p1[f"pinned_{kind}"][b], pos[pos < S], new[:, pos < S])
        if W:  # only the last W committed positions >= S reach the ring: no two writes share a slot
            last = (pos >= pos[-1] + 1 - W) & (pos >= S) if len(pos) else pos
            _check_slots(p0[f"ring_{kind}"][b], p1[f"ring_{kind}"][b], pos[last] % W, new[:, last])
        if kv.int2:
            coded = quant.quantize(jnp.asarray(new), kv.group(CFG.head_dim), clip, jnp.dtype(kv.scale_dtype))
            for f, want in zip(("codes", "scale", "zero"), coded):
                _check_slots(p0[f"{f}_{kind}"][b], p1[f"{f}_{kind}"][b], pos, np.asarray(want))


def _check_slots(before, after, slots, want):
    """before/after [Hkv, X, ...]: slots get `want` [Hkv, len(slots), ...], the rest is unchanged."""
    before, after = np.asarray(before), np.asarray(after)
    np.testing.assert_array_equal(after[:, slots], want.astype(after.dtype))
    rest = np.setdiff1d(np.arange(after.shape[1]), slots)
    np.testing.assert_array_equal(after[:, rest], before[:, rest])


def test_commit_keeps_only_the_last_ring_slots():
    # W + 2 positions into W ring slots in one commit: slots 0, 1 hold positions W, W + 1.
    c = kvcache.init_cache(CFG, INT2, 1, CAP, jnp.float32)
    W = c.layer(0).ring_slots
    assert INT2.recent <= W < CAP - 2
    k, v = _rows(2, 1, W + 2)
    c = _commit(c, k, v, jnp.asarray([W + 2], jnp.int32))
    want = np.asarray(k[0])[0, [W, W + 1, *range(2, W)]].transpose(1, 0, 2)
    np.testing.assert_array_equal(np.asarray(c.layer(0).parts()["ring_k"][0]), want)


def test_capacity_and_config_errors():
    with pytest.raises(ConfigError, match="max_position"):
        kvcache.init_cache(CFG, INT2, 1, CFG.max_position + 1)
    kvcache.init_cache(CFG, INT2, 1, CFG.max_position)  # exactly at the limit is fine
    with pytest.raises(ConfigError, match="lookahead"):
        kvcache.init_cache(CFG, INT2, 1, 16, lookahead=INT2.recent)
    bad = [
        (KVConfig("int8"), "unknown kv mode"),
        (KVConfig("int2", recent=4), "lookahead"),  # recent <= lookahead (4)
        (KVConfig("int2", group_size=6), "divide"),
        (KVConfig("int2", group_size=32), "divide"),
        (KVConfig("int2", sink=-1), "sink must be in"),
        (KVConfig("int2", scale_dtype="float16"), "scale dtype"),
    ]
    for kv, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            kv.validate(CFG.head_dim, lookahead=4)
    with pytest.raises(ConfigError, match="multiple of 4"):
        KVConfig("int2").validate(head_dim=18)
    KVConfig("int2", recent=5, group_size=8).validate(CFG.head_dim, lookahead=4)
    KVConfig("bf16", recent=1).validate(CFG.head_dim, lookahead=4)  # bf16 has no windows to check


def test_sliding_window_models_refuse_runs_longer_than_the_window():
    hf = dict(model_type="mistral", vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1, sliding_window=16)
    cfg = model_config_from_hf(hf)
    kvcache.init_cache(cfg, KVConfig("bf16"), 1, 16)  # fits in the window: fine
    with pytest.raises(ConfigError, match="sliding window"):
        kvcache.init_cache(cfg, KVConfig("bf16"), 1, 17)
    qwen = model_config_from_hf(dict(hf, model_type="qwen2", use_sliding_window=False))
    assert qwen.sliding_window is None
