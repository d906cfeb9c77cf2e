"""Speculative decoding (jspec/speculative.py, jspec/decode.py): lossless greedy and sampled.

Greedy: speculative tokens == plain tokens in float32 for K in {1, 3, 5}, BF16 and INT2 caches, with
ragged prompts and a row stopping at EOS mid-round, for every draft mode (model, n-gram, both).
Sampled: the acceptance rule reproduces the target's distribution, by exact enumeration in float64
(random, one-hot and n-gram drafts) and by a chi-square test of accept_sampled.
Cache lifecycle: rejected candidates never touch the cache. The program: one while loop (the draft
model's steps a scan inside it), no host callbacks; EOS stops a row unless GenerateConfig.stop_at_eos
is off.

Compile time dominates on CPU: one tiny target config (drafts share it), one batch shape, and each
generate program is compiled once per (kv, K, greedy) and reused.
"""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from conftest import layers_of
from jspec.cache import kvcache, scratch
from jspec.config import GenerateConfig, KVConfig, ModelConfig, Options, SamplingConfig
from jspec.decode import drafters, loop as decode, ngram, speculative
from jspec.decode.drafters import self_skip
from jspec.decode.drafters.head import head_hidden
from jspec.decode.state import Drafter, DraftMode, Models, ProgramArgs
from jspec.model import head, decoder as model
from jspec.model.sampling import Sampler, sample, warp
from jspec.runtime.engine import Engine

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, max_position=64)
KVS = {"bf16": KVConfig("bf16"), "int2": KVConfig("int2", sink=2, recent=6, group_size=8)}  # R > K
B, P, MAX_NEW = 3, 12, 20
LENS = np.array([12, 5, 9], np.int32)
NO_EOS = -1
# Compile the test programs without LLVM optimization: the same XLA program, a third less CPU time.
_COMPILE = {"xla_backend_optimization_level": 0}


@functools.cache
def _prompts():
    return np.random.default_rng(1).integers(2, CFG.vocab_size, (B, P)).astype(np.int32)


@functools.cache
def _repeats():
    """Prompts [B, P] that repeat a 4-token segment: prompt lookup finds matches from the start."""
    seg = np.random.default_rng(2).integers(2, CFG.vocab_size, (B, 4))
    return np.tile(seg, (1, P // 4)).astype(np.int32)


PROMPTS = {"random": _prompts, "repeats": _repeats}


@functools.cache
def _target(kind="random"):
    """'random': a random model; 'repeater': the same with its layers' output projections damped, so that
    its greedy output falls into runs of one token, which prompt lookup copies (real models repeat too)."""
    params = model.init_params(CFG, jax.random.key(0), std=0.3)
    if kind == "repeater":
        params = params.replace(layers=params.layers.replace(wo=params.layers.wo * 0.03,
                                                                 w_down=params.layers.w_down * 0.03))
    return params


@functools.cache
def _draft(kind, target="random"):
    """'same': the target itself; 'near': the target with a slightly perturbed output head (often
    right, not always); 'random': an unrelated model of the same shape (acceptance near 1/V)."""
    target = _target(target)
    if kind == "same":
        return target
    if kind == "random":
        return model.init_params(CFG, jax.random.key(7), std=0.3)
    noise = 0.02 * jax.random.normal(jax.random.key(3), target.lm_head.shape)
    return target.replace(lm_head=target.lm_head + noise)


@functools.cache
def _head(kind):
    """An EAGLE-3 head for CFG's target with random weights: any head is lossless. 'full': the target's
    vocabulary; 'reduced': a draft vocabulary of 48 of its 64 tokens (d2t maps them back, 16 never drafted)."""
    hcfg = head.HeadConfig(head.layer_config(CFG, 2, 1, 48), CFG.vocab_size if kind == "full" else 48, (0, 1, 2))
    ids = np.sort(np.random.default_rng(4).choice(CFG.vocab_size, 48, False))
    d2t = None if kind == "full" else ids - np.arange(48)
    return hcfg, head.init_head(hcfg, jax.random.key(11), std=0.3, d2t=d2t)


_programs = {}


def _program(args: ProgramArgs):
    """The compiled generate program for these argument shapes/statics (one compile each)."""
    key = (args.cache.kv, args.cache.capacity, args.models.lookahead, args.models.drafter.mode,
           args.sampler.greedy, args.models.drafter.head_cfg)
    if key not in _programs:
        lowered = decode.generate_program.lower(*args)
        _programs[key] = lowered.compile(_COMPILE)
    return _programs[key]


def _generate(mode, K, draft=None, sampler=None, eos=NO_EOS, poison=None, draft_mode="model", target="random",
              prompts="random"):
    """Runs the generate program; returns the final DecodeState as numpy."""
    kv = KVS[mode]
    cap = P + MAX_NEW + K + 1
    with_model = K > 0 and draft is not None and draft_mode != "head"
    drafter = Drafter(_draft(draft, target), model_cfg=CFG) if with_model else Drafter()
    m = Models(_target(target), drafter.replace(mode=DraftMode(draft_mode)).at(K), CFG, K)
    cache = kvcache.init_cache(CFG, kv, B, cap, jnp.float32, K)
    if poison is not None:
        cache = poison(cache)
    dcache = kvcache.init_cache(CFG, KVConfig("bf16"), B, cap, jnp.float32) if with_model else None
    if K > 0 and draft_mode == "head":  # draft names the head: "full" or "reduced"
        hcfg, hp = _head(draft)
        m = m.replace(drafter=Drafter(head=hp, mode=DraftMode.HEAD, head_cfg=hcfg))
        dcache = kvcache.init_cache(hcfg.layer, KVConfig("bf16"), B, cap, jnp.float32)
    sampler = sampler or Sampler.make(B)
    args = ProgramArgs(m, jnp.asarray(PROMPTS[prompts]()), jnp.asarray(LENS),
                              jnp.full((B,), MAX_NEW, jnp.int32), sampler, jnp.arange(B, dtype=jnp.int32), cache,
                              dcache, jnp.asarray([eos], jnp.int32))
    program = _program(args)
    state = program(*args).replace(keys=None)  # typed PRNG keys do not convert to numpy
    return jax.tree.map(np.asarray, state)


@functools.cache
def _plain(mode, target="random", prompts="random"):
    """Greedy plain decoding (K = 0), no EOS: the reference tokens [B, MAX_NEW]."""
    s = _generate(mode, 0, target=target, prompts=prompts)
    np.testing.assert_array_equal(s.count, MAX_NEW)
    return s.tokens[:, :MAX_NEW]


@functools.cache
def _eos(mode):
    """An EOS id that row 0 of the plain run first emits at index 9 or later: the row stops mid-run."""
    row = _plain(mode)[0]
    for i in range(9, MAX_NEW - 4):
        if row[i] not in row[:i]:
            return int(row[i])
    raise AssertionError("no fresh token in row 0 to use as EOS")


def _cut(tokens, eos):
    """Expected (tokens, count) per row: the plain tokens up to and including the first EOS."""
    out = []
    for row in tokens:
        hits = np.flatnonzero(row == eos)
        n = hits[0] + 1 if len(hits) else len(row)
        out.append((row[:n], n))
    return out


def _assert_output(s, expected):
    for b, (want, n) in enumerate(expected):
        assert s.count[b] == n, (b, s.count[b], n)
        np.testing.assert_array_equal(s.tokens[b, :n], want, err_msg=f"row {b}")
        assert not s.tokens[b, n:].any(), f"row {b}: tokens written past its count"
    assert s.done.all()


@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_plain_decoding_stops_at_eos(mode):
    eos = _eos(mode)
    s = _generate(mode, 0, eos=eos)
    _assert_output(s, _cut(_plain(mode), eos))
    assert 10 <= s.count[0] < MAX_NEW - 3


def test_stop_at_eos_off_runs_past_eos():
    """Through the Engine: the same row stops at its EOS by default and runs to max_new without."""
    eos = _eos("bf16")
    eng = Engine(cfg=dataclasses.replace(CFG, eos_token_ids=(eos,)), params=_target(), tokenizer=None,
                 kv=KVS["bf16"], dtype="float32")
    run = lambda **stop: eng.generate_ids([_prompts()[0, : LENS[0]].tolist()], [SamplingConfig()], [MAX_NEW],
                                          GenerateConfig(MAX_NEW, lookahead=0, **stop))[0][0]
    stopped, past = run(), run(stop_at_eos=False)
    assert stopped[-1] == eos and len(stopped) < MAX_NEW  # stopped at the first EOS
    assert len(past) == MAX_NEW and past[: len(stopped)] == stopped


@pytest.mark.parametrize("K", [1, 3, 5])
@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_greedy_speculative_equals_plain(mode, K):
    eos = _eos(mode)
    s = _generate(mode, K, "near", eos=eos)
    expected = _cut(_plain(mode), eos)
    _assert_output(s, expected)
    assert (s.accepted <= K * s.rounds).all() and (s.rounds >= 1).all()
    assert s.accepted.sum() > 0  # the near draft is often right
    # Committed = prompt + emitted - 1 (the last token is not fed yet) + accepted drafts that were cut
    # (after EOS, or past max_new). Row 0 must have committed drafts past its EOS: EOS mid-round.
    cut = s.cache.length - LENS - (s.count - 1)
    assert (cut >= 0).all()
    assert cut[0] > 0, "EOS was not mid-round: pick another draft or EOS"


def test_draft_equal_to_target_accepts_everything():
    K = 3
    s = _generate("bf16", K, "same")
    _assert_output(s, _cut(_plain("bf16"), NO_EOS))
    rounds = -(-(MAX_NEW - 1) // (K + 1))  # the first token comes from the prefill
    np.testing.assert_array_equal(s.rounds, rounds)
    np.testing.assert_array_equal(s.accepted, K * s.rounds)


@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_random_draft_is_rarely_accepted_and_still_exact(mode):
    K = 3
    s = _generate(mode, K, "random")
    _assert_output(s, _cut(_plain(mode), NO_EOS))
    assert s.accepted.sum() / (K * s.rounds.sum()) < 0.2
    assert (s.rounds >= (MAX_NEW - 1) // 2).all()


@pytest.mark.parametrize("mode", ["bf16", "int2"])
def test_greedy_ngram_equals_plain(mode):
    """Prompt lookup: the plain tokens, with copies accepted (from the repeating prompts and from the runs
    the repeater emits), and a history that holds the prompt, then every emitted token."""
    K = 4
    s = _generate(mode, K, draft_mode="ngram", target="repeater", prompts="repeats")
    _assert_output(s, _cut(_plain(mode, "repeater", "repeats"), NO_EOS))
    assert s.accepted.sum() > 0 and (s.accepted < K * s.rounds).any()  # copies accepted, and rejected
    history = s.draft  # the n-gram drafter's state: its history, no cache
    for b, n in enumerate(LENS):
        np.testing.assert_array_equal(history[b, :n], _repeats()[b, :n])
        np.testing.assert_array_equal(history[b, n : n + s.count[b]], s.tokens[b, : s.count[b]])


def test_greedy_ngram_with_model_equals_plain():
    """Both drafters: the n-gram copy where a row matches, the draft model elsewhere (its cache resynced
    from the history after rounds it skipped); a row stops at EOS mid-run."""
    K, eos = 3, _eos("int2")
    s = _generate("int2", K, "near", draft_mode="ngram+model", target="repeater", prompts="repeats")
    _assert_output(s, _cut(_plain("int2", "repeater", "repeats"), NO_EOS))
    assert s.accepted.sum() > 0 and (s.accepted < K * s.rounds).any()
    s = _generate("int2", K, "near", draft_mode="ngram+model", eos=eos)  # random prompts: few matches
    _assert_output(s, _cut(_plain("int2"), eos))
    assert s.accepted.sum() > 0


@pytest.mark.parametrize("mode,K,kind", [("bf16", 3, "reduced"), ("int2", 4, "full")])
def test_greedy_head_equals_plain(mode, K, kind):
    """An EAGLE-3 head with random weights (lossless whatever they are), its pairs fed from the prefill and
    from each round's verify; a row stops at EOS mid-run. The head's cache advances with the target's."""
    eos = _eos(mode)
    s = _generate(mode, K, kind, eos=eos, draft_mode="head")
    _assert_output(s, _cut(_plain(mode), eos))
    assert (s.accepted <= K * s.rounds).all() and (s.rounds >= 1).all()
    assert s.draft.cache is not None and s.draft.feed is not None  # the head's state: its cache and feed
    if mode != "bf16":
        return
    # The head's cache holds, at every position t fed before the last round, the pair (fused target
    # feature at t, token t + 1): a fresh run of target and head over the emitted sequence gives the same rows
    # (with a BF16 target cache, whose features a cache-free forward reproduces).
    hcfg, hp = _head(kind)
    fed = np.zeros((B, P + MAX_NEW), np.int32)
    for b in range(B):
        n = LENS[b] + s.count[b]
        fed[b, :n] = np.concatenate([_prompts()[b, : LENS[b]], s.tokens[b, : s.count[b]]])
    _, _, tapped = model.forward_taps(_target(), CFG, jnp.asarray(fed[:, :-1]), None, hcfg.taps)
    _, _, (k, _) = head.forward(hp, hcfg, _target().embed, jnp.asarray(fed[:, 1:]), head.fuse(hp, tapped))
    want = np.asarray(k[0]).transpose(0, 2, 1, 3)  # [B, Hkv, T, D]
    got = np.asarray(s.draft.cache.layer(0).parts()["pinned_k"])
    for b in range(B):
        n = min(s.cache.length[b] - K - 1, LENS[b] + s.count[b] - 1)
        assert n > LENS[b]
        np.testing.assert_allclose(got[b, :, :n], want[b, :, :n], rtol=1e-4, atol=1e-4, err_msg=f"row {b}")


def _walk(jaxpr):
    """Every equation of a jaxpr and of the jaxprs nested in its equations' params."""
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else [p]:
                sub = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(sub, "eqns"):
                    yield from _walk(sub)


@pytest.mark.parametrize("K,temperature", [(0, 0.0), (0, 1.0), (3, 0.0), (3, 1.0)])
def test_generate_is_one_loop_without_callbacks(K, temperature):
    cfg = ModelConfig("llama", 64, 32, 64, 2, 4, 2, 8, eos_token_ids=(1, 2))
    dcfg = ModelConfig("llama", 64, 16, 32, 1, 2, 1, 8)
    draft, B, P, new = K > 0, 2, 6, 10
    drafter = Drafter(model.init_params(dcfg, jax.random.key(1)), mode=DraftMode.MODEL, model_cfg=dcfg)
    # the layer loops unrolled (Options.layer_unroll): the one rolled scan left is the draft's steps
    m = Models(model.init_params(cfg, jax.random.key(0)), drafter if draft else Drafter(), cfg, K,
               options=Options(layer_unroll=True))
    cache = kvcache.init_cache(cfg, KVConfig("int2", sink=2, recent=8), B, P + new + K + 1, lookahead=K)
    dcache = kvcache.init_cache(dcfg, KVConfig("bf16"), B, P + new + K + 1) if draft else None
    sampler = Sampler.make(B, temperature=temperature, top_k=5, top_p=0.9)
    args = ProgramArgs(m, jnp.ones((B, P), jnp.int32), jnp.array([6, 3]), jnp.full((B,), new), sampler,
                              jnp.arange(B), cache, dcache, jnp.array([1, 2]))
    eqns = list(_walk(jax.make_jaxpr(decode.generate_program)(*args).jaxpr))
    names = [e.primitive.name for e in eqns]
    assert names.count("while") == 1
    # the draft model's K - 1 steps: one traced step (a loop that stays one after lowering)
    loops = [e for e in eqns if e.primitive.name == "scan" and e.params["unroll"] < e.params["length"]]
    assert len(loops) == (1 if draft else 0)
    assert not [n for n in names if "callback" in n]
    # the tokens are produced inside that loop: its body runs the model (the verify/decode forward)
    loop = next(e for e in eqns if e.primitive.name == "while")
    assert "dot_general" in {e.primitive.name for e in _walk(loop.params["body_jaxpr"].jaxpr)}


def _poison_all(cache):
    """Every slot of an empty cache holds huge finite garbage (a fresh cache is all dead)."""
    rng = np.random.default_rng(5)

    def garbage(x):
        x = np.asarray(x)
        if x.dtype == np.uint8:
            return jnp.asarray(rng.integers(0, 256, x.shape, np.uint8))
        scale = 1e15 if x.dtype != np.float32 else 1e30  # bf16 scale/zero: (c - z) * s stays finite
        return jnp.asarray((rng.uniform(-1, 1, x.shape) * scale).astype(x.dtype))

    return cache.replace(layers=jax.tree.map(garbage, cache.layers))


@functools.partial(jax.jit, static_argnums=1, compiler_options=_COMPILE)
def _prefill_cache(params, cfg, tokens, cache, n):
    _, (k, v) = model.forward(params, cfg, tokens, cache)
    return kvcache.commit(cache, k, v, n)


def test_rejected_candidates_never_touch_the_cache():
    """A whole generate run over a poisoned int2 cache: slots past each row's final length still hold
    the poison bit for bit, and the committed slots equal a fresh prefill of the fed tokens."""
    K, kv = 3, KVS["int2"]
    poisoned = _poison_all(kvcache.init_cache(CFG, kv, B, P + MAX_NEW + K + 1, jnp.float32, K))
    s = _generate("int2", K, "near", poison=lambda c: jax.tree.map(jnp.copy, poisoned))
    _assert_output(s, _cut(_plain("int2"), NO_EOS))  # poison never read
    assert (s.accepted < K * s.rounds).any()  # some candidates were rejected
    length = s.cache.length
    for before, after in zip(layers_of(poisoned), layers_of(s.cache)):
        _assert_dead_parts_unchanged(before, after, length)
    # Fresh prefill of prompt + emitted[:-1]: what every row fed, at positions < length.
    fed = np.zeros((B, P + MAX_NEW), np.int32)
    for b in range(B):
        n = LENS[b] + s.count[b] - 1
        fed[b, :n] = np.concatenate([_prompts()[b, : LENS[b]], s.tokens[b, : s.count[b] - 1]])
    n_fed = LENS + s.count - 1
    ref = _prefill_cache(_target(), CFG, jnp.asarray(fed), kvcache.init_cache(CFG, kv, B, poisoned.capacity,
                                                                              jnp.float32, K), n_fed)
    W = ref.layer(0).ring_slots
    for got, want in zip(layers_of(s.cache), layers_of(ref)):
        got, want = got.parts(), want.parts()
        for b in range(B):
            n = n_fed[b]
            np.testing.assert_allclose(got["pinned_k"][b], want["pinned_k"][b], rtol=1e-5, atol=1e-5)
            # ring slots of fed positions >= S still held (accepted drafts past max_new may follow them)
            ring = np.arange(max(int(length[b]) - W, ref.layer(0).pinned_slots), n) % W
            for f in ("ring_k", "ring_v"):
                np.testing.assert_allclose(got[f][b][:, ring], want[f][b][:, ring], rtol=1e-5, atol=1e-5)
            for f in ("codes_k", "codes_v"):
                np.testing.assert_array_equal(got[f][b, :, :n], np.asarray(want[f][b, :, :n]))


def _assert_dead_parts_unchanged(before, after, length):
    """Pinned slots and INT2 history at positions >= length are bit-identical in `after`."""
    before, after = before.parts(), after.parts()
    for f in ("pinned_k", "pinned_v", "codes_k", "codes_v", "scale_k", "scale_v", "zero_k", "zero_v"):
        _assert_dead_unchanged(before[f], after[f], length)


def _assert_dead_unchanged(before, after, length):
    before, after = np.asarray(before), np.asarray(after)
    for b, n in enumerate(length):
        np.testing.assert_array_equal(after[b, :, n:], before[b, :, n:])


@functools.partial(jax.jit, static_argnums=1, compiler_options=_COMPILE)
def _verify_and_commit(params, cfg, tokens, cache):
    """One verify forward over [next, d_1..d_K] and the greedy acceptance and masked commit."""
    logits, (k, v) = model.forward(params, cfg, tokens, cache)
    a, nxt = speculative.accept_greedy(logits, tokens[:, 1:])
    return a, nxt, logits, kvcache.commit(cache, k, v, a + 1)


def test_one_round_by_hand_commits_only_accepted_rows():
    """Drafts built to be accepted for exactly a = 0, 2, K tokens; every slot past length + a + 1 is
    bit-identical to before the round (the cache was poisoned, so any stray write would show)."""
    K, kv = 3, KVS["int2"]
    cache = kvcache.init_cache(CFG, kv, B, P + MAX_NEW + K + 1, jnp.float32, K)
    cache = _prefill_cache(_target(), CFG, jnp.asarray(_prompts()), _poison_all(cache), jnp.asarray(LENS))
    plain = _plain("int2")  # plain[:, 0] is the next token; plain[:, 1:] the target's greedy drafts
    drafts = plain[:, 1 : K + 1].copy()
    want_a = np.array([0, 2, K])
    for b, a in enumerate(want_a):
        if a < K:
            drafts[b, a] = (drafts[b, a] + 1) % CFG.vocab_size  # first wrong draft at index a
    tokens = jnp.asarray(np.concatenate([plain[:, :1], drafts], 1))
    before = jax.tree.map(np.asarray, cache)
    a, nxt, _, after = _verify_and_commit(_target(), CFG, tokens, cache)
    np.testing.assert_array_equal(np.asarray(a), want_a)
    np.testing.assert_array_equal(np.asarray(nxt), plain[np.arange(B), want_a + 1])
    np.testing.assert_array_equal(np.asarray(after.length), LENS + want_a + 1)
    end = LENS + want_a + 1
    for l0, l1 in zip(layers_of(before), layers_of(after)):
        _assert_dead_parts_unchanged(l0, l1, end)
        W = l0.ring_slots
        p0, p1 = l0.parts(), l1.parts()
        for b in range(B):  # ring: only the slots of the committed positions changed
            rest = np.setdiff1d(np.arange(W), np.arange(LENS[b], end[b]) % W)
            for f in ("ring_k", "ring_v"):
                np.testing.assert_array_equal(np.asarray(p1[f])[b][:, rest], np.asarray(p0[f])[b][:, rest])


# ------------------------------------------------------------------------------ the sampled rule

V = 4  # tiny vocabulary for the distribution tests; K = 2 drafts per round
TABLES = ["random", "equal", "disjoint", "onehot"]
LOOKUP_PREFIX = (0, 1, 2, 0, 3, 1, 2)  # the n-gram drafter's history starts with this, then the context


def _p(kind, ctx):
    """Target distribution [V] after the prefix ctx (a tuple of tokens): fixed, context-dependent."""
    rng = np.random.default_rng([1, len(ctx), *ctx])
    x = rng.dirichlet(np.ones(V))
    if kind == "disjoint":
        x[2:] = 0
    else:
        x[rng.integers(V)] *= rng.integers(2)  # a zero in about half of the contexts
    return x / x.sum()


def _q(kind, ctx):
    """Draft distribution [V] after ctx: q = p, disjoint from p, one-hot (n-gram), or random with a
    zero where p may be positive."""
    rng = np.random.default_rng([2, len(ctx), *ctx])
    if kind == "equal":
        return _p(kind, ctx)
    if kind == "onehot":
        return np.eye(V)[rng.integers(V)]
    x = rng.dirichlet(np.ones(V))
    if kind == "disjoint":
        x[:2] = 0
    else:
        x[rng.integers(V)] = 0
    return x / x.sum()


@functools.cache
def _head_q_program():
    """A tiny EAGLE-3 head over V tokens (draft vocabulary: 3 of them, token 2 never drafted) and a jitted
    (feature [E], token) -> (q1 [V], q2 [V, V]): the head's distribution of d1 after the pair, and of d2
    after each d1 on its own feature, through decode's head step and the sampler's warp (temperature 1)."""
    cfg = ModelConfig("llama", V, 8, 8, 1, 2, 1, 4, max_position=16)
    hcfg = head.HeadConfig(head.layer_config(cfg, 2, 1, 8), 3, (0, 1, 2))
    hp = head.init_head(hcfg, jax.random.key(5), std=0.8, d2t=np.array([0, 0, 1]))  # drafts 0, 1, 3
    embed = jax.random.normal(jax.random.key(6), (V, 8))
    m = Models(model.Params(embed, (), jnp.ones(8)), Drafter(head=hp, mode=DraftMode.HEAD, head_cfg=hcfg), cfg, 2)
    warp1 = lambda logits: warp(logits, Sampler.make(logits.shape[0], temperature=1.0))

    @jax.jit
    def q_tables(feat, tok):
        hc = kvcache.init_cache(hcfg.layer, KVConfig("bf16"), 1, 8, jnp.float32)
        h, (k, v) = head_hidden(m, tok[None, None], feat[None, None], hc)
        hc = kvcache.commit(hc, k, v, jnp.ones((1,), jnp.int32))
        q = lambda h: warp1(head.to_target_vocab(head.draft_logits(hp, hcfg, h), hp.d2t, V))  # draw_head, sampled
        step = lambda d: head_hidden(m, d[None, None], h[:, -1:], hc)[0][0, -1]  # drafters.head_token's forward
        return q(h[:, -1])[0], q(jax.vmap(step)(jnp.arange(V)))

    return q_tables


def _head_q(ctx):
    """q [V] for d1 and [V, V] for d2 given d1 at ctx: the head fed a feature drawn per context."""
    feat = np.random.default_rng([3, len(ctx), *ctx]).standard_normal(8).astype(np.float32)
    q1, q2 = (np.asarray(x, np.float64) for x in _head_q_program()(jnp.asarray(feat), jnp.int32(ctx[-1] if ctx else 0)))
    return q1 / q1.sum(), q2 / q2.sum(-1, keepdims=True)  # float64 sums of exactly 1 (zeros stay zeros)


@functools.cache
def _self_q_program(kind="self"):
    """A tiny target over V tokens with an INT2 cache of windows 1 + 3, and a jitted (history [T], its length n) ->
    (q1 [V], q2 [V, V]): the self-draft's distribution of d1 with history[:n - 1] committed and history[n - 1] as
    `next`, and of d2 after each d1 (in the round's scratch), through drafters.self_token and the sampler's warp
    (temperature 1). The window hides most of the history: the self-draft is not the target. "self-skip": the
    first of its two layers drafts (drafters.self_skip)."""
    cfg = ModelConfig("llama", V, 8, 16, 2, 2, 1, 4, max_position=16)
    params = model.init_params(cfg, jax.random.key(8), std=0.8)
    kv = KVConfig("int2", sink=1, recent=3, group_size=4)
    m = Models(params, Drafter(mode=DraftMode(kind), layers=1 if kind == "self-skip" else None), cfg, 2)
    sampler, key = Sampler.make(1, temperature=1.0), jax.random.split(jax.random.key(0), 1)

    @jax.jit
    def q_tables(history, n):
        cache = kvcache.init_cache(cfg, kv, 1, 16, jnp.float32, 2)
        _, (k, v) = model.forward(params, cfg, history[None], cache)
        cache = kvcache.commit(cache, k, v, (n - 1)[None])
        mm, cut = self_skip.skipped(m, cache) if kind == "self-skip" else (m, cache)
        sc = scratch.new_scratch(cut, mm.target.num_layers, 2)
        sc, _, q1 = drafters.self_token(mm, cut, sc, history[n - 1][None], key, sampler)
        q2 = jax.vmap(lambda d: drafters.self_token(mm, cut, sc, d[None], key, sampler)[2][0])(jnp.arange(V))
        return q1[0], q2

    return q_tables


def _self_q(ctx, kind="self"):
    """q [V] for d1 and [V, V] for d2 given d1, after LOOKUP_PREFIX + ctx."""
    history = LOOKUP_PREFIX + ctx
    padded = jnp.asarray(history + (0,) * (12 - len(history)), jnp.int32)
    q1, q2 = (np.asarray(x, np.float64) for x in _self_q_program(kind)(padded, jnp.int32(len(history))))
    return q1 / q1.sum(), q2 / q2.sum(-1, keepdims=True)


def _proposals(kind, ctx):
    """[(drafts (d1, d2), probability of drafting them, q [2, V])] of a round at ctx. The q tables draw
    d1 from q(ctx) and d2 from q(ctx + d1); the n-gram drafter copies both (decode's point mass); the head
    and the self-draft draw from their own distributions."""
    if kind in ("head", "self", "self-skip"):
        q1, q2 = _head_q(ctx) if kind == "head" else _self_q(ctx, kind)
        return [((d1, d2), q1[d1] * q2[d1, d2], np.stack([q1, q2[d1]]))
                for d1, d2 in itertools.product(range(V), repeat=2) if q1[d1] * q2[d1, d2] > 0]
    if kind == "ngram":
        history = jnp.asarray([LOOKUP_PREFIX + ctx], jnp.int32)
        d, _ = ngram.propose(history, jnp.asarray([history.shape[1]]), 2)
        q = drafters.point_mass(d, V, Sampler.make(1, temperature=1.0))[0]
        return [(tuple(np.asarray(d[0]).tolist()), 1.0, np.asarray(q, np.float64))]
    out = []
    for d1, d2 in itertools.product(range(V), repeat=2):
        q = np.stack([_q(kind, ctx), _q(kind, ctx + (d1,))])
        if q[0, d1] * q[1, d2] > 0:
            out.append(((d1, d2), q[0, d1] * q[1, d2], q))
    return out


@functools.cache
def _round_dist(kind, ctx):
    """{emitted tokens of one round at ctx: probability}, over every draft the drafter may propose, with
    the real acceptance probabilities and residual distributions of speculative.py in float64."""
    props = _proposals(kind, ctx)
    M = len(props)
    # Padded to V * V rows (copies of the first, never read back): one shape, so the eager ops of
    # acceptance and residual compile once rather than once per count of proposals.
    props = props + props[:1] * (V * V - M)
    d = np.array([x[0] for x in props])
    w = np.array([x[1] for x in props])  # probability of drafting d
    q = np.stack([x[2] for x in props])
    p = np.stack([[_p(kind, ctx), _p(kind, ctx + (d1,)), _p(kind, ctx + (d1, d2))] for d1, d2 in d])
    alpha = np.asarray(speculative.acceptance(jnp.asarray(p), jnp.asarray(q), jnp.asarray(d)))
    assert alpha.dtype == np.float64
    reach = [1 - alpha[:, 0], alpha[:, 0] * (1 - alpha[:, 1]), alpha[:, 0] * alpha[:, 1]]  # P(a | d)
    out = {}
    for a in range(3):
        r = np.asarray(speculative.residual(jnp.asarray(p), jnp.asarray(q), jnp.full(V * V, a)))
        for m in range(M):
            for x in range(V):
                seq = tuple(d[m, :a]) + (x,)
                out[seq] = out.get(seq, 0.0) + w[m] * reach[a][m] * r[m, x]
    return out


def _emitted_dist(kind, ctx, n):
    """{first n emitted tokens: probability}, running as many rounds as it takes."""
    out = {}
    for seq, pr in _round_dist(kind, ctx).items():
        tails = {(): 1.0} if len(seq) >= n else _emitted_dist(kind, ctx + seq, n - len(seq))
        for tail, pr2 in tails.items():
            key = (seq + tail)[:n]
            out[key] = out.get(key, 0.0) + pr * pr2
    return out


def _target_dist(kind, n):
    out = {}
    for seq in itertools.product(range(V), repeat=n):
        out[seq] = np.prod([_p(kind, seq[:i])[seq[i]] for i in range(n)])
    return out


@pytest.mark.parametrize("kind", TABLES + ["ngram", "head", "self", "self-skip"])
def test_exact_enumeration_matches_target(kind):
    """The first 1, 2 and 3 emitted tokens (the 3rd covers the bonus token after a full accept) are
    jointly distributed as the target's: total variation <= 1e-6 in float64. "ngram": the prompt-lookup
    drafter's copies of the history, with their point-mass q. "head": an EAGLE-3 head's own distributions
    (a reduced draft vocabulary: one token it never drafts). "self": the self-draft's, a model over the window of
    its cache and its round's scratch; "self-skip": its first layer's alone."""
    with jax.enable_x64(True):
        for n in (1, 2, 3):
            got, want = _emitted_dist(kind, (), n), _target_dist(kind, n)
            assert set(got) <= set(want)
            tv = 0.5 * sum(abs(got.get(s, 0.0) - want[s]) for s in want)
            assert tv <= 1e-6, (kind, n, tv)
            assert abs(sum(got.values()) - 1) <= 1e-12
    _round_dist.cache_clear()


def _dense(table, kind, depth):
    """table(kind, ctx) for every ctx of length depth: [V] * depth + [V] float32."""
    shape = (V,) * depth
    return jnp.asarray(np.array([table(kind, c) for c in itertools.product(range(V), repeat=depth)])
                       .reshape(*shape, V), jnp.float32)


@functools.partial(jax.jit, compiler_options=_COMPILE)
def _two_tokens(P, Q, keys):
    """First two emitted tokens [N, 2] of speculative sampling (K = 2) from the context tables
    P = (p at depth 0..3) and Q = (q at depth 0..2), with the real sampler and accept_sampled."""
    N = keys.shape[1]

    def round_(k, p0, p1, p2, q0, q1):
        # p0 [N, V] and q0 at the round's context; p1 [N, V, V] and q1 one token on; p2 two on.
        d1 = sample(k[0], q0)
        d2 = sample(k[1], q1[jnp.arange(N), d1])
        p = jnp.stack([p0, p1[jnp.arange(N), d1], p2[jnp.arange(N), d1, d2]], 1)
        q = jnp.stack([q0, q1[jnp.arange(N), d1]], 1)
        a, nxt = speculative.accept_sampled(p, q, jnp.stack([d1, d2], 1), k[2:4])
        return jnp.where(a >= 1, d1, nxt), jnp.where(a >= 2, d2, nxt), a

    rep = lambda x: jnp.broadcast_to(x, (N, *x.shape))
    x1, y, a = round_(keys[:4], rep(P[0]), rep(P[1]), rep(P[2]), rep(Q[0]), rep(Q[1]))
    z, _, _ = round_(keys[4:], P[1][x1], P[2][x1], P[3][x1], Q[1][x1], Q[2][x1])  # next round at (x1,)
    return jnp.stack([x1, jnp.where(a >= 1, y, z)], 1)


@pytest.mark.parametrize("kind", TABLES)
def test_sampled_chi_square(kind):
    """200k seeds through accept_sampled (float32): the (first, second) emitted token histogram fits
    the target's joint distribution."""
    N = 200_000
    P = tuple(_dense(_p, kind, i) for i in range(4))
    Q = tuple(_dense(_q, kind, i) for i in range(3))
    keys = jax.random.split(jax.random.key(TABLES.index(kind)), 8 * N).reshape(8, N)
    pairs = np.asarray(_two_tokens(P, Q, keys))
    counts = np.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V)
    want = np.array([_target_dist(kind, 2)[s] for s in itertools.product(range(V), repeat=2)])
    assert counts[want == 0].sum() == 0  # nothing the target cannot emit
    live = want > 0
    _, pvalue = scipy.stats.chisquare(counts[live], want[live] / want[live].sum() * N)
    assert pvalue > 1e-3, (kind, pvalue, counts, want * N)


# ------------------------------------------------------------------------------------- sampling


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_warp_temperature_top_k_top_p():
    R, Vw = 512, 64
    logits = np.asarray(jax.random.normal(jax.random.key(0), (R, Vw))) * 3
    temp = np.resize([0.0, 0.5, 1.0, 2.0], R).astype(np.float32)
    top_k = np.resize([0, 1, 5, 0, 20, 0, 3], R).astype(np.int32)
    top_p = np.resize([1.0, 0.9, 0.5, 0.05, 1.0], R).astype(np.float32)
    s = Sampler(jnp.asarray(temp), jnp.asarray(top_k), jnp.asarray(top_p))
    got = np.asarray(jax.jit(warp)(jnp.asarray(logits), s))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.sum(-1), 1, rtol=1e-5)
    for r in range(R):
        if temp[r] == 0:  # greedy whatever top-k/top-p say
            np.testing.assert_array_equal(got[r], np.eye(Vw)[logits[r].argmax()])
            continue
        base = _softmax(logits[r] / temp[r])
        order = np.argsort(-base)
        keep = order[: top_k[r]] if top_k[r] else order
        pk = base[keep] / base[keep].sum()  # top-k renormalized, descending
        n = np.searchsorted(np.cumsum(pk), top_p[r] * (1 - 1e-6)) + 1 if top_p[r] < 1 else len(keep)
        keep = keep[:n]  # the smallest prefix whose mass reaches top_p
        want = np.zeros(Vw)
        want[keep] = base[keep] / base[keep].sum()
        np.testing.assert_allclose(got[r], want, rtol=1e-4, atol=1e-7, err_msg=f"row {r}")


def test_warp_keeps_the_top_token_for_tiny_top_p():
    # Regression: a probability threshold compared across two softmaxes (vocabulary order, sorted
    # order) could drop the only kept token by one ulp and return 0/0 = NaN.
    logits = jax.random.normal(jax.random.key(1), (4096, 64)) * 3
    got = np.asarray(jax.jit(warp)(logits, Sampler.make(4096, temperature=0.7, top_p=1e-3)))
    np.testing.assert_array_equal(got, np.eye(64)[np.asarray(logits).argmax(-1)])


@pytest.mark.parametrize("draft_mode,target,prompts", [("model", "random", "random"),
                                                      ("ngram+model", "repeater", "repeats"),
                                                      ("head", "random", "random")])
def test_temperature_zero_rows_are_exactly_greedy(draft_mode, target, prompts):
    """Rows at temperature 0 inside a sampled batch emit the greedy tokens; the sampled row runs (with
    both drafters: copies carry a point-mass q, model drafts their own; and with a head, whose q covers
    a reduced vocabulary)."""
    K = 3
    sampler = Sampler.make(B, temperature=jnp.array([0.0, 1.0, 0.0]), top_k=jnp.array([0, 8, 3]),
                           top_p=jnp.array([1.0, 0.9, 0.5]))
    assert not sampler.greedy
    s = _generate("bf16", K, "reduced" if draft_mode == "head" else "near", sampler=sampler, draft_mode=draft_mode,
                  target=target, prompts=prompts)
    plain = _plain("bf16", target, prompts)
    for b in (0, 2):
        assert s.count[b] == MAX_NEW
        np.testing.assert_array_equal(s.tokens[b, :MAX_NEW], plain[b])
    assert s.count[1] == MAX_NEW and ((0 <= s.tokens[1]) & (s.tokens[1] < CFG.vocab_size)).all()
    if draft_mode != "head":  # a random head is rarely right
        assert (s.accepted[[0, 2]] > 0).all()  # greedy rows still accept drafts
