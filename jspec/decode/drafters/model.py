"""The draft model: a small model of the target's vocabulary, K steps over its own cache (BF16, or its window:
Drafter.cache_kv), one forward of two rows each: the first resyncs the cache, the others feed one draft token.
Its prefill runs as a part of its own (runtime.parts), so that the two prefills compile side by side."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec.cache import kvcache
from jspec.cache.kvcache import KVCache
from jspec.decode import chunks
from jspec.decode.drafters.base import Probe, Proposer, at_context, draw, key_at, layer_key, pick, rollout
from jspec.decode.state import DecodeState, Drafter, Models
from jspec.model.decoder import forward
from jspec.model.sampling import Sampler


def draft_forward(m: Models, tokens, cache):
    return forward(m.drafter.model, m.drafter.model_cfg, tokens, cache, options=m.options)


def model_token(m: Models, dc: KVCache, tokens, n_commit, key, sampler: Sampler):
    """One draft-model step: tokens [B, w] fed at positions dc.length.., the first n_commit [B] of them committed,
    the next draft drawn from the logits at index n_commit - 1 -> (cache, draft [B], q [B, V] or None)."""
    logits, (k, v) = draft_forward(m, tokens, dc)
    dc = kvcache.commit(dc, k, v, n_commit, m.options)
    d, q = draw(key, pick(logits, n_commit - 1), sampler)
    return dc, d, q


def _chunk(m: Models, tokens, n, dc):
    """A chunk of the prompts (tokens [B, c]) through the draft model, the first n [B] of each row committed."""
    _, (k, v) = draft_forward(m, tokens, dc)
    return kvcache.commit(dc, k, v, n, m.options)


def _resync(m: Models, dc: KVCache, tokens, at):
    """Feeds tokens [B, W] to the draft model at positions dc.length.., commits the first at + 1 of them
    and returns (cache, logits [B, V] at index at [B]): the position of `next`, where drafting starts.

    Positions fed again hold the same tokens as before (idempotent), and rows past `at` are never
    committed: they may be rejected candidates or not yet known.
    """
    logits, (k, v) = draft_forward(m, tokens, dc)
    return kvcache.commit(dc, k, v, at + 1, m.options), pick(logits, at)


@dataclasses.dataclass(frozen=True)
class DraftModel(Proposer):
    # a little under the shipped pair's acceptance on held-out code (greedy, K = 4: 0.39 at batch 1)
    prior_alpha: float = 0.4

    def init_cache(self, d: Drafter, batch, capacity, dtype, K):
        return kvcache.init_cache(d.model_cfg, d.cache_kv(capacity), batch, capacity, dtype, K)

    def prefill_chunk(self, m, cache, chunk, features, carry):
        if m.drafter.model is None:  # its prefill ran apart (split_prefill)
            return cache, carry
        return _chunk(m, chunk.tokens, chunk.n, cache), carry

    def split_prefill(self, m):
        return m.drafter.model is not None

    def prefill_alone(self, m, prompts, prompt_lens, cache):
        chunk = lambda i, tokens, dc: _chunk(m, tokens, chunks.rows(prompt_lens, i, tokens.shape[1]), dc)
        with jax.named_scope("prefill"):
            return chunks.over_chunks(m, prompts, prompt_lens, chunk, cache)

    def without_prefill(self, m):
        return m.replace(drafter=m.drafter.replace(model=None))

    def cache_of(self, state):
        return state

    def propose(self, m: Models, s: DecodeState, sampler: Sampler, keys):
        """K forwards of two rows each, one traced forward in a fori_loop. The first resyncs its cache: positions
        past the target's length - 1 may hold rejected tokens, so it feeds [last, next] again at positions
        length - 1 and length, commits both and draws d_1 after `next`. Step i feeds d_i in the first row (the
        second, a copy, is never committed) and draws d_{i+1}. A two-row step measured 0.82-1.09x a one-row
        step's time, where a separate one-row forward would add the draft's layers to the program once more."""
        B, K = s.next.shape[0], m.lookahead
        resync = jnp.stack([s.last, s.next], 1)

        def step(i, carry):
            dc, drafts, qs = carry
            d = jax.lax.dynamic_index_in_dim(drafts, jnp.maximum(i - 1, 0), 1, keepdims=False)
            first = jnp.full((B,), i == 0)
            dc, d, q = model_token(m, dc, jnp.where(first[:, None], resync, d[:, None]), jnp.where(first, 2, 1),
                                   key_at(keys, i), sampler)
            return dc, drafts.at[:, i].set(d), None if qs is None else qs.at[:, i].set(q)

        qs = None if sampler.greedy else jnp.zeros((B, K, m.drafter.model_cfg.vocab_size), jnp.float32)
        dc, drafts, qs = jax.lax.fori_loop(0, K, step, (s.draft.replace(length=s.cache.length - 1),
                                                        jnp.zeros((B, K), jnp.int32), qs))
        return drafts, qs, dc

    def idle(self, m, s, state, seq, n_commit, features):
        """propose's resync alone: [last, next] at positions length - 1 and length, both committed (what the next
        round's resync feeds again starts there)."""
        dc, _ = _resync(m, state.replace(length=s.cache.length - 1), jnp.stack([s.last, s.next], 1),
                        jnp.ones_like(s.next))
        return dc

    def resynced(self, m, s, state, history, sampler, keys):
        """Beside the n-gram copy the draft model may have skipped earlier rounds, so its cache is resynced from
        the history every round: the K + 2 positions up to `next` (everything since the last resync); its K - 1
        steps are what is skipped."""
        K, length = m.lookahead, s.cache.length
        start = jnp.maximum(length - K - 1, 0)
        window = jnp.take_along_axis(history, start[:, None] + jnp.arange(K + 2), axis=1, mode="clip")
        dc, logits = _resync(m, state.replace(length=start), window, length - start)

        def rest():
            d, q = draw(key_at(keys, 0), logits, sampler)
            step = lambda dc, d, aux, key: (*model_token(m, dc, d[:, None], jnp.ones_like(d), key, sampler), None)
            return rollout(m, dc, d, q, step, None, keys)

        return dc, rest

    def probes(self, m, kv, batch, capacity, context, k_max, dtype):
        """One draft-model token: its own step (model_token: a forward of two rows, as a round's first step, which
        also resyncs), its length put back (the cost stays), over the cache the engine builds."""
        greedy, d = Sampler.make(batch), m.drafter

        def step(m, carry):
            tok, cache = carry
            dc, t, _ = model_token(m, cache, tok, jnp.full((batch,), 2, jnp.int32), None, greedy)
            return jnp.stack([t, t], 1), dc.replace(length=cache.length)

        def make(place):
            cache = at_context(self.init_cache(d, batch, capacity, dtype, m.lookahead), context)
            return place.batch(jnp.zeros((batch, 2), jnp.int32)), place.cache(cache, False)

        drafter_kv = d.cache_kv(capacity)
        what = dict(model=d.model_cfg, **(dict(window=drafter_kv) if drafter_kv.windowed else {}),
                    **layer_key(m.options))
        return {"draft": Probe(what, m.replace(target=None), step, make)}

    def round_cost(self, costs, K):
        """K draft-model tokens (K forwards, the first also resyncs)."""
        return K * costs.step("draft")
