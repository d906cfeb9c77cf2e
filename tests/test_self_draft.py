"""The self-draft and the windowed drafter caches (decode.drafters, attention.rule's window path).

Greedy: self, ngram+self and the draft model and EAGLE-3 head over windowed caches emit the plain tokens in
float32, with drafts accepted. The self-draft's provisional rows never reach the target's cache: after a run
over a poisoned INT2 cache, its dead slots still hold the poison and its live ones equal the plain run's.
The window path of the attention rule equals a dense masked softmax; the self-draft's steps with the layer loop
rolled equal the unrolled ones'; a windowed drafter's cache (so its cost part) is the same at every capacity; load
parses the self-draft modes and --lookahead auto prices them by their step. (The sampled rule with the self-draft's own
distributions: test_speculative's exact enumeration, kind "self".)

Built on test_speculative's tiny models and compiled programs' conventions.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import layers_of
from jspec.attention import rule
from jspec.cache import kvcache, scratch
from jspec.config import KVConfig
from jspec.decode import drafters, loop as decode
from jspec.decode.state import Drafter, DraftMode, Models, ProgramArgs
from jspec.model.sampling import Sampler
from jspec.runtime import engine, lookahead
from test_speculative import (_COMPILE, B, CFG, KVS, LENS, MAX_NEW, NO_EOS, P, PROMPTS, _assert_dead_parts_unchanged,
                              _assert_output, _cut, _draft, _eos, _head, _plain, _poison_all, _target)

WINDOW = KVConfig("window", sink=2, recent=4)  # drafter caches: 6 of the 12 + 20 + K + 1 positions attended
_programs = {}


@functools.cache
def _echo_head(target: str):
    """An EAGLE-3 head that drafts the target's own last prediction again: its layer adds nothing (wo and w_down
    zero), fc passes the target's last residual (tap L) through, and its norm and LM head are the target's. The
    repeater's greedy output runs in repeats of one token, so these drafts are often right."""
    params = _target(target)
    hcfg, hp = _head("full")
    E = CFG.hidden_size
    fc = jnp.zeros((3 * E, E)).at[2 * E:].set(jnp.eye(E))  # taps (0, 1, 2): 2 = L, the last residual
    layer = hp.layer.replace(wo=jnp.zeros_like(hp.layer.wo), w_down=jnp.zeros_like(hp.layer.w_down))
    return hcfg, hp.replace(fc=fc, layer=layer, norm=params.norm, lm_head=params.lm_head)


def _drafter(draft_mode: str, draft, target: str) -> Drafter:
    mode = DraftMode(draft_mode)
    if mode == DraftMode.HEAD:
        hcfg, hp = _echo_head(target) if draft == "echo" else _head(draft)
        return Drafter(head=hp, mode=mode, head_cfg=hcfg, window=WINDOW)
    if mode in (DraftMode.MODEL, DraftMode.NGRAM_MODEL):
        return Drafter(_draft(draft, target), mode=mode, model_cfg=CFG, window=WINDOW)
    return Drafter(mode=mode)


def _generate(mode, K, draft_mode, draft=None, target="random", prompts="random", eos=NO_EOS, poison=None):
    """The generate program (compiled once per shape) on test_speculative's prompts; the final state as numpy."""
    cap = P + MAX_NEW + K + 1
    drafter = _drafter(draft_mode, draft, target)
    m = Models(_target(target), drafter, CFG, K)
    cache = kvcache.init_cache(CFG, KVS[mode], B, cap, jnp.float32, K)
    if poison is not None:
        cache = poison(cache)
    args = ProgramArgs(m, jnp.asarray(PROMPTS[prompts]()), jnp.asarray(LENS), jnp.full((B,), MAX_NEW, jnp.int32),
                       Sampler.make(B), jnp.arange(B, dtype=jnp.int32), cache,
                       drafters.init_cache(drafter, B, cap, jnp.float32, K), jnp.asarray([eos], jnp.int32))
    key = (mode, K, draft_mode, draft, target)
    if key not in _programs:
        _programs[key] = decode.generate_program.lower(*args).compile(_COMPILE)
    return jax.tree.map(np.asarray, _programs[key](*args).replace(keys=None))


@pytest.mark.parametrize("mode", ["int2", "bf16"])
def test_greedy_self_equals_plain(mode):
    """The target over its window (the sink and the recent ring of an INT2 cache, the same two windows of a BF16
    one) and its round's scratch: the plain tokens, a row stopping at EOS mid-run. INT2 (windows of 2 + 6): drafts
    accepted and rejected; BF16 (windows of 64 + 256, all of a row): the self-draft is the target, all accepted."""
    K, eos = 3, _eos(mode)
    s = _generate(mode, K, "self", eos=eos)
    _assert_output(s, _cut(_plain(mode), eos))
    if mode == "int2":
        assert s.accepted.sum() > 0 and (s.accepted < K * s.rounds).any()
    else:  # every draft accepted; a row's last round counts only the drafts it emitted (max_new or EOS cut it)
        assert (s.accepted > K * (s.rounds - 1)).all() and (s.accepted <= K * s.rounds).all()
    assert s.draft is None  # the self-draft keeps no state between rounds


def test_greedy_ngram_self_equals_plain():
    K = 4
    s = _generate("int2", K, "ngram+self", target="repeater", prompts="repeats")
    _assert_output(s, _cut(_plain("int2", "repeater", "repeats"), NO_EOS))
    assert s.accepted.sum() > 0 and (s.accepted < K * s.rounds).any()
    s = _generate("int2", K, "ngram+self")  # random prompts: few matches, the self-draft drafts
    _assert_output(s, _cut(_plain("int2"), NO_EOS))
    assert s.accepted.sum() > 0


@pytest.mark.parametrize("draft_mode,draft,target", [("model", "near", "random"), ("head", "echo", "repeater"),
                                                     ("ngram+model", "near", "random")])
def test_windowed_drafter_caches_equal_plain(draft_mode, draft, target):
    """A draft model and a head over windowed caches (WINDOW: sink + ring, no history), their own drafts
    committed past the target's length each round (the ring's slack keeps them off the attended window)."""
    K = 3
    s = _generate("int2", K, draft_mode, draft, target=target)
    _assert_output(s, _cut(_plain("int2", target), NO_EOS))
    assert s.accepted.sum() > 0
    dc = drafters.proposer(draft_mode).cache_of(s.draft)
    layer = dc.layer(0)
    assert dc.kv == WINDOW and layer.history_slots == 0
    assert layer.k.shape[2] == WINDOW.sink + WINDOW.recent + K + 1


@functools.cache
def _plain_state():
    return _generate("int2", 0, "none")


def test_self_draft_leaves_the_cache_as_a_plain_run():
    """Over a poisoned INT2 cache: the slots past each row's length still hold the poison bit for bit (no
    provisional row was written anywhere), and every committed position (sink, ring, INT2 history) equals the
    plain run's, token for token."""
    K = 3
    poisoned = _poison_all(kvcache.init_cache(CFG, KVS["int2"], B, P + MAX_NEW + K + 1, jnp.float32, K))
    s = _generate("int2", K, "self", poison=lambda c: jax.tree.map(jnp.copy, poisoned))
    plain = _plain_state()
    _assert_output(s, _cut(_plain("int2"), NO_EOS))
    assert (s.accepted < K * s.rounds).any()  # rows were rejected
    assert_committed_as_plain(s, poisoned, plain)


def test_window_attention_is_a_masked_softmax():
    """attend over a scratch view of an INT2 cache (its window and the rows written past its length; a self-draft
    step's) == softmax over the positions p <= t with p < S or p > t - R, in float32 from the original rows. The
    scratch's unwritten rows (here the query's own and its future) are not read from it."""
    kv, Bq, H, D, T, m, at = KVConfig("int2", sink=2, recent=5), 2, 2, 8, 16, 3, 1
    keys = jax.random.split(jax.random.key(0), 3)
    k_all, v_all = (jax.random.normal(x, (Bq, T + m, H, D)) for x in keys[:2])
    length = jnp.array([T, 9])
    cache = kvcache.init_cache(CFG.__class__("llama", 8, 8, 8, 1, 2 * H, H, D, max_position=64), kv, Bq, T + m,
                               jnp.float32, m)
    cache = kvcache.commit(cache, k_all[None, :, :T], v_all[None, :, :T], length)
    rows = lambda x: jnp.take_along_axis(x, (length[:, None] + jnp.arange(m))[..., None, None], axis=1)
    q = jax.random.normal(keys[2], (Bq, 1, 2 * H, D))
    sc = scratch.Scratch(rows(k_all)[None], rows(v_all)[None], jnp.int32(at))  # rows at length + 0..m-1, `at` written
    view = scratch.view(cache, sc)
    got = rule.attend(q, rows(k_all)[:, at: at + 1], rows(v_all)[:, at: at + 1], view.layer(0), view.length,
                      view.kv)
    for b in range(Bq):
        t = int(length[b]) + at
        p = np.arange(t + 1)
        p = p[(p < kv.sink) | (p > t - kv.recent)]
        kk, vv = np.asarray(k_all[b, p]), np.asarray(v_all[b, p])  # [X, H, D]
        qq = np.asarray(q[b, 0]).reshape(H, 2, D)
        s = np.einsum("hgd,xhd->hgx", qq, kk) / np.sqrt(D)
        w = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("hgx,xhd->hgd", w / w.sum(-1, keepdims=True), vv).reshape(2 * H, D)
        np.testing.assert_allclose(np.asarray(got[b, 0]), want, rtol=1e-5, atol=1e-5)


def test_windowed_draft_cost_is_flat_with_context():
    """The cost part of a windowed draft is timed over the cache the engine builds: its buffers are the same at
    every capacity past the window (so is the step that reads them), while the target's grow."""
    d = Drafter(_draft("near"), mode=DraftMode.MODEL, model_cfg=CFG, window=WINDOW)
    draft_bytes = [drafters.init_cache(d, 1, cap, jnp.float32, 3).nbytes() for cap in (16, 32, 64)]
    target_bytes = [kvcache.init_cache(CFG, KVS["int2"], 1, cap, jnp.float32, 3).nbytes() for cap in (16, 32, 64)]
    assert len(set(draft_bytes)) == 1 and target_bytes[0] < target_bytes[1] < target_bytes[2]
    assert d.cache_kv(6) == KVConfig("bf16") and d.cache_kv(7) == WINDOW  # full while the capacity fits the window
    m = Models(_target(), d, CFG, 3)
    probes = [drafters.proposer("model").probes(m, KVS["int2"], 1, cap, cap - 4, 3, jnp.float32)["draft"]
              for cap in (32, 64)]
    shapes = [[x.shape for x in jax.tree.leaves(p.make(lookahead._place(None)))] for p in probes]
    assert shapes[0] == shapes[1]


def test_load_parses_self_drafts():
    """load's draft argument: "self" and "ngram+self" need no weights."""
    for arg, mode in (("self", DraftMode.SELF), ("ngram+self", DraftMode.NGRAM_SELF)):
        d = engine._load_drafter(arg, None, CFG, None, jnp.float32)
        assert d.mode == mode and d.model is None and d.head is None
        assert drafters.init_cache(d, 1, 64, jnp.float32, 3) is None
    combined = drafters.proposer(DraftMode.NGRAM_SELF)
    assert isinstance(combined, drafters.Combined) and isinstance(combined.inner, drafters.SelfDraft)
    assert not isinstance(drafters.proposer(DraftMode.SELF), drafters.Combined)


def test_lookahead_prices_the_self_draft_by_its_step():
    """A self-draft round costs K of its steps (and the lookup with ngram+self); where a step costs what a target
    step does (a short context) no K pays, where it costs a tenth (a long one: the target reads its whole cache)
    speculation does."""
    short = lookahead.Costs(((1, 1.0), (5, 1.1), (17, 1.5)), ngram=0.01, self_step=1.0)
    long = dataclasses.replace(short, self_step=0.1)
    assert short.draft(DraftMode.SELF, 4) == 4.0 and short.draft("ngram+self", 4) == pytest.approx(4.01)
    assert lookahead.choose(short, DraftMode.SELF, 0.7, 16) == (0, 1.0)
    K, gain = lookahead.choose(long, DraftMode.SELF, 0.7, 16)
    assert K > 0 and gain > 1.5


def test_self_steps_with_the_layer_loop_rolled():
    """Two self-draft steps with the layer loop rolled (Options.layer_unroll = 1: one scan trip per layer, the
    scratch's layers scanned with them) give the drafts and scratch rows of the unrolled loop."""
    from jspec.config import Options
    from jspec.decode import drafters
    from jspec.model import decoder

    def steps(params, unroll):
        options = Options(layer_unroll=unroll)
        m = Models(params, Drafter(mode=DraftMode.SELF), CFG, 3, options=options)
        cache = kvcache.init_cache(CFG, KVS["int2"], B, 36, jnp.float32, 3)
        _, (k, v) = decoder.forward(params, CFG, jnp.asarray(PROMPTS["random"]()), cache, options=options)
        cache = kvcache.commit(cache, k, v, jnp.asarray(LENS) - 1)
        sc, d1, _ = drafters.self_token(m, cache, drafters.new_scratch(m, cache), jnp.ones((B,), jnp.int32), None,
                                        Sampler.make(B))
        sc, d2, _ = drafters.self_token(m, cache, sc, d1, None, Sampler.make(B))
        return d1, d2, sc.k

    unrolled, rolled = (jax.jit(lambda p: steps(p, u))(_target()) for u in (True, 1))
    for x, y in zip(unrolled, rolled):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def assert_committed_as_plain(s, poisoned, plain):
    """The final state s of a run over the poisoned cache: the slots past each row's length still hold the poison
    bit for bit, and every committed position (sink, ring, INT2 history) equals the plain run's."""
    for before, after in zip(layers_of(poisoned), layers_of(s.cache)):
        _assert_dead_parts_unchanged(before, after, s.cache.length)
    n_fed = LENS + MAX_NEW - 1  # the plain run's length: every token but the last fed
    assert (s.cache.length >= n_fed).all()
    W = s.cache.layer(0).ring_slots
    for got, want in zip(layers_of(s.cache), layers_of(plain.cache)):
        got, want = got.parts(), want.parts()
        for b in range(B):
            n = n_fed[b]
            np.testing.assert_allclose(got["pinned_k"][b], want["pinned_k"][b], rtol=1e-5, atol=1e-5)
            ring = np.arange(max(int(s.cache.length[b]) - W, 2), n) % W  # ring slots both still hold
            for f in ("ring_k", "ring_v"):
                np.testing.assert_allclose(got[f][b][:, ring], want[f][b][:, ring], rtol=1e-5, atol=1e-5)
            for f in ("codes_k", "codes_v", "scale_k", "scale_v", "zero_k", "zero_v"):
                np.testing.assert_array_equal(got[f][b, :, :n], want[f][b, :, :n], err_msg=f)
