"""Rows whose drafts stop paying inside one call (decode.fallback): a round no running row would draft in is a
plain decode step, and the drafter's state is kept in step over it (Proposer.idle).

A row that accepts nothing stops drafting after fallback.rounds_to_stop(K, pays) drafting rounds and is probed
after FIRST_WAIT rounds, then after waits that double; a probe that accepts brings it back. Greedy output equals
plain decoding in float32 for every built-in drafter whatever mix of drafting and plain rounds a call runs
(pays low, and above K + 1: plain steps bar the probes). The sampled rule across a plain step is
test_draft_auto's exact enumeration; here a sampled call through the fallback only runs and is reproducible.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.cache import kvcache
from jspec.config import KVConfig
from jspec.decode import drafters, fallback, loop
from jspec.decode.state import Drafter, DraftMode, Models, ProgramArgs
from jspec.model.sampling import Sampler
from test_speculative import CFG, KVS, _draft, _head, _target

B, P, MAX_NEW, K = 2, 8, 40, 3
LENS = np.array([8, 5], np.int32)
PROMPTS = np.random.default_rng(5).integers(2, CFG.vocab_size, (B, P)).astype(np.int32)


def _args(drafter: Drafter, K: int, pays=None, sampler=None, target="random") -> ProgramArgs:
    cap = P + MAX_NEW + K + 1
    m = Models(_target(target), drafter.at(K), CFG, K, fallback=None if pays is None else np.float32(pays))
    cache = kvcache.init_cache(CFG, KVS["int2"], B, cap, jnp.float32, K)
    dcache = drafters.init_cache(m.drafter, B, cap, jnp.float32, K) if K else None
    return ProgramArgs(m, jnp.asarray(PROMPTS), jnp.asarray(LENS), jnp.full((B,), MAX_NEW, jnp.int32),
                       sampler or Sampler.make(B), jnp.arange(B, dtype=jnp.uint32), cache, dcache,
                       jnp.asarray([-1], jnp.int32))


def _tokens(args: ProgramArgs):
    s = loop.generate_program(*args)
    return np.asarray(s.tokens)[:, :MAX_NEW], s


_PLAIN = {}


def _plain(target="random"):
    if target not in _PLAIN:
        _PLAIN[target] = _tokens(_args(Drafter(), 0, target=target))[0]
    return _PLAIN[target]


def _rounds(args: ProgramArgs):
    """Runs the call round by round -> (tokens [B, MAX_NEW], [rounds, B] bool: whether each row drafted; a row
    drafts in no round after it is done)."""
    s = loop.start_program(*args)
    history, drafted = [], np.zeros(B, np.int32)
    while not np.asarray(s.done).all():
        s = loop.round_program(args.models, args.sampler, args.max_new, args.eos_ids, s)
        now = np.asarray(s.rows.drafted)
        history.append(now > drafted)
        drafted = now
    return np.asarray(s.tokens)[:, :MAX_NEW], np.array(history)


def _documented(n_rounds: int, K: int, pays: float, accepts=lambda i: False) -> list[bool]:
    """Whether a row drafts in each round, by the rule as decode.fallback states it: it stops after rounds_to_stop
    drafting rounds that accept nothing; probes after FIRST_WAIT rounds without drafting, the wait doubling after
    each probe that does not bring it back; accepts(i): round i's probe accepts (then it drafts again)."""
    out, misses, idle, wait, on = [], 0, 0, fallback.FIRST_WAIT, fallback.rounds_to_stop(K, pays) > 0
    for i in range(n_rounds):
        drafts = on or idle >= wait
        out.append(drafts)
        if not drafts:
            idle += 1
        elif accepts(i):
            on, idle, wait, misses = True, 0, fallback.FIRST_WAIT, 0
        elif on:
            misses += 1
            on = misses < fallback.rounds_to_stop(K, pays)
        else:
            idle, wait = 0, min(2 * wait, fallback.MAX_WAIT)
    return out


@dataclasses.dataclass(frozen=True)
class Oracle(drafters.Proposer):
    """Drafts the plain run's next K tokens (always accepted in float32), wrong ones (each + 1) until a row has
    emitted `wrong_until` tokens."""

    plain: tuple = ()
    wrong_until: int = 0

    def propose(self, m, s, sampler, keys):
        plain = jnp.asarray(np.pad(np.array(self.plain), ((0, 0), (0, m.lookahead))))
        idx = s.count[:, None] + jnp.arange(m.lookahead)
        right = jnp.take_along_axis(plain, idx, axis=1)
        drafts = jnp.where(s.count[:, None] < self.wrong_until, (right + 1) % m.target_cfg.vocab_size, right)
        return drafts, drafters.point_mass(drafts, m.target_cfg.vocab_size, sampler), s.draft


@pytest.mark.parametrize("pays", [2.0, 3.5, 6.0])
def test_a_row_that_stops_accepting_drops_to_plain_steps_within_the_documented_rounds(pays):
    """Drafts never accepted: each row drafts exactly in the rounds the documented rule names (rounds_to_stop
    drafting rounds, none where a round costs more than K + 1 steps, then probes after 4, 8, 16 plain ones), and
    its tokens are plain decoding's."""
    drafters.register(f"never-{pays}", Oracle(plain=tuple(map(tuple, _plain())), wrong_until=MAX_NEW + 1))
    tokens, history = _rounds(_args(Drafter(mode=f"never-{pays}"), K, pays))
    np.testing.assert_array_equal(tokens, _plain())
    want = _documented(len(history), K, pays)
    assert fallback.rounds_to_stop(K, pays) == {2.0: 2, 3.5: 1, 6.0: 0}[pays]  # 6 > K + 1: probes only
    for b in range(B):
        assert history[:, b].tolist() == want, (b, history[:, b].astype(int))
    assert sum(want) < len(want) / 3  # most rounds were plain steps


def test_a_row_comes_back_when_a_probe_accepts_and_rows_are_tracked_apart():
    """Row 0's drafts are wrong until it has emitted 5 tokens, then right; the oracle is wrong for row 1 for good.
    Row 0 stops, a probe after its drafts turn right brings it back and it accepts K per round from then on; row 1
    takes part in row 0's drafting rounds (its own stays off) and probes after its wait once alone; tokens equal
    plain decoding's."""
    plain = _plain()
    
    # row 1 never right: its plain tokens shifted so its drafts are always wrong
    class Split(Oracle):
        def propose(self, m, s, sampler, keys):
            drafts, q, st = Oracle.propose(self, m, s, sampler, keys)
            drafts = drafts.at[1].set((drafts[1] + 1) % m.target_cfg.vocab_size)
            return drafts, drafters.point_mass(drafts, m.target_cfg.vocab_size, sampler), st

    drafters.register("oracle-split", Split(plain=tuple(map(tuple, plain)), wrong_until=5))
    tokens, history = _rounds(_args(Drafter(mode="oracle-split"), K, pays=2.0))
    np.testing.assert_array_equal(tokens, plain)
    row0 = history[:, 0].tolist()
    assert row0[:2] == [True, True] and not any(row0[2:6])  # off after 2 rounds, as documented
    back = row0.index(True, 2)  # its first probe, 4 plain rounds later: 7 tokens emitted
    end = back + -(-(MAX_NEW - 7) // (K + 1))  # then K + 1 tokens per round until it is done
    assert back == 6 and all(row0[back:end]) and not any(row0[end:])  # accepted, back for good
    assert history[:end, 1].tolist() == row0[:end]  # row 1 drafts in every round its batch-mate does
    # alone: its own probe (round 6, with row 0's) failed, so it waits 2 FIRST_WAIT rounds after the last shared
    # one (shared rounds restart the wait, never double it), then probes
    alone, wait = history[end:, 1].tolist(), 2 * fallback.FIRST_WAIT
    assert alone[: wait + 1] == [False] * wait + [True], alone


@pytest.mark.parametrize("mode", ["model", "head", "ngram", "ngram+model", "self", "self-skip"])
@pytest.mark.parametrize("pays", [1.2, 100.0])
def test_greedy_equals_plain_for_every_drafter_across_plain_rounds(mode, pays):
    """Whatever rounds draft (pays 100: none bar the probes), every drafter's state is kept in step over the plain
    ones: greedy tokens equal plain decoding's, float32, INT2."""
    target = "repeater" if "ngram" in mode else "random"
    if mode == "head":
        hcfg, hp = _head("full")
        d = Drafter(head=hp, mode=DraftMode.HEAD, head_cfg=hcfg)
    elif "model" in mode:
        d = Drafter(_draft("near", target), mode=DraftMode(mode), model_cfg=CFG)
    else:
        d = Drafter(mode=DraftMode(mode), layers=1 if mode == "self-skip" else None)
    tokens, s = _tokens(_args(d, K, pays, target=target))
    np.testing.assert_array_equal(tokens, _plain(target))
    drafted, rounds = np.asarray(s.rows.drafted), np.asarray(s.rounds)
    assert (drafted <= rounds).all()
    if pays == 100.0:
        assert (drafted < rounds / 3).all()  # plain steps but for the probes
    if pays == 1.2 and mode == "model":  # the near draft is often right
        assert int(s.accepted.sum()) > 0


def test_a_sampled_call_through_the_fallback_runs_and_is_reproducible():
    sampler = Sampler.make(B, [0.8] * B, [0] * B, [1.0] * B)
    d = Drafter(_draft("random"), mode=DraftMode.MODEL, model_cfg=CFG)
    a, s = _tokens(_args(d, K, 2.0, sampler))
    b, _ = _tokens(_args(d, K, 2.0, sampler))
    np.testing.assert_array_equal(a, b)
    assert (a >= 0).all() and (a < CFG.vocab_size).all()
    assert (np.asarray(s.rows.drafted) < np.asarray(s.rounds)).all()  # a random draft stops paying


def test_the_engine_turns_it_on_only_where_a_round_costs_min_pays_plain_steps():
    """A K the engine chose (a plan's Choice) runs with the fallback where its round is priced at MIN_PAYS plain
    steps or more, at that price; a cheaper round (n-gram lookup's, about a step) and a fixed K run without."""
    from jspec.config import GenerateConfig, SamplingConfig
    from jspec.runtime import lookahead
    from test_drafter_plugin import _engine

    eng = _engine(Drafter(mode=DraftMode.NGRAM))
    call = lambda choice: eng.prepare([[3, 4, 5]], [SamplingConfig()], [8], GenerateConfig(8, lookahead=4),
                                      choice=choice).models.fallback
    for verify, want in ((1.3, None), (fallback.MIN_PAYS + 1, fallback.MIN_PAYS + 1)):
        costs = lookahead.Costs(((1, 1.0), (5, verify)))  # the n-gram lookup's own step: 0
        got = call(lookahead.Choice(4, "ngram", 0.5, "prior", 1.5, costs))
        assert got is None if want is None else float(got) == pytest.approx(want)
    assert call(None) is None
