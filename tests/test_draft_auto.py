"""Draft "auto": the engine chooses the drafter and K per call (Engine.plan_auto), from each candidate's costs and
its acceptance (the prior, then what calls measured). Switches are forced by seeding the acceptance estimates.

Greedy output equals plain decoding in float32 when auto switches drafter or K between the calls of one
generation (the second call continues the first's tokens); the sampled rule's exact enumeration holds when the
rounds of one generation change drafter and K (test_speculative's helpers); a drafter whose drafts stop being
accepted falls back to plain decoding from the next call on, and a probe call prices it at its blended estimate;
one that keeps losing is probed ever more rarely (the waits double).
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.config import GenerateConfig, SamplingConfig
from jspec.decode import drafters
from jspec.decode.drafters import ngram
from jspec.decode.state import Drafter
from jspec.runtime import lookahead
from test_drafter_plugin import CFG, _engine
from test_speculative import V, _p, _round_dist, _target_dist

MAX_NEW = 8
GREEDY = [SamplingConfig()]


def _auto(*modes):
    eng = dataclasses.replace(_engine(Drafter(mode="auto")), tokenizer=None)
    return dataclasses.replace(eng, candidates=tuple(Drafter(mode=m) for m in modes))


def _ids(seed=0, n=9):
    return [np.random.default_rng(seed).integers(2, CFG.vocab_size, n).tolist()]


def _gen(eng, ids, n=MAX_NEW, K="auto"):
    [(tokens, stats)] = eng.generate_ids(ids, GREEDY, [n], GenerateConfig(n, lookahead=K, stop_at_eos=False))
    return tokens, stats


def _force(eng, mode, alpha, B=1):
    """The acceptance estimate of (mode, B's bucket) seeded as if 10^4 drafts at alpha were measured."""
    eng._seen[(mode, lookahead.batch_bucket(B))] = (1e4, 1e4 * alpha)
    eng._bench.pop((mode, lookahead.batch_bucket(B)), None)


def test_greedy_equals_plain_across_drafter_and_K_switches():
    eng, ids = _auto("ngram", "self"), _ids()
    plain, _ = _gen(eng, ids, 3 * MAX_NEW, K=0)
    out, seen = [], []
    for mode, alpha in (("self", 0.99), ("ngram", 0.99), ("self", 0.9)):  # drafter, then K changes
        _force(eng, "self" if mode == "ngram" else "ngram", 0.0)
        _force(eng, mode, alpha)
        tokens, st = _gen(eng, [ids[0] + out])
        out += tokens
        seen.append((st.draft_mode, st.lookahead))
        assert st.speculation["drafter"] == mode and st.speculation["why"]["winner"] == mode
    assert out == plain
    assert len({m for m, _ in seen}) == 2 and len({k for _, k in seen}) >= 2, seen


def test_auto_picks_plain_where_nothing_pays_and_reports_every_candidate():
    eng = _auto("ngram", "self")
    for m in ("ngram", "self"):
        _force(eng, m, 0.01)
    tokens, st = _gen(eng, _ids())
    assert st.draft_mode == "none" and st.lookahead == 0 and st.speculation["why"]["winner"] == "none"
    assert [c["drafter"] for c in st.speculation["why"]["candidates"]] == ["none", "ngram", "self"]
    assert all(c["predicted_speedup"] < lookahead.MIN_GAIN for c in st.speculation["why"]["candidates"])
    assert st.as_dict()["speculation"]["tokens_per_round"] == 1.0


@dataclasses.dataclass(frozen=True)
class Constant(drafters.Proposer):
    """Drafts one fixed token K times (never accepted where the target never emits it); priced as n-gram
    lookup."""

    token: int = 0
    prior_alpha: float = 0.99

    def propose(self, m, s, sampler, keys):
        drafts = jnp.full((s.next.shape[0], m.lookahead), self.token, jnp.int32)
        return drafts, drafters.point_mass(drafts, m.target_cfg.vocab_size, sampler), s.draft

    def probes(self, m, kv, batch, capacity, context, k_max, dtype):
        return {"ngram": ngram.lookup_probe(m, batch, capacity, context, k_max)}

    def round_cost(self, costs, K):
        return costs.step("ngram")


def test_a_drafter_that_stops_accepting_falls_back_next_call_and_is_probed():
    ids = _ids(3)
    plain, _ = _gen(_auto("ngram"), ids, 4 * MAX_NEW, K=0)
    never = next(t for t in range(CFG.vocab_size) if t not in plain)
    drafters.register("constant-never", Constant(token=never))
    eng = _auto("constant-never")
    picked = []
    for call in range(lookahead.PROBE_EVERY + 1):
        tokens, st = _gen(eng, ids)
        assert tokens == plain[:MAX_NEW]
        picked.append((st.lookahead, st.speculation["why"]["candidates"][1]["alpha_from"]))
    assert picked[0][0] > 0 and picked[0][1] == "prior"  # the prior says it pays: it runs, accepting nothing
    assert all(K == 0 and src == "last call" for K, src in picked[1:-1])  # from the next call on: plain
    assert picked[-1][1] != "last call"  # the probe call prices it at its blended estimate again


def test_a_drafter_that_keeps_losing_is_probed_ever_more_rarely():
    """A drafter with a long record of acceptance (its blended estimate stays high) stops accepting: it runs on the
    call that loses and then only on its probes, PROBE_EVERY calls later, then twice that; every output is plain's."""
    ids = _ids(4)
    plain, _ = _gen(_auto("ngram"), ids, MAX_NEW, K=0)
    never = next(t for t in range(CFG.vocab_size) if t not in plain)
    drafters.register("constant-lost", Constant(token=never))
    eng = _auto("constant-lost")
    _force(eng, "constant-lost", 0.99)
    ran = []
    for call in range(3 * lookahead.PROBE_EVERY + 1):
        tokens, st = _gen(eng, ids)
        assert tokens == plain
        if st.lookahead:
            ran.append(call)
    w = lookahead.PROBE_EVERY
    assert ran == [0, w, 3 * w], ran
    assert eng._bench[("constant-lost", 1)].probe_at == 3 * w + 4 * w  # the next: after 4, 8, then 16 calls


def _switched_dist(kinds, ctx, n):
    """{first n emitted tokens: probability} when round i drafts with kinds[i] (the last kind from then on; None: a
    plain step, one token from the target)."""
    kind, rest = kinds[0], kinds[1:] or kinds
    rounds = {(x,): _p("random", ctx)[x] for x in range(V)} if kind is None else _round_dist(kind, ctx)
    out = {}
    for seq, pr in rounds.items():
        tails = {(): 1.0} if len(seq) >= n else _switched_dist(rest, ctx + seq, n - len(seq))
        for tail, pr2 in tails.items():
            key = (seq + tail)[:n]
            out[key] = out.get(key, 0.0) + pr * pr2
    return out


@pytest.mark.parametrize("kinds", [("ngram", "random"), ("random", None, "onehot"), (None, "ngram")])
def test_exact_enumeration_holds_across_a_switch(kinds):
    """The first 1-3 emitted tokens are distributed as the target's when a generation changes drafter (and falls
    back to plain steps) between rounds: total variation <= 1e-6 in float64."""
    with jax.enable_x64(True):
        for n in (1, 2, 3):
            got, want = _switched_dist(kinds, (), n), _target_dist("random", n)
            assert set(got) <= set(want)
            assert 0.5 * sum(abs(got.get(s, 0.0) - want[s]) for s in want) <= 1e-6, (kinds, n)
    _round_dist.cache_clear()


def test_load_auto_holds_the_drafters_with_probes(tmp_path):
    """Without the shipped target: n-gram, self and ngram+self (no draft model); a registered drafter without
    cost probes (repeat-last) is never a candidate."""
    from jspec.runtime import engine
    names = [d.mode for d in engine._auto_drafters(tmp_path, None, None, jnp.float32)]
    assert {"ngram", "self", "ngram+self"} <= set(names)
    assert not {"none", "model", "ngram+model", "repeat-last"} & set(names)
