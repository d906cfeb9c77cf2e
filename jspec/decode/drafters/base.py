"""The drafter protocol: what a round, the prefill, the scheduler and the lookahead choice ask of whatever
proposes the drafts, as the methods of one frozen value (Proposer). A drafter keeps one opaque state between
rounds (DecodeState.draft: a cache, a token history, a feed, or None); nothing outside this package looks
inside it. A Proposer's defaults are plain decoding's: no drafts, no state, nothing to prefill or price.

The draw helpers every drafter shares live here too: a draft token from logits, the row of a per-row index.
"""

from __future__ import annotations

import dataclasses
import typing

import jax
import jax.numpy as jnp

from jspec.model import sampling
from jspec.model.sampling import Sampler

if typing.TYPE_CHECKING:
    from jspec.cache.kvcache import KVCache
    from jspec.config import KVConfig
    from jspec.decode.state import DecodeState, Drafter, Models


class Chunk(typing.NamedTuple):
    """One chunk of the prompts as the prefill feeds it to the target (decode.loop.prefill)."""

    tokens: jax.Array  # [B, c] at positions start..
    following: jax.Array  # [B, c] the token after each (prompt padding past a row's end)
    n: jax.Array  # [B] how many of the chunk's tokens are the row's prompt (committed)
    last: jax.Array  # [B] index of the row's last prompt token in the chunk (valid where `here`)
    here: jax.Array  # [B] bool: the row's last prompt token is in this chunk


class Place(typing.NamedTuple):
    """How a cost probe's carry is placed on the device (the mesh, or as it is): runtime.lookahead's."""

    cache: typing.Callable  # (KVCache, heads: bool) -> KVCache
    batch: typing.Callable  # an array [B, ...] -> the array placed by row


@dataclasses.dataclass(frozen=True)
class Probe:
    """One timed part of a round for the lookahead choice: step(m, carry) -> carry as the round runs it, from
    make(place) (a carry of the call's shapes, its context already in), keyed on disk by `what` (with the shapes
    and the device). runtime.lookahead compiles it as a loop of steps and times one step."""

    what: dict  # what its cost depends on besides the shapes
    models: typing.Any  # the Models the step runs with (weights it does not need left out)
    step: typing.Callable
    make: typing.Callable


def layer_key(options) -> dict:
    """What a Probe's `what` says of the layer loop (config.Options.unroll): nothing at full unroll, the GPU's
    default, so that costs measured for it keep their keys; else the unroll."""
    return {} if options.unroll is True else {"layer_unroll": options.unroll}


@dataclasses.dataclass(frozen=True)
class Proposer:
    """How one kind of drafter drafts. Every method gets the program's Models (m.drafter: the weights and
    settings, m.lookahead: K); `state` is the drafter's own between rounds (DecodeState.draft)."""

    prior_alpha: float = 0.5  # per-draft acceptance before a call measured one (runtime.lookahead.prior)

    def init_cache(self, d: Drafter, batch: int, capacity: int, dtype, K: int) -> KVCache | None:
        """The empty cache the engine allocates for it (donated to the program: ProgramArgs.draft_cache)."""
        return None

    def forward(self, m: Models, tokens, cache):
        """The target forward of the prefill and the verify -> (logits, (k, v), what update needs of it)."""
        logits, kv = m.target_forward(tokens, cache)
        return logits, kv, None

    def prefill_carry(self, m: Models, batch: int):
        """What the prefill keeps for it across chunks (start reads it)."""
        return None

    def prefill_chunk(self, m: Models, cache, chunk: Chunk, features, carry):
        """Its share of one prefill chunk -> (its cache, carry); features: forward's third output."""
        return cache, carry

    def split_prefill(self, m: Models) -> bool:
        """Whether its prefill runs as a program of its own (runtime.parts), before the target's."""
        return False

    def prefill_alone(self, m: Models, prompts, prompt_lens, cache):
        """Its prefill as a part of its own (split_prefill): its cache with the prompts in."""
        return cache

    def without_prefill(self, m: Models) -> Models:
        """m for the target's prefill when its own runs apart (split_prefill)."""
        return m

    def start(self, m: Models, cache, prompts, prompt_lens, first, carry, capacity: int):
        """Its state after the prefill (first [B]: the first token emitted, `next`; capacity: the target
        cache's)."""
        return cache

    def cache_of(self, state) -> KVCache | None:
        """The cache inside its state (the one init_cache made), or None."""
        return None

    def propose(self, m: Models, s: DecodeState, sampler: Sampler, keys):
        """The round's drafts [B, K] (K = m.lookahead), their q [B, K, V] (None when greedy) and its state.
        keys [K, B] (None when greedy)."""
        return jnp.zeros((s.next.shape[0], m.lookahead), jnp.int32), None, s.draft

    def resynced(self, m: Models, s: DecodeState, state, history, sampler: Sampler, keys):
        """For the n-gram combinator (combined.py): (its state after the work every round must do, a thunk
        of the rest of propose -> (drafts, q, state)), skipped where every row has a copy. history [B, T]."""
        return state, lambda: self.propose(m, s.replace(draft=state), sampler, keys)

    def update(self, m: Models, s: DecodeState, state, seq, n_commit, features):
        """Its state after the verify: seq [B, K+1] the round's tokens (d_1..d_a, then the target's), of which
        the first n_commit [B] were committed at positions s.cache.length + 1..; features: forward's."""
        return state

    def idle(self, m: Models, s: DecodeState, state, seq, n_commit, features):
        """Its state after a plain round of a speculative call (decode.fallback: no row drafted), kept so that its
        next propose drafts as if every round had run: seq [B, K+1] the target's token then padding, n_commit [B]
        (0 or 1) committed; features: forward's over `next` alone. By default what update makes of it."""
        return self.update(m, s, state, seq, n_commit, features)

    def probes(self, m: Models, kv: KVConfig, batch: int, capacity: int, context: int, k_max: int,
               dtype) -> dict[str, Probe]:
        """Its timed parts by name (runtime.lookahead.measure), at the call's batch and a cache of this
        capacity filled to `context`."""
        return {}

    def round_cost(self, costs, K: int) -> float:
        """Seconds of one round's drafting with K drafts, from the measured steps (costs.step(name))."""
        return 0.0


def draw(keys, logits, sampler: Sampler):
    """One token per row from logits [B, V] -> (token [B], its distribution [B, V] or None if greedy).

    Greedy skips the warp and the categorical draw: an argmax is all it takes, and for small models
    the per-step overhead of a V-wide random draw is a visible part of a draft step.
    """
    if sampler.greedy:
        return jnp.argmax(logits, -1).astype(jnp.int32), None
    probs = sampling.warp(logits, sampler)
    return sampling.sample(keys, probs), probs


def pick(x, idx):
    """x [B, n, ...], idx [B] -> [B, ...]: row idx[b] of each x[b]."""
    return jnp.take_along_axis(x, idx.reshape(-1, *(1,) * (x.ndim - 1)), axis=1)[:, 0]


def point_mass(drafts, vocab: int, sampler: Sampler):
    """q [B, K, V] of a copied (not sampled) draft: all mass on it. None when greedy (not needed)."""
    return None if sampler.greedy else jax.nn.one_hot(drafts, vocab, dtype=jnp.float32)


def key_at(keys, i):
    """Draft i's keys [B] of keys [K, B], or None when greedy."""
    return None if keys is None else keys[i]


def rollout(m: Models, dc, d, q, step, aux, keys, unroll=False):
    """K draft tokens [B, K] and q [B, K, V] (None when greedy) from the first draft d [B] (q: its distribution),
    then K - 1 steps of step(dc, d, aux, key) -> (dc, the next draft, its q, aux) in a fori_loop. aux is what a
    step passes to the next besides the token: nothing for a draft model, the head's output feature. keys [K, B],
    or None when greedy. unroll: the steps unrolled, for a one-layer head (no loop inside the round's loop); a
    draft model keeps one traced step whatever K, which keeps an 8B program's compile time down (unrolling the
    shipped draft's steps measured no gain at batch 1)."""
    drafts = jnp.zeros((d.shape[0], m.lookahead), jnp.int32).at[:, 0].set(d)
    qs = None if q is None else jnp.zeros((*drafts.shape, q.shape[-1]), q.dtype).at[:, 0].set(q)

    def body(i, carry):  # feeds d_i (at index i - 1), draws d_{i+1} (at index i)
        dc, d, aux, drafts, qs = carry
        dc, d, q, aux = step(dc, d, aux, key_at(keys, i))
        return dc, d, aux, drafts.at[:, i].set(d), None if qs is None else qs.at[:, i].set(q)

    dc, _, _, drafts, qs = jax.lax.fori_loop(1, m.lookahead, body, (dc, d, aux, drafts, qs), unroll=unroll)
    return drafts, qs, dc


def at_context(cache, context: int):
    """cache with every row's length at `context` (a cost probe's cache: full up to there)."""
    return cache.replace(length=jnp.full(cache.length.shape, context, jnp.int32))
