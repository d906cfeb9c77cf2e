"""The self-draft: the target itself over the BF16 sink + recent window of its own cache and the round's
provisional rows, read through a cache.scratch view (the INT2 history is never read). The scratch lives for the
round only: nothing it drafts reaches the cache, the ring's accounting or the history. No weights of its own."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jspec.cache import kvcache, scratch
from jspec.cache.scratch import Scratch
from jspec.decode.drafters.base import Probe, Proposer, at_context, draw, key_at, layer_key, rollout
from jspec.decode.state import DecodeState, Models
from jspec.model.decoder import forward
from jspec.model.sampling import Sampler


def new_scratch(m: Models, cache) -> Scratch:
    """An empty scratch for a self-draft round over the target's cache: K rows per layer, in the cache's dtype."""
    return scratch.new_scratch(cache, m.target_cfg.num_layers, m.lookahead)


def self_token(m: Models, cache, sc: Scratch, d, key, sampler: Sampler):
    """One self-draft step: d [B] fed at position cache.length + sc.at over the cache's window and the scratch,
    its rows written into the scratch -> (the scratch advanced by one row, the next draft [B], its q [B, V] or
    None). The cache is only read."""
    logits, (k, v) = forward(m.target, m.target_cfg, d[:, None], scratch.view(cache, sc), options=m.options)
    d, q = draw(key, logits[:, -1], sampler)
    return scratch.write(sc, k, v), d, q


@dataclasses.dataclass(frozen=True)
class SelfDraft(Proposer):
    # the shipped target over its own window (sink 64 + recent 256), greedy, K = 4, held-out code at 2K-4K
    # contexts: 3.3-4.0 tokens per round, alpha 0.79-0.89 (3 prompts of 32 tokens each,
    # benchmarks/results/long_context_acceptance.json), taken well under for so few tokens
    prior_alpha: float = 0.7

    def propose(self, m: Models, s: DecodeState, sampler: Sampler, keys):
        """`next` fed at position length (row 0 of a fresh scratch), then each draft at the next row, one traced
        step in a fori_loop. The scratch is dropped with the round."""
        step = lambda sc, d, aux, k: (*self_token(m, s.cache, sc, d, k, sampler), None)
        sc, d, q, _ = step(new_scratch(m, s.cache), s.next, None, key_at(keys, 0))
        drafts, qs, _ = rollout(m, sc, d, q, step, None, keys)
        return drafts, qs, s.draft

    def probes(self, m, kv, batch, capacity, context, k_max, dtype):
        """One self-draft token: its own step (self_token) over a target cache of this capacity (read through its
        window: the cost stays flat with the context) and a round's scratch, its row put back."""
        greedy = Sampler.make(batch)

        def step(m, carry):
            tok, sc, cache = carry
            sc, t, _ = self_token(m, cache, sc, tok, None, greedy)
            return t, sc.replace(at=jnp.minimum(sc.at, m.lookahead - 1)), cache

        def make(place):
            cache = kvcache.init_cache(m.target_cfg, kv, batch, capacity, dtype, m.lookahead)
            cache = place.cache(at_context(cache, context), True)
            return place.batch(jnp.zeros((batch,), jnp.int32)), new_scratch(m, cache), cache

        what = dict(model=m.target_cfg, kv=kv, K=k_max, **layer_key(m.options))
        return {"self": Probe(what, m, step, make)}

    def round_cost(self, costs, K):
        return K * costs.step("self")
