"""Choosing the lookahead K of a generate call (`GenerateConfig(lookahead="auto")`), K = 0 included.

With a per-draft acceptance alpha, a round with K drafts emits E(K) = (1 - alpha^(K+1)) / (1 - alpha)
tokens and costs draft(K) + verify(K + 1); plain decoding emits one token per verify(1). The predicted
speed-up is E(K) verify(1) / (draft(K) + verify(K + 1)), and the K with the best one is taken, or 0
(no speculation) unless the best beats plain decoding by MIN_GAIN.

- Costs are measured on the device by a few small jitted loops (a target forward over n tokens per row
  for a few n, interpolated in between; one draft-model token; one EAGLE-3 head step; one self-draft step; one
  n-gram lookup), each at the call's batch and context: the target's forward reads the whole cache, so its cost
  grows with the context, while a self-draft step and a windowed draft model's or head's read a window only,
  and stay flat. Measured once per batch size and power of two of the cache capacity (cost_shape: a
  measurement costs seconds of compiling; keyed by the exact capacity, every batch of a job paid for its
  own), and kept in memory and on
  disk (cache_root()/lookahead/, keyed by device kind, models, KV layout, batch and that capacity). The
  ordinary round overhead (accept, emit, loop) is left out of both sides, which favours plain decoding:
  the gain is under- rather than over-estimated.
- alpha is a prior per draft mode (PRIOR_ALPHA, from the shipped pair's measured acceptance), moved
  towards what the engine's earlier calls in that mode and batch size measured (an online estimate).
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
from jspec.decode import drafters, loop, ngram
from jspec.decode.state import DraftMode, Models
from jspec.model.decoder import compile_options, is_stacked
from jspec.model.sampling import Sampler
from jspec.files import atomic_write
from jspec.paths import cache_root
from jspec.runtime import programs, sharding

CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16)  # K tried by auto (<= config.MAX_LOOKAHEAD): few programs to compile
VERIFY_POINTS = (1, 5, 17)  # tokens per row at which the target forward is timed
MIN_GAIN = 1.05  # speculate only if predicted at least this much faster than plain decoding
# Per-draft acceptance before a call has measured one: a little under the shipped pair's on held-out code
# (greedy, K = 4: model 0.39 at batch 1; ngram 0.52 and ngram+model 0.68 at batch 8).
# "head": EAGLE-3's published chain acceptance (tau 2.8-3.5 at K = 7 on Llama-3.1-8B: alpha about 0.65-0.75),
# taken lower for the short training runs a head gets here; the online estimate corrects it after one call.
# "self" and "ngram+self": the shipped target over its own window (sink 64 + recent 256), greedy, K = 4, held-out
# code at 2K-4K contexts: 3.3-4.0 and 3.3-3.7 tokens per round, alpha 0.79-0.89 and 0.79-0.85 (3 prompts of 32
# tokens each, benchmarks/results/long_context_acceptance.json), taken well under for so few tokens.
PRIOR_ALPHA = {DraftMode.MODEL: 0.4, DraftMode.NGRAM: 0.45, DraftMode.NGRAM_MODEL: 0.55, DraftMode.HEAD: 0.6,
               DraftMode.SELF: 0.7, DraftMode.NGRAM_SELF: 0.7}
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
    """Seconds per step, measured on one device, batch and capacity."""

    verify: tuple[tuple[int, float], ...]  # (n, target forward + commit over n tokens per row), ascending n
    draft_step: float = 0.0  # one draft-model token per row: a forward of two rows, commit, draw (drafters.model_token)
    ngram: float = 0.0  # one n-gram lookup over the history and its update
    head_step: float = 0.0  # one EAGLE-3 head token per row (forward + commit + draw)
    self_step: float = 0.0  # one self-draft token per row: the target over its window and scratch, draw

    def verify_at(self, n: int) -> float:
        """Piecewise-linear between the measured n (the cost is flat, then linear: an upper bound)."""
        ns, ts = zip(*self.verify)
        return float(np.interp(n, ns, ts))

    def draft(self, mode: DraftMode, K: int) -> float:
        """One round's drafting: K draft-model tokens (K forwards, the first also resyncs) and/or a lookup.
        ngram+model is costed as if the model ran every round (it skips its K - 1 steps when every row
        matches): an upper bound. A head round is its resync forward (K + 1 pairs, costed as one step: both
        read the same weights) and K - 1 steps; its features come with the verify forward (one fc matmul,
        not timed: the verify is timed without it)."""
        mode = DraftMode(mode)  # a name ("model") or the enum
        if mode == DraftMode.HEAD:
            return K * self.head_step
        steps = self.draft_step if mode.uses_model else self.self_step if mode.drafts_itself else 0.0
        return K * steps + (self.ngram if mode.copies else 0.0)

    def as_ms(self) -> dict:
        return dict(verify={str(n): round(t * 1e3, 4) for n, t in self.verify},
                    draft_step=round(self.draft_step * 1e3, 4), ngram=round(self.ngram * 1e3, 4),
                    head_step=round(self.head_step * 1e3, 4), self_step=round(self.self_step * 1e3, 4))


def expected_tokens(alpha: float, K: int) -> float:
    """Tokens emitted per round with K drafts, each accepted with probability alpha after its predecessor."""
    return K + 1.0 if alpha >= 1 else (1 - alpha ** (K + 1)) / (1 - alpha)


def speedup(costs: Costs, mode: DraftMode, alpha: float, K: int) -> float:
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

    def stats(self) -> dict:
        return dict(K=self.K, mode=self.mode, alpha=round(self.alpha, 3), alpha_from=self.alpha_from,
                    predicted_speedup=round(self.speedup, 3), costs_ms=self.costs.as_ms(),
                    measure_s=round(self.measure_s, 3))


def choose(costs: Costs, mode: DraftMode, alpha: float, k_max: int) -> tuple[int, float]:
    """(K, predicted speed-up): the best candidate K <= k_max, or (0, 1.0) if none gains MIN_GAIN."""
    best = max(((speedup(costs, mode, alpha, K), K) for K in CANDIDATES if K <= k_max), default=(1.0, 0))
    return (best[1], best[0]) if best[0] >= MIN_GAIN else (0, 1.0)


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


def prior(mode: DraftMode, B: int) -> float:
    """PRIOR_ALPHA of the mode for one row, lowered to the expected slowest of B rows."""
    return max(PRIOR_ALPHA[mode] - ROW_SPREAD * float(np.sqrt(2 * np.log(B))), 0.0)


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


def estimate(mode: DraftMode, seen: tuple[float, float], B: int = 1) -> tuple[float, str]:
    """(alpha, where it comes from): the prior at batch B, pulled towards the measured calls by their drafts."""
    n, weighted = seen
    alpha = (PRIOR_WEIGHT * prior(mode, B) + weighted) / (PRIOR_WEIGHT + n)
    return alpha, (f"{int(n)} drafts measured" if n else "prior")


# --------------------------------------------------------------------------------------- measuring


@dataclasses.dataclass
class _Loop:
    """A jitted loop of `steps` steps of step(m, carry) -> carry, lowered for the shapes of make()'s carry.
    make() builds the carry again for timing: loops are lowered and compiled together (programs.compile_all), and
    their carries (caches as large as the caller's) are alive one at a time."""

    lowered: jax.stages.Lowered | None  # None on the CPU (estimated, not timed: roofline)
    m: Models
    make: typing.Callable
    steps: int
    options: dict | None = None  # XLA's compiler options (model.compile_options)
    one_step: jax.stages.Lowered | None = None  # one step alone, lowered (the CPU's estimate reads its costs)


def _loop(step, m: Models, make, steps: int, estimate: bool | None = None) -> _Loop:
    """estimate (default: on the CPU): the step lowered alone for _roofline, not the loop for timing. A timed loop's
    carry comes back in the shardings it went in with (out_shardings), as _time feeds it back: left to GSPMD, a
    zero-size array (a BF16 cache's INT2 codes and scales, [B, H, 2, 0, D/4]) came back replicated and the next
    call refused it (on a mesh, those were to be split over "dp")."""
    carry = make()
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), carry)
    if jax.default_backend() == "cpu" if estimate is None else estimate:
        return _Loop(None, m, make, steps, one_step=jax.jit(step).lower(m, shapes))
    run = jax.jit(lambda m, c: jax.lax.fori_loop(0, steps, lambda i, c: step(m, c), c), donate_argnums=1,
                  out_shardings=jax.tree.map(lambda x: x.sharding, carry))
    return _Loop(run.lower(m, shapes), m, make, steps, compile_options(m.target, m.draft))


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


def _per_step(step, m: Models, carry, steps: int) -> float:
    """Median seconds of one step(m, carry) -> carry, timed as jitted loops of `steps` steps (one loop alone)."""
    loop = _loop(step, m, lambda: carry, steps, estimate=False)
    return _time(loop.lowered.compile(compiler_options=loop.options), loop)


def _at(cache, context: int, tok, mesh, heads: bool = True):
    cache = cache.replace(length=jnp.full(cache.length.shape, context, jnp.int32))
    if mesh is not None:
        cache, tok = sharding.shard_cache(cache, mesh, heads), sharding.shard_batch(tok, mesh)
    return tok, cache


def _target_loop(m: Models, kv: KVConfig, B, capacity, context, n: int, dtype, mesh, steps) -> _Loop:
    """The verify forward over n tokens per row, as a round runs it (Models.target_forward), and the commit of
    nothing (the length, so the cost, stays); the argmax of every position fed back as the next tokens."""
    def step(m, carry):
        tok, cache = carry
        logits, (k, v) = m.target_forward(tok, cache)
        cache = kvcache.commit(cache, k, v, jnp.zeros_like(cache.length), m.options)
        return jnp.argmax(logits, -1).astype(jnp.int32), cache

    cache = lambda: kvcache.init_cache(m.target_cfg, kv, B, capacity, dtype, n - 1, is_stacked(m.target))
    make = lambda: _at(cache(), context, jnp.zeros((B, n), jnp.int32), mesh)
    return _loop(step, m.without_draft_model(), make, steps)


def _draft_loop(m: Models, B, capacity, context, dtype, mesh, steps) -> _Loop:
    """One draft-model token: the drafter's own step (drafters.model_token: a forward of two rows, as a round's
    first step, which also resyncs), its length put back (the cost stays)."""
    greedy = Sampler.make(B)

    def step(m, carry):
        tok, cache = carry
        dc, d, _ = drafters.model_token(m, cache, tok, jnp.full((B,), 2, jnp.int32), None, greedy)
        return jnp.stack([d, d], 1), dc.replace(length=cache.length)

    cache = lambda: m.drafter.init_cache(B, capacity, dtype, m.lookahead, is_stacked(m.draft))  # as the engine's
    make = lambda: _at(cache(), context, jnp.zeros((B, 2), jnp.int32), mesh, heads=False)
    return _loop(step, m.replace(target=None), make, steps)


def _head_loop(m: Models, B, capacity, context, dtype, mesh, steps) -> _Loop:
    """One head token: the drafter's own step (drafters.head_token), its length put back."""
    greedy = Sampler.make(B)

    def step(m, carry):
        tok, h, cache = carry
        hc, d, _, h = drafters.head_token(m, cache, tok, h, None, greedy)
        return d, h, hc.replace(length=cache.length)

    def make():
        cache = m.drafter.init_cache(B, capacity, dtype, m.lookahead)  # as the engine's
        tok, cache = _at(cache, context, jnp.zeros((B,), jnp.int32), mesh, heads=False)
        h = jnp.zeros((B, m.target_cfg.hidden_size), dtype)
        return tok, h if mesh is None else sharding.shard_batch(h, mesh), cache

    return _loop(step, m.without_draft_model(), make, steps)


def _self_loop(m: Models, kv: KVConfig, B, capacity, context, dtype, mesh, steps) -> _Loop:
    """One self-draft token: the drafter's own step (drafters.self_token) over a target cache of this capacity
    (read through its window: the cost stays flat with the context) and a round's scratch, its row put back."""
    greedy = Sampler.make(B)

    def step(m, carry):
        tok, sc, cache = carry
        sc, d, _ = drafters.self_token(m, cache, sc, tok, None, greedy)
        return d, sc.replace(at=jnp.minimum(sc.at, m.lookahead - 1)), cache

    def make():
        cache = kvcache.init_cache(m.target_cfg, kv, B, capacity, dtype, m.lookahead, is_stacked(m.target))
        tok, cache = _at(cache, context, jnp.zeros((B,), jnp.int32), mesh)
        return tok, drafters.new_scratch(m, cache), cache

    return _loop(step, m, make, steps)


def _ngram_loop(m: Models, B, capacity, context, K: int, mesh, steps) -> _Loop:
    """One lookup of K drafts over a [B, capacity] history and their write into it."""
    def step(m, history):
        end = jnp.full((B,), context, jnp.int32)
        drafts, _ = ngram.propose(history, end, K, 1, m.drafter.ngram_max)
        return loop.write_tokens(history, end - K, drafts, jnp.full((B,), K))  # the next lookup reads them

    def make():
        history = jax.random.randint(jax.random.key(0), (B, capacity), 0, 64, jnp.int32)
        return history if mesh is None else sharding.shard_batch(history, mesh)

    return _loop(step, m.replace(target=None).without_draft_model(), make, steps)


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
    """Times what a round of m.draft_mode costs at these shapes (see the module docstring). Each part is
    kept in memo and on disk by what it depends on: the verify times serve every draft mode. The parts not
    kept are compiled side by side, then timed one at a time (on the CPU estimated: _roofline). say: told when
    costs are measured (not when read back)."""
    memo = {} if memo is None else memo
    shapes = dict(B=B, capacity=capacity, context=context, dtype=str(dtype),
                  mesh=None if mesh is None else dict(mesh.shape))
    points = sorted({n for n in VERIFY_POINTS if n <= k_max + 1} | {k_max + 1})
    stacked = lambda p: {"stacked": True} if is_stacked(p) else {}  # (no new key for the default: shipped files)
    parts = {"verify": (dict(model=m.target_cfg, kv=kv, attn=m.attn_impl, n=points, **stacked(m.target)), len(points),
                        lambda: [_target_loop(m, kv, B, capacity, context, n, dtype, mesh, steps) for n in points])}
    # a windowed drafter cache (Drafter.cache_kv) is part of the key (none for a full one: the shipped files' keys)
    drafter_kv = m.drafter.cache_kv(capacity)
    window = dict(window=drafter_kv) if drafter_kv.windowed else {}
    if m.draft is not None:
        parts["draft"] = (dict(model=m.draft_cfg, **window, **stacked(m.draft)), 1,
                          lambda: [_draft_loop(m, B, capacity, context, dtype, mesh, steps)])
    if m.head is not None:
        parts["head"] = (dict(draw="draft vocabulary", model=m.head_cfg, **window), 1,
                         lambda: [_head_loop(m, B, capacity, context, dtype, mesh, steps)])
    if m.drafter.mode.drafts_itself:
        parts["self"] = (dict(model=m.target_cfg, kv=kv, K=k_max, **stacked(m.target)), 1,
                         lambda: [_self_loop(m, kv, B, capacity, context, dtype, mesh, steps)])
    if m.ngram:
        parts["ngram"] = dict(K=k_max), 1, lambda: [_ngram_loop(m, B, capacity, context, k_max, mesh, steps)]
    with sharding.context(mesh):
        seconds = _cached(memo, {name: (dict(part=name, **what, **shapes), count, loops)
                                 for name, (what, count, loops) in parts.items()},
                          say and (lambda: say(f"measuring lookahead costs at batch {B}, capacity {capacity} (once "
                                               f"per shape: kept in {cache_root() / 'lookahead'})")))
    one = lambda name: seconds[name][0] if name in seconds else 0.0
    return Costs(tuple(zip(points, seconds["verify"])), one("draft"), one("ngram"), one("head"), one("self"))


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
