"""The layer-skipping self-draft (decode.drafters.self_skip): the target's first N layers over the self-draft's view.

Greedy: self-skip and ngram+self-skip emit the plain tokens in float32 with drafts accepted and rejected, and the
target's cache after a run over a poisoned INT2 cache equals the plain run's (its dead slots keep the poison). Its
steps with the layer loop rolled equal the unrolled ones; the cost probe prices the cut, not the whole target; load
and the CLI check N. (The sampled rule with its own distributions: test_speculative's exact enumeration, kind
"self-skip".)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.cache import kvcache
from jspec.config import ConfigError, Options
from jspec.cli import generate as cli
from jspec.decode import drafters, loop as decode
from jspec.decode.drafters import self_skip
from jspec.decode.state import Drafter, DraftMode, Models, ProgramArgs
from jspec.model import decoder
from jspec.model.sampling import Sampler
from jspec.runtime import engine, lookahead
from test_self_draft import assert_committed_as_plain
from test_speculative import (_COMPILE, B, CFG, KVS, LENS, MAX_NEW, NO_EOS, P, PROMPTS, _assert_output,
                              _cut, _plain, _poison_all, _target)

_programs = {}


def _generate(mode, K, draft_mode, layers=1, target="random", prompts="random", poison=None):
    """The generate program on test_speculative's prompts with the first `layers` of CFG's 2 drafting."""
    cap = P + MAX_NEW + K + 1
    drafter = Drafter(mode=draft_mode, layers=layers)
    m = Models(_target(target), drafter, CFG, K)
    cache = kvcache.init_cache(CFG, KVS[mode], B, cap, jnp.float32, K)
    cache = cache if poison is None else poison(cache)
    args = ProgramArgs(m, jnp.asarray(PROMPTS[prompts]()), jnp.asarray(LENS), jnp.full((B,), MAX_NEW, jnp.int32),
                       Sampler.make(B), jnp.arange(B, dtype=jnp.int32), cache,
                       drafters.init_cache(drafter, B, cap, jnp.float32, K), jnp.asarray([NO_EOS], jnp.int32))
    key = (mode, K, draft_mode, layers, target, prompts)
    if key not in _programs:
        _programs[key] = decode.generate_program.lower(*args).compile(_COMPILE)
    return jax.tree.map(np.asarray, _programs[key](*args).replace(keys=None))


@pytest.mark.parametrize("mode", ["int2", "bf16"])
def test_greedy_self_skip_equals_plain(mode):
    """One of two layers drafts: a model other than the target, so some drafts are rejected, in either cache."""
    K = 3
    s = _generate(mode, K, DraftMode.SELF_SKIP)
    _assert_output(s, _cut(_plain(mode), NO_EOS))
    assert s.accepted.sum() > 0 and (s.accepted < K * s.rounds).any()
    assert s.draft is None


def test_greedy_ngram_self_skip_equals_plain():
    K = 4
    s = _generate("int2", K, "ngram+self-skip", target="repeater", prompts="repeats")
    _assert_output(s, _cut(_plain("int2", "repeater", "repeats"), NO_EOS))
    assert s.accepted.sum() > 0


def test_self_skip_leaves_the_cache_as_a_plain_run():
    K = 3
    poisoned = _poison_all(kvcache.init_cache(CFG, KVS["int2"], B, P + MAX_NEW + K + 1, jnp.float32, K))
    s = _generate("int2", K, DraftMode.SELF_SKIP, poison=lambda c: jax.tree.map(jnp.copy, poisoned))
    plain = _generate("int2", 0, DraftMode.NONE, layers=None)
    _assert_output(s, _cut(_plain("int2"), NO_EOS))
    assert (s.accepted < K * s.rounds).any()
    assert_committed_as_plain(s, poisoned, plain)


def test_self_skip_steps_with_the_layer_loop_rolled():
    """Two steps (the first layer sliced off the stacks) with the layer loop rolled (Options.layer_unroll = 1)
    equal the unrolled loop's."""
    def steps(params, unroll):
        options = Options(layer_unroll=unroll)
        m = Models(params, Drafter(mode=DraftMode.SELF_SKIP, layers=1), CFG, 3, options=options)
        cache = kvcache.init_cache(CFG, KVS["int2"], B, 36, jnp.float32, 3)
        _, (k, v) = decoder.forward(params, CFG, jnp.asarray(PROMPTS["random"]()), cache, options=options)
        cache = kvcache.commit(cache, k, v, jnp.asarray(LENS) - 1)
        mm, cut = self_skip.skipped(m, cache)
        sc = self_skip.new_scratch(m, cut)
        sc, d1, _ = drafters.self_token(mm, cut, sc, jnp.ones((B,), jnp.int32), None, Sampler.make(B))
        sc, d2, _ = drafters.self_token(mm, cut, sc, d1, None, Sampler.make(B))
        return d1, d2, sc.k

    unrolled, rolled = (jax.jit(lambda p: steps(p, u))(_target()) for u in (True, 1))
    assert unrolled[2].shape[0] == 1  # one layer's scratch rows
    for x, y in zip(unrolled, rolled):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def test_lookahead_prices_the_cut():
    """The probe's step runs N layers: on the CPU's roofline estimate one of two layers costs less than the
    self-draft's step, and a round costs K of its steps; N is part of the probe's key."""
    est = lambda probe: lookahead._roofline(lookahead._loop(probe, None, 8, estimate=True))
    probe = lambda d: next(iter(drafters.of(m := Models(_target(), d, CFG, 3)).probes(
        m, KVS["int2"], 1, 64, 40, 3, jnp.float32).values()))
    skip, full = probe(Drafter(mode=DraftMode.SELF_SKIP, layers=1)), probe(Drafter(mode=DraftMode.SELF))
    assert est(skip) < est(full) and skip.what["layers"] == 1
    costs = lookahead.Costs.of(((1, 1.0),), {"self_skip": 0.25})
    assert costs.draft(DraftMode.SELF_SKIP, 4) == 1.0 and costs.draft("ngram+self-skip", 4) == 1.0


def test_load_checks_draft_layers():
    d = engine._load_drafter("self-skip", None, CFG, None, jnp.float32)
    assert d.mode == DraftMode.SELF_SKIP and self_skip.draft_layers(d, CFG) == 2  # the default: 3/4 of 2, up
    assert engine._draft_layers(1, d, CFG) == 1
    assert engine._draft_layers(1, Drafter(mode="ngram+self-skip"), CFG) == 1
    for n, drafter in ((3, d), (0, d), (True, d), (1, Drafter(mode=DraftMode.SELF))):
        with pytest.raises(ConfigError, match="draft layers"):
            engine._draft_layers(n, drafter, CFG)


def test_cli_rejects_draft_layers_without_self_skip(capsys):
    """One error line before the model load."""
    assert cli.main(["--draft", "ngram", "--draft-layers", "2", "x"]) == 2
    assert cli.main(["--draft", "self-skip", "--draft-layers", "0", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: --draft-layers") for line in err)
