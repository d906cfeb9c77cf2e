"""Choosing the lookahead K of a generate call (`GenerateConfig(lookahead="auto")`), K = 0 included.

With a per-draft acceptance alpha, a round with K drafts emits E(K) = (1 - alpha^(K+1)) / (1 - alpha)
tokens and costs draft(K) + verify(K + 1); plain decoding emits one token per verify(1). The predicted
speed-up is E(K) verify(1) / (draft(K) + verify(K + 1)), and the K with the best one is taken, or 0
(no speculation) unless the best beats plain decoding by MIN_GAIN.

- Costs are measured on the device by a few small jitted loops: a target forward over n tokens per row
  for a few n, interpolated in between, and the drafter's own parts (its cost probes, Proposer.probes: one
  draft-model token; one EAGLE-3 head step; one self-draft step; one n-gram lookup), each at the call's batch
  and context: the target's forward reads the whole cache, so its cost
  grows with the context, while a self-draft step and a windowed draft model's or head's read a window only,
  and stay flat. Measured once per batch size and power of two of the cache capacity (cost_shape: a
  measurement costs seconds of compiling; keyed by the exact capacity, every batch of a job paid for its
  own), and kept in memory and on
  disk (cache_root()/lookahead/, keyed by device kind, models, KV layout, batch and that capacity). The
  ordinary round overhead (accept, emit, loop) is left out of both sides, which favours plain decoding:
  the gain is under- rather than over-estimated.
- alpha is a prior per drafter (Proposer.prior_alpha, from the shipped pair's measured acceptance), moved
  towards what the engine's earlier calls in that mode and batch size measured (an online estimate; under draft
  "auto" earlier processes' calls too, kept on disk: runtime.learned).
- A batch runs in lockstep: its rounds go on until its slowest row is done, so what a call gains is set
  by that row, not by the mean row. Rows differ (one prompt is copied text, another fresh code), and
  the more rows, the further the slowest falls below the mean: on the H200 at batch 8 and 32 the
  mean-row estimate predicted 1.3-2.4x where 0.9-1.3x was measured. So a call is learnt from as its
  slowest row (observe_batch), per batch bucket, and the prior of a bucket not yet seen is lowered by
  the expected minimum of B rows (prior).
Measuring never touches the caller's arrays or random streams, so the choice changes speed only: greedy
output is the same for every K; a sampled output follows the same distribution for every K, though
which sample a seed gives depends on K (fix `lookahead` to reproduce a sample across machines).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
import sys
import time
import typing
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jspec.cache import kvcache
from jspec.config import KVConfig
from jspec.decode import drafters
from jspec.decode.drafters.base import Place, Probe, at_context, layer_key
from jspec.decode.state import Drafter, Models
from jspec.model.decoder import compile_options
from jspec.files import atomic_write
from jspec.paths import cache_root
from jspec.runtime import programs, sharding

CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16)  # K tried by auto (<= config.MAX_LOOKAHEAD): few programs to compile
VERIFY_POINTS = (1, 5, 17)  # tokens per row at which the target forward is timed
MIN_GAIN = 1.05  # speculate only if predicted at least this much faster than plain decoding
PRIOR_WEIGHT = 16  # the prior counts as this many drafts in the online estimate
# Spread of per-row alpha across prompts: the slowest of B rows sits about ROW_SPREAD * sqrt(2 ln B) below
# the mean (the expected maximum of B normals). Fitted to the shipped pair at batch 32 on the H200 (mean
# alpha 0.59-0.61, effective 0.27-0.37).
ROW_SPREAD = 0.07
# What the costs depend on besides their shapes: the code a timed loop runs (a cost file of other code is never
# read back; nothing to bump by hand).
TIMED_CODE = ("config.py", "numerics.py", "struct.py", "int2", "kernels", "cache", "attention", "model", "decode")


@dataclasses.dataclass(frozen=True)
class Costs:
    """Seconds per step, measured on one device, batch and capacity: the target's verify and the drafters' timed
    parts (Proposer.probes, by name)."""

    verify: tuple[tuple[int, float], ...]  # (n, target forward + commit over n tokens per row), ascending n
    draft_step: float = 0.0  # "draft": one draft-model token per row: a forward of two rows, commit, draw
    ngram: float = 0.0  # "ngram": one n-gram lookup over the history and its update
    head_step: float = 0.0  # "head": one EAGLE-3 head token per row (forward + commit + draw)
    self_step: float = 0.0  # "self": one self-draft token per row: the target over its window and scratch, draw
    other: tuple[tuple[str, float], ...] = ()  # the parts of drafters registered from outside, by name

    @classmethod
    def of(cls, verify, parts: dict[str, float]) -> Costs:
        named = {"draft": "draft_step", "ngram": "ngram", "head": "head_step", "self": "self_step"}
        return cls(verify, **{named[k]: t for k, t in parts.items() if k in named},
                   other=tuple(sorted((k, t) for k, t in parts.items() if k not in named)))

    def step(self, name: str) -> float:
        """One step of the part `name` (0 where none was measured)."""
        named = dict(draft=self.draft_step, ngram=self.ngram, head=self.head_step, self=self.self_step)
        return named[name] if name in named else dict(self.other).get(name, 0.0)

    def verify_at(self, n: int) -> float:
        """Piecewise-linear between the measured n (the cost is flat, then linear: an upper bound)."""
        ns, ts = zip(*self.verify)
        return float(np.interp(n, ns, ts))

    def draft(self, mode: str, K: int) -> float:
        """One round's drafting with K drafts (Proposer.round_cost)."""
        return drafters.proposer(mode).round_cost(self, K)

    def as_ms(self) -> dict:
        return dict(verify={str(n): round(t * 1e3, 4) for n, t in self.verify},
                    draft_step=round(self.draft_step * 1e3, 4), ngram=round(self.ngram * 1e3, 4),
                    head_step=round(self.head_step * 1e3, 4), self_step=round(self.self_step * 1e3, 4),
                    **{name: round(t * 1e3, 4) for name, t in self.other})

    @classmethod
    def from_ms(cls, ms: dict) -> Costs:
        """as_ms read back (a benchmark's JSON)."""
        ms = dict(ms)
        verify = tuple(sorted((int(n), t / 1e3) for n, t in ms.pop("verify").items()))
        named = {k: ms.pop(k) / 1e3 for k in ("draft_step", "ngram", "head_step", "self_step")}
        return cls(verify, **named, other=tuple(sorted((k, t / 1e3) for k, t in ms.items())))


def expected_tokens(alpha: float, K: int) -> float:
    """Tokens emitted per round with K drafts, each accepted with probability alpha after its predecessor."""
    return K + 1.0 if alpha >= 1 else (1 - alpha ** (K + 1)) / (1 - alpha)


def speedup(costs: Costs, mode: str, alpha: float, K: int) -> float:
    """Predicted tokens/s with K drafts over tokens/s of plain decoding (1 at K = 0)."""
    if K == 0:
        return 1.0
    return expected_tokens(alpha, K) * costs.verify_at(1) / (costs.draft(mode, K) + costs.verify_at(K + 1))


@dataclasses.dataclass(frozen=True)
class Choice:
    """The K of one call and why: for the call's stats."""

    K: int
    mode: str
    alpha: float
    alpha_from: str  # "prior" or "N drafts measured"
    speedup: float  # predicted, at K
    costs: Costs
    measure_s: float = 0.0  # seconds this call spent getting the costs: compiling and timing, or reading them
    priced: tuple[Priced, ...] = ()  # draft "auto": every candidate, plain decoding first (the winner: mode, K)

    def stats(self) -> dict:
        d = dict(K=self.K, mode=self.mode, alpha=round(self.alpha, 3), alpha_from=self.alpha_from,
                 predicted_speedup=round(self.speedup, 3), costs_ms=self.costs.as_ms(),
                 measure_s=round(self.measure_s, 3))
        return d | (dict(candidates=[p.stats() for p in self.priced]) if self.priced else {})


def breakeven(choice: Choice | None) -> float | None:
    """The tokens per row a round of the chosen drafter and K must emit to cost no more than plain steps (its
    price over a plain step's: decode.fallback's `pays`); None without a choice or at K = 0."""
    if choice is None or not choice.K:
        return None
    c = choice.costs
    return (c.draft(choice.mode, choice.K) + c.verify_at(choice.K + 1)) / c.verify_at(1)


def choose(costs: Costs, mode: str, alpha: float, k_max: int, ks=CANDIDATES) -> tuple[int, float]:
    """(K, predicted speed-up): the best K of ks up to k_max, or (0, 1.0) if none gains MIN_GAIN."""
    best = max(((speedup(costs, mode, alpha, K), K) for K in ks if 0 < K <= k_max), default=(1.0, 0))
    return (best[1], best[0]) if best[0] >= MIN_GAIN else (0, 1.0)


# ----------------------------------------------------------------------------- draft "auto": the drafter too


@dataclasses.dataclass(frozen=True)
class Priced:
    """One candidate of draft "auto" (a drafter at its best K) priced at the call's shape: for the call's stats."""

    mode: str  # the drafter's name ("none": plain decoding)
    K: int
    alpha: float  # the acceptance it was priced with
    alpha_from: str  # "prior", "N drafts measured", "last call" (its own, lower) or "probe, ..." (auto_alpha); what
    # earlier processes learnt ends "(M read from disk)" or "(read from disk)" (Engine.recall, runtime.learned)
    cost_s: float  # one round: its drafting with K drafts and the verify over K + 1 (plain: the verify over 1)
    tokens: float  # expected tokens per round (expected_tokens)
    speedup: float  # tokens / cost_s over plain decoding's 1 / verify(1)

    def stats(self) -> dict:
        return dict(drafter=self.mode, K=self.K, alpha=round(self.alpha, 3), alpha_from=self.alpha_from,
                    round_ms=round(self.cost_s * 1e3, 4), tokens_per_round=round(self.tokens, 3),
                    predicted_speedup=round(self.speedup, 3))


def price(costs: Costs, mode: str, alpha: float, alpha_from: str, k_max: int, ks=CANDIDATES) -> Priced:
    """mode at its best K of ks up to k_max, whether or not that beats plain decoding (winner decides)."""
    _, K = max(((speedup(costs, mode, alpha, K), K) for K in ks if 0 < K <= k_max), default=(1.0, 0))
    if K == 0:
        return dataclasses.replace(plain(costs), mode=mode, alpha=alpha, alpha_from=alpha_from)
    return Priced(mode, K, alpha, alpha_from, costs.draft(mode, K) + costs.verify_at(K + 1),
                  expected_tokens(alpha, K), speedup(costs, mode, alpha, K))


def plain(costs: Costs) -> Priced:
    return Priced("none", 0, 0.0, "prior", costs.verify_at(1), 1.0, 1.0)


def winner(priced: list[Priced]) -> Priced:
    """The fastest candidate that beats plain decoding (the first) by MIN_GAIN, else plain decoding."""
    best = max(priced[1:], key=lambda p: p.speedup, default=priced[0])
    return best if best.K and best.speedup >= MIN_GAIN else priced[0]


# A drafter whose call lost (its own acceptance, the slowest row's, prices it under MIN_GAIN at the K it ran: it would
# not have been chosen) is benched: priced at that acceptance rather than at the blended estimate (which moves by at
# most the call's share of PRIOR_WEIGHT + all drafts measured), so it falls back from the next call on. Its probe, the
# PROBE_EVERY-th call of its batch bucket after the loss, prices it at its blended estimate again: where that says it
# pays it runs that call and is measured again. Each probe that loses too doubles the wait before the next (up to
# PROBE_MAX calls): a drafter that keeps losing runs on a vanishing share of calls (calls 0, 4, 12, 28, ... after a
# first loss at call 0); one call that pays unbenches it.
PROBE_EVERY = 4
PROBE_MAX = 64


@dataclasses.dataclass(frozen=True)
class Bench:
    """What draft "auto" keeps of one (drafter, batch bucket)'s last call (after_call)."""

    last: float  # that call's measured acceptance (last_alpha)
    probe_at: int | None  # benched: the bucket's call count from which it is priced at its blended estimate again
    wait: int = PROBE_EVERY  # calls between the loss and that probe


def after_call(bench: Bench | None, costs: Costs, mode: str, K: int, alpha: float, calls: int) -> Bench:
    """bench after a call of mode at K that measured alpha, the calls-th of its batch bucket (see PROBE_EVERY)."""
    if speedup(costs, mode, alpha, K) >= MIN_GAIN:
        return Bench(alpha, None)
    wait = PROBE_EVERY if bench is None or bench.probe_at is None else min(2 * bench.wait, PROBE_MAX)
    return Bench(alpha, calls + wait, wait)


def auto_alpha(mode: str, seen: tuple[float, float], bench: Bench | None, calls: int, B: int) -> tuple[float, str]:
    """(alpha, where from) of one candidate of draft "auto" (see PROBE_EVERY): bench, its last call (None: never
    ran); calls, the calls its batch bucket made so far. Its last call's acceptance where lower than the blended
    estimate, bar its probe."""
    alpha, source = estimate(mode, seen, B)
    if bench is None or bench.last >= alpha:
        return alpha, source
    if bench.probe_at is not None and calls >= bench.probe_at:
        return alpha, f"probe, {source}"
    return bench.last, "last call"


def last_alpha(K: int, rounds, count) -> float | None:
    """A call's measured acceptance as observe_batch counts it (the slowest row's), or None without drafts."""
    rounds, count = np.asarray(rounds), np.asarray(count)
    if K == 0 or rounds.size == 0 or int(rounds.max()) == 0:
        return None
    r = int(rounds.max())
    return alpha_from_accepted(max(int(count.max()) - 1 - r, 0) / r, K)


# ----------------------------------------------------------------------------- acceptance estimate


def alpha_from_accepted(mean_accepted: float, K: int) -> float:
    """The per-draft alpha whose expected accepted drafts per round, sum_{i=1..K} alpha^i, is the mean
    measured (bisection: the sum grows with alpha)."""
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, K) - 1 < mean_accepted else (lo, mid)
    return lo


def batch_bucket(B: int) -> int:
    """The power of two at or above B: calls of similar batch share one acceptance estimate."""
    return 1 << max(B - 1, 0).bit_length()


def prior(mode: str, B: int) -> float:
    """The drafter's prior acceptance for one row (Proposer.prior_alpha), lowered to the expected slowest of B
    rows."""
    return max(drafters.proposer(mode).prior_alpha - ROW_SPREAD * float(np.sqrt(2 * np.log(B))), 0.0)


def observe_batch(seen: tuple[float, float], K: int, rounds, count) -> tuple[float, float]:
    """observe() for a call's rows (rounds and tokens emitted per row): as one row that took the batch's
    most rounds to emit its most tokens, the pace the batch ran at (count = 1 + rounds + accepted)."""
    rounds, count = np.asarray(rounds), np.asarray(count)
    if rounds.size == 0:
        return seen
    r = int(rounds.max())
    return observe(seen, K, r, max(int(count.max()) - 1 - r, 0))


def observe(seen: tuple[float, float], K: int, rounds: int, accepted: int) -> tuple[float, float]:
    """Adds one call to seen = (drafts proposed, alpha-weighted drafts); a call without drafts adds nothing."""
    if K == 0 or rounds == 0:
        return seen
    n = K * rounds
    return seen[0] + n, seen[1] + n * alpha_from_accepted(accepted / rounds, K)


def estimate(mode: str, seen: tuple[float, float], B: int = 1) -> tuple[float, str]:
    """(alpha, where it comes from): the prior at batch B, pulled towards the measured calls by their drafts."""
    n, weighted = seen
    alpha = (PRIOR_WEIGHT * prior(mode, B) + weighted) / (PRIOR_WEIGHT + n)
    return alpha, (f"{int(n)} drafts measured" if n else "prior")


# --------------------------------------------------------------------------------------- measuring


@dataclasses.dataclass
class _Loop:
    """A jitted loop of `steps` steps of a probe's step(m, carry) -> carry, lowered for the shapes of its carry.
    make() builds the carry again for timing: loops are lowered and compiled together (programs.compile_all), and
    their carries (caches as large as the caller's) are alive one at a time."""

    lowered: jax.stages.Lowered | None  # None on the CPU (estimated, not timed: roofline)
    m: Models
    make: typing.Callable
    steps: int
    options: dict | None = None  # XLA's compiler options (model.compile_options)
    one_step: jax.stages.Lowered | None = None  # one step alone, lowered (the CPU's estimate reads its costs)


def _place(mesh) -> Place:
    """A probe's carry placed on the mesh (its caches by row, and by head where heads=True; its rows by row)."""
    if mesh is None:
        return Place(lambda cache, heads: cache, lambda x: x)
    return Place(lambda cache, heads: sharding.shard_cache(cache, mesh, heads),
                 lambda x: sharding.shard_batch(x, mesh))


def _loop(probe: Probe, mesh, steps: int, estimate: bool | None = None) -> _Loop:
    """estimate (default: on the CPU): the step lowered alone for _roofline, not the loop for timing. A timed loop's
    carry comes back in the shardings it went in with (out_shardings), as _time feeds it back: left to GSPMD, a
    zero-size array (a BF16 cache's INT2 codes and scales, [B, H, 2, 0, D/4]) came back replicated and the next
    call refused it (on a mesh, those were to be split over "dp")."""
    m, step, make = probe.models, probe.step, lambda: probe.make(_place(mesh))
    carry = make()
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), carry)
    if m.options.backend == "cpu" if estimate is None else estimate:
        # the layers unrolled: XLA's cost analysis counts a rolled loop's body once, not once per layer
        unrolled = m.replace(options=dataclasses.replace(m.options, layer_unroll=True))
        return _Loop(None, m, make, steps, one_step=jax.jit(step).lower(unrolled, shapes))
    run = jax.jit(lambda m, c: jax.lax.fori_loop(0, steps, lambda i, c: step(m, c), c), donate_argnums=1,
                  out_shardings=jax.tree.map(lambda x: x.sharding, carry))
    return _Loop(run.lower(m, shapes), m, make, steps, compile_options())


# On the CPU the costs are estimated, not timed: compiling the cost loops took 20-29 s of a first run there, and
# their timings moved the choice of K between runs of one command (bf16 output then differed). The estimate is the
# roofline of a step's XLA cost analysis: its multiply-adds at CPU_FLOPS or its bytes at CPU_BYTES_PER_S, whichever
# takes longer (rough figures for a few cores; only their ratio and the steps' relative costs decide K).
CPU_FLOPS, CPU_BYTES_PER_S = 1e11, 2e10


def _roofline(loop: _Loop) -> float:
    """Seconds of one step of loop on the CPU, estimated (CPU_FLOPS)."""
    cost = loop.one_step.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return max(cost.get("flops", 0.0) / CPU_FLOPS, cost.get("bytes accessed", 0.0) / CPU_BYTES_PER_S, 1e-9)


def _time(run, loop: _Loop, reps: int = 3, budget_s: float = 1.0) -> float:
    """Median seconds of one step of a compiled loop: a warm-up call, then up to `reps` timed calls while
    they fit in budget_s (a slow device needs fewer to average)."""
    carry, times = loop.make(), []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        carry = jax.block_until_ready(run(loop.m, carry))
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s and len(times) >= 2:
            break
    return statistics.median(times[1:]) / loop.steps


def per_step(probe: Probe, steps: int, mesh=None) -> float:
    """Median seconds of one step of a probe, timed as jitted loops of `steps` steps (one loop alone)."""
    loop = _loop(probe, mesh, steps, estimate=False)
    return _time(loop.lowered.compile(compiler_options=loop.options), loop)


def verify_probe(m: Models, kv: KVConfig, B, capacity, context, n: int, dtype) -> Probe:
    """The verify forward over n tokens per row, as a round runs it (Models.target_forward), and the commit of
    nothing (the length, so the cost, stays); the argmax of every position fed back as the next tokens."""
    def step(m, carry):
        tok, cache = carry
        logits, (k, v) = m.target_forward(tok, cache)
        cache = kvcache.commit(cache, k, v, jnp.zeros_like(cache.length), m.options)
        return jnp.argmax(logits, -1).astype(jnp.int32), cache

    def make(place):
        cache = kvcache.init_cache(m.target_cfg, kv, B, capacity, dtype, n - 1)
        return place.batch(jnp.zeros((B, n), jnp.int32)), place.cache(at_context(cache, context), True)

    what = dict(model=m.target_cfg, kv=kv, attn=m.attn_impl, **layer_key(m.options))
    return Probe(what, m.replace(drafter=Drafter()), step, make)


def cost_shape(capacity: int, k_max: int) -> tuple[int, int]:
    """(capacity, context) at which the costs of a call with cache `capacity` are measured, shared by every
    capacity from that power of two up to twice it: the power of two at or below `capacity` (no more memory
    than the call's own cache), nearly full (context + k_max + 1 tokens: about the geometric middle of the
    contexts those calls decode at). A capacity too small for that keeps its own shape."""
    cap = 1 << (capacity.bit_length() - 1)
    if cap < 2 * (k_max + 1):
        cap = capacity
    return cap, cap - k_max - 1


def measure(m: Models, kv: KVConfig, B: int, capacity: int, context: int, k_max: int, dtype, mesh=None,
            memo: dict | None = None, steps: int = 8, say=None) -> Costs:
    """Times what a round of m's drafter costs at these shapes (see the module docstring): the target's verify
    and the drafter's own parts (Proposer.probes). Each part is kept in memo and on disk by what it depends on:
    the verify times serve every drafter. The parts not kept are compiled side by side, then timed one at a time
    (on the CPU estimated: _roofline). say: told when costs are measured (not when read back)."""
    memo = {} if memo is None else memo
    shapes = dict(B=B, capacity=capacity, context=context, dtype=str(dtype),
                  mesh=None if mesh is None else dict(mesh.shape))
    points = sorted({n for n in VERIFY_POINTS if n <= k_max + 1} | {k_max + 1})
    verify = [verify_probe(m, kv, B, capacity, context, n, dtype) for n in points]
    parts = {"verify": (dict(verify[0].what, n=points), verify)}
    parts |= {name: (p.what, [p]) for name, p in drafters.of(m).probes(m, kv, B, capacity, context, k_max,
                                                                         dtype).items()}
    with sharding.context(mesh):
        seconds = _cached(memo, {name: (dict(part=name, **what, **shapes), len(probes),
                                        lambda probes=probes: [_loop(p, mesh, steps) for p in probes])
                                 for name, (what, probes) in parts.items()},
                          say and (lambda: say(f"measuring lookahead costs at batch {B}, capacity {capacity} (once "
                                               f"per shape: kept in {cache_root() / 'lookahead'})")))
    return Costs.of(tuple(zip(points, seconds.pop("verify"))), {name: t[0] for name, t in seconds.items()})


# ----------------------------------------------------------------------------------- the disk cache


def _cached(memo: dict, parts: dict, starting=None) -> dict:
    """{name: seconds per step of each of its loops} for parts {name: (what it depends on, its loop count, its
    loops)} on this device and JAX: from memo, else from its file under cache_root()/lookahead, else
    measured (then kept in memo and the former): the missing parts' loops are compiled together
    (programs.compile_all), then timed one at a time. A file that does not hold as many positive finite times as
    the part has loops is measured again and replaced, with one warning line for all such files."""
    dev = jax.devices()[0]
    out, missing, bad = {}, [], []
    for name, (what, count, loops) in parts.items():
        record = dict(what, device=dev.device_kind, platform=dev.platform, devices=jax.device_count(),
                      jax=jax.__version__, code=programs.source_digest(*TIMED_CODE))
        key = hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:32]
        path = cache_root() / "lookahead" / f"{name}-{key}.json"
        if key not in memo:
            value = _read_times(path, count)
            if value is _BAD:
                bad.append(path)
            elif value is not None:
                memo[key] = value
        if key not in memo:
            missing.append((name, key, path, record, loops))
            continue
        out[name] = memo[key]
    if bad:
        more = ", ..." if len(bad) > 1 else ""
        print(f"warning: ignored {len(bad)} malformed lookahead cost file(s) ({bad[0]}{more}): measuring the costs "
              "again", file=sys.stderr)
    if missing and starting:
        starting()
    missing = [(*m, make()) for *m, make in missing]  # the loops lowered
    timed = [loop for *_, loops in missing for loop in loops if loop.lowered is not None]
    runs = programs.compile_all([x.lowered for x in timed], [x.options for x in timed]) if timed else []
    for name, key, path, record, loops in missing:
        memo[key] = out[name] = [_roofline(x) if x.lowered is None else _time(runs.pop(0), x) for x in loops]
        _save(path, dict(record, value=memo[key]))
    return out


_BAD = object()  # _read_times' answer for a file that exists but does not hold the times


def _read_times(file: Path, count: int):
    """The `count` seconds per step a cost file holds as {"value": [...]}: None when there is no file, _BAD when
    it is unreadable, not JSON, of another shape, or holds anything but positive finite numbers (a negative or
    zero cost would make every round look free)."""
    try:
        record = json.loads(file.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return _BAD
    value = record.get("value") if isinstance(record, dict) else None
    ok = isinstance(value, list) and len(value) == count and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < math.inf for t in value)
    return [float(t) for t in value] if ok else _BAD


def _save(path: Path, record: dict) -> None:
    """Written atomically (another process may be reading); a cache that cannot be written is skipped."""
    try:
        atomic_write(path, json.dumps(record, default=str))
    except OSError:
        pass
