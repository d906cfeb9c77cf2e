"""An EAGLE-3 head (model.head) on the target's own hidden states: the verify forward also returns the fused
features of its K+1 positions, and the next round's drafting starts by feeding the a+1 accepted (feature,
following token) pairs to the head (its own cache, BF16 or its window, masked commit)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec import struct
from jspec.cache import kvcache
from jspec.cache.kvcache import KVCache
from jspec.decode.drafters.base import Probe, Proposer, at_context, draw, key_at, pick, rollout
from jspec.decode.state import DecodeState, Drafter, Models
from jspec.model import head
from jspec.model.decoder import forward_taps
from jspec.model.sampling import Sampler


@struct.dataclass
class HeadFeed:
    """What the head reads first in the next round: the pairs (target feature at a position, the token that
    follows it) of the positions the last round committed, ending at `next`."""

    feats: jax.Array  # [B, K+1, E] fused features at positions cache.length - n ..
    tokens: jax.Array  # [B, K+1] the token after each of those positions (the last real one is `next`)
    n: jax.Array  # [B] int32 how many pairs are real (a + 1; 1 after the prefill)


@struct.dataclass
class HeadState:
    cache: KVCache  # the head's own
    feed: HeadFeed


def target_features(m: Models, tokens, cache):
    """The target forward, and the head's fused features [B, n, E] at the same positions."""
    d = m.drafter
    logits, kv, tapped = forward_taps(m.target, m.target_cfg, tokens, cache, d.head_cfg.taps,
                                      attn_impl=m.attn_impl, options=m.options)
    return logits, kv, head.fuse(d.head, tapped)


def head_hidden(m: Models, tokens, feats, cache):
    """The head's pre-norm outputs [B, n, E] (its LM head is left to draw_head) and new rows."""
    return head.hidden(m.drafter.head, m.drafter.head_cfg, m.target.embed, tokens, feats, cache)


def draw_head(m: Models, keys, h, sampler: Sampler):
    """The head's token from its pre-norm output h [B, E] -> (target token [B], q [B, V] or None if greedy).

    Greedy: an argmax over the draft vocabulary and a lookup of its map, no V-wide work. Sampled: the logits
    are spread over the target's vocabulary first (a scatter), since acceptance reads q at target ids.
    """
    hp = m.drafter.head
    logits = head.draft_logits(hp, m.drafter.head_cfg, h)  # [B, Vd]
    if sampler.greedy:
        return head.target_ids(hp, jnp.argmax(logits, -1).astype(jnp.int32)), None
    return draw(keys, head.to_target_vocab(logits, hp.d2t, m.target_cfg.vocab_size), sampler)


def head_token(m: Models, hc: KVCache, d, h, key, sampler: Sampler):
    """One head step: draft d [B] and the head's own last output h [B, E] fed, the row committed -> (cache, the
    next draft [B], its q [B, V] or None, the head's new output [B, E]: the next step's feature)."""
    h, (k, v) = head_hidden(m, d[:, None], h[:, None], hc)
    hc = kvcache.commit(hc, k, v, jnp.ones_like(d), m.options)
    d, q = draw_head(m, key, h[:, -1], sampler)
    return hc, d, q, h[:, -1]


def absorb(m: Models, s: DecodeState):
    """The last round's committed pairs (the feed, at positions cache.length - n .. cache.length - 1) through the
    head, committed to its cache -> (the head's outputs [B, K+1, E], its cache)."""
    f = s.draft.feed
    hc = s.draft.cache.replace(length=s.cache.length - f.n)
    h, (k, v) = head_hidden(m, f.tokens, f.feats, hc)
    return h, kvcache.commit(hc, k, v, f.n, m.options)


@dataclasses.dataclass(frozen=True)
class Head(Proposer):
    # EAGLE-3's published chain acceptance (tau 2.8-3.5 at K = 7 on Llama-3.1-8B: alpha about 0.65-0.75), taken
    # lower for the short training runs a head gets here; the online estimate corrects it after one call
    prior_alpha: float = 0.6

    def init_cache(self, d: Drafter, batch, capacity, dtype, K):
        return kvcache.init_cache(d.head_cfg.layer, d.cache_kv(capacity), batch, capacity, dtype, K)

    def forward(self, m, tokens, cache):
        return target_features(m, tokens, cache)

    def prefill_carry(self, m, batch):
        """The feature at each row's last prompt position."""
        return jnp.zeros((batch, m.target_cfg.hidden_size), m.target.embed.dtype)

    def prefill_chunk(self, m, cache, chunk, features, feat):
        """The head's pairs (feature at t, token t + 1) whose token is in the prompt: all but the last."""
        c = chunk.tokens.shape[1]
        _, (hk, hv) = head_hidden(m, chunk.following, features, cache)
        cache = kvcache.commit(cache, hk, hv, jnp.clip(chunk.last, 0, c), m.options)
        return cache, jnp.where(chunk.here[:, None], pick(features, jnp.clip(chunk.last, 0, c - 1)), feat)

    def start(self, m, cache, prompts, prompt_lens, first, feat, capacity):
        """One real pair: the last prompt position's feature, `next`."""
        B, K1 = first.shape[0], m.lookahead + 1
        feed = HeadFeed(jnp.zeros((B, K1, feat.shape[-1]), feat.dtype).at[:, 0].set(feat),
                        jnp.zeros((B, K1), jnp.int32).at[:, 0].set(first), jnp.ones((B,), jnp.int32))
        return HeadState(cache, feed)

    def cache_of(self, state):
        return state.cache

    def propose(self, m: Models, s: DecodeState, sampler: Sampler, keys):
        """The last round's committed pairs first (the feed, at positions cache.length - n .. cache.length - 1;
        the slots past them may hold the head's rejected steps), then K - 1 steps on its own features."""
        f = s.draft.feed
        h, hc = absorb(m, s)
        # the LM head runs on the pair ending at `next` only (n = 0: a finished row, nothing to draft)
        h = pick(h, jnp.maximum(f.n - 1, 0))
        d, q = draw_head(m, key_at(keys, 0), h, sampler)
        step = lambda hc, d, h, key: head_token(m, hc, d, h, key, sampler)
        drafts, q, hc = rollout(m, hc, d, q, step, h, keys, unroll=True)
        return drafts, q, s.draft.replace(cache=hc)

    def update(self, m, s, state, seq, n_commit, feats):
        """The next pairs: the feature at length + j with the token after it, seq[:, j] (d_{j+1}, or the target's
        token at j = a)."""
        return state.replace(feed=HeadFeed(feats, seq, n_commit))

    def idle(self, m, s, state, seq, n_commit, feats):
        """The feed committed (as propose's first step), and the plain round's pair as the next feed."""
        _, hc = absorb(m, s)
        pad = jnp.pad(feats, ((0, 0), (0, seq.shape[1] - feats.shape[1]), (0, 0)))
        return HeadState(hc, HeadFeed(pad, seq, n_commit))

    def probes(self, m, kv, batch, capacity, context, k_max, dtype):
        """One head token: its own step (head_token), its length put back."""
        greedy, d = Sampler.make(batch), m.drafter

        def step(m, carry):
            tok, h, cache = carry
            hc, t, _, h = head_token(m, cache, tok, h, None, greedy)
            return t, h, hc.replace(length=cache.length)

        def make(place):
            cache = at_context(self.init_cache(d, batch, capacity, dtype, m.lookahead), context)
            h = jnp.zeros((batch, m.target_cfg.hidden_size), dtype)
            return place.batch(jnp.zeros((batch,), jnp.int32)), place.batch(h), place.cache(cache, False)

        drafter_kv = d.cache_kv(capacity)
        what = dict(draw="draft vocabulary", model=d.head_cfg,
                    **(dict(window=drafter_kv) if drafter_kv.windowed else {}))
        return {"head": Probe(what, m, step, make)}

    def round_cost(self, costs, K):
        """Its resync forward (K + 1 pairs, costed as one step: both read the same weights) and K - 1 steps; its
        features come with the verify forward (one fc matmul, not timed: the verify is timed without it)."""
        return K * costs.step("head")
