"""The drafters: each proposes a round's K tokens with the signature (m, s, sampler, keys) -> (drafts [B, K],
q [B, K, V] or None when greedy, draft cache); a copied draft's q is a point mass, so sampling stays lossless.

- MODEL: a small draft model, K steps over its own BF16 cache (one forward of two rows each: the first
  resyncs the cache, the others feed one draft token);
- NGRAM: prompt lookup (decode.ngram) over the prompt and the tokens emitted so far: no model;
- NGRAM_MODEL: the n-gram copy where the row has a match, the draft model's tokens otherwise;
- HEAD: an EAGLE-3 head (model.head) on the target's own hidden states: the verify forward also returns the
  fused features of its K+1 positions, and the next round's drafting starts by feeding the a+1 accepted
  (feature, following token) pairs to the head (its own BF16 cache, masked commit);
- SELF: the target itself over the BF16 sink + recent window of its own cache (kvcache.window_view: the INT2
  history is never read) and the round's provisional rows, kept in a scratch (model.decoder.Scratch) that lives
  for the round only: nothing it drafts reaches the cache, the ring's accounting or the history;
- NGRAM_SELF: the n-gram copy where the row has a match, the self-draft's tokens otherwise.
The draft model's and the head's caches may be windowed (Drafter.cache_kv): the same drafters, whose forwards
then attend the window alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jspec.cache import kvcache
from jspec.cache.kvcache import KVCache
from jspec.decode import ngram
from jspec.decode.state import DecodeState, DraftMode, Models
from jspec.model import head, sampling
from jspec.model.decoder import Scratch
from jspec.model.sampling import Sampler


def draw(keys, logits, sampler: Sampler):
    """One token per row from logits [B, V] -> (token [B], its distribution [B, V] or None if greedy).

    Greedy skips the warp and the categorical draw: an argmax is all it takes, and for small models
    the per-step overhead of a V-wide random draw is a visible part of a draft step.
    """
    if sampler.greedy:
        return jnp.argmax(logits, -1).astype(jnp.int32), None
    probs = sampling.warp(logits, sampler)
    return sampling.sample(keys, probs), probs


def draw_head(m: Models, keys, h, sampler: Sampler):
    """The head's token from its pre-norm output h [B, E] -> (target token [B], q [B, V] or None if greedy).

    Greedy: an argmax over the draft vocabulary and a lookup of its map, no V-wide work. Sampled: the logits
    are spread over the target's vocabulary first (a scatter), since acceptance reads q at target ids.
    """
    logits = head.draft_logits(m.head, m.head_cfg, h)  # [B, Vd]
    if sampler.greedy:
        return head.target_ids(m.head, jnp.argmax(logits, -1).astype(jnp.int32)), None
    return draw(keys, head.to_target_vocab(logits, m.head.d2t, m.target_cfg.vocab_size), sampler)


def pick(x, idx):
    """x [B, n, ...], idx [B] -> [B, ...]: row idx[b] of each x[b]."""
    return jnp.take_along_axis(x, idx.reshape(-1, *(1,) * (x.ndim - 1)), axis=1)[:, 0]


def _resync(m: Models, dc: KVCache, tokens, at):
    """Feeds tokens [B, W] to the draft model at positions dc.length.., commits the first at + 1 of them
    and returns (cache, logits [B, V] at index at [B]): the position of `next`, where drafting starts.

    Positions fed again hold the same tokens as before (idempotent), and rows past `at` are never
    committed: they may be rejected candidates or not yet known.
    """
    logits, (k, v) = m.draft_forward(tokens, dc)
    return kvcache.commit(dc, k, v, at + 1, m.options), pick(logits, at)


def model_token(m: Models, dc: KVCache, tokens, n_commit, key, sampler: Sampler):
    """One draft-model step: tokens [B, w] fed at positions dc.length.., the first n_commit [B] of them committed,
    the next draft drawn from the logits at index n_commit - 1 -> (cache, draft [B], q [B, V] or None)."""
    logits, (k, v) = m.draft_forward(tokens, dc)
    dc = kvcache.commit(dc, k, v, n_commit, m.options)
    d, q = draw(key, pick(logits, n_commit - 1), sampler)
    return dc, d, q


def head_token(m: Models, hc: KVCache, d, h, key, sampler: Sampler):
    """One head step: draft d [B] and the head's own last output h [B, E] fed, the row committed -> (cache, the
    next draft [B], its q [B, V] or None, the head's new output [B, E]: the next step's feature)."""
    h, (k, v) = m.head_hidden(d[:, None], h[:, None], hc)
    hc = kvcache.commit(hc, k, v, jnp.ones_like(d), m.options)
    d, q = draw_head(m, key, h[:, -1], sampler)
    return hc, d, q, h[:, -1]


def _rollout(m: Models, dc: KVCache, d, q, step, aux, keys, unroll=False):
    """K draft tokens [B, K] and q [B, K, V] (None when greedy) from the first draft d [B] (q: its distribution),
    then K - 1 steps of step(dc, d, aux, key) -> (dc, the next draft, its q, aux) in a fori_loop. aux is what a
    step passes to the next besides the token: nothing for a draft model, the head's output feature. keys [K, B],
    or None when greedy. unroll: the steps unrolled, for a one-layer head (no loop inside the round's loop); a
    draft model keeps one traced step whatever K, which keeps an 8B program's compile time down (unrolling the
    shipped draft's steps measured no gain at batch 1)."""
    key = lambda i: None if keys is None else keys[i]
    drafts = jnp.zeros((d.shape[0], m.lookahead), jnp.int32).at[:, 0].set(d)
    qs = None if q is None else jnp.zeros((*drafts.shape, q.shape[-1]), q.dtype).at[:, 0].set(q)

    def body(i, carry):  # feeds d_i (at index i - 1), draws d_{i+1} (at index i)
        dc, d, aux, drafts, qs = carry
        dc, d, q, aux = step(dc, d, aux, key(i))
        return dc, d, aux, drafts.at[:, i].set(d), None if qs is None else qs.at[:, i].set(q)

    dc, _, _, drafts, qs = jax.lax.fori_loop(1, m.lookahead, body, (dc, d, aux, drafts, qs), unroll=unroll)
    return drafts, qs, dc


def point_mass(drafts, vocab: int, sampler: Sampler):
    """q [B, K, V] of a copied (not sampled) draft: all mass on it. None when greedy (not needed)."""
    return None if sampler.greedy else jax.nn.one_hot(drafts, vocab, dtype=jnp.float32)


def draft_model(m: Models, s: DecodeState, sampler: Sampler, keys):
    """The draft model's K tokens from K forwards of two rows each, one traced forward in a fori_loop. The
    first resyncs its cache: positions past the target's length - 1 may hold rejected tokens, so it feeds
    [last, next] again at positions length - 1 and length, commits both and draws d_1 after `next`. Step i
    feeds d_i in the first row (the second, a copy, is never committed) and draws d_{i+1}. A two-row step
    measured 0.82-1.09x a one-row step's time, where a separate one-row forward would add the draft's
    layers to the program once more."""
    key = lambda i: None if keys is None else keys[i]
    B, K = s.next.shape[0], m.lookahead
    resync = jnp.stack([s.last, s.next], 1)

    def step(i, carry):
        dc, drafts, qs = carry
        d = jax.lax.dynamic_index_in_dim(drafts, jnp.maximum(i - 1, 0), 1, keepdims=False)
        first = jnp.full((B,), i == 0)
        dc, d, q = model_token(m, dc, jnp.where(first[:, None], resync, d[:, None]), jnp.where(first, 2, 1), key(i),
                               sampler)
        return dc, drafts.at[:, i].set(d), None if qs is None else qs.at[:, i].set(q)

    qs = None if sampler.greedy else jnp.zeros((B, K, m.draft_cfg.vocab_size), jnp.float32)
    dc, drafts, qs = jax.lax.fori_loop(0, K, step, (s.draft_cache.replace(length=s.cache.length - 1),
                                                    jnp.zeros((B, K), jnp.int32), qs))
    return drafts, qs, dc


def draft_ngram(m: Models, s: DecodeState, sampler: Sampler, keys):
    """Prompt lookup over the history, any n-gram from 1 token up: a wrong copy costs only its slot
    in the verify forward."""
    drafts, _ = ngram.propose(s.history, s.cache.length + 1, m.lookahead, 1, m.drafter.ngram_max)
    return drafts, point_mass(drafts, m.target_cfg.vocab_size, sampler), s.draft_cache


def draft_combined(m: Models, s: DecodeState, sampler: Sampler, keys):
    """The n-gram copy where a row has a match of 2 tokens or more, the draft model's tokens elsewhere.

    The draft model may have skipped earlier rounds, so its cache is resynced from the history: the
    K + 2 positions up to `next` (everything since the last resync). Its K - 1 steps are skipped when
    every row still running has a match.
    """
    K, length = m.lookahead, s.cache.length
    start = jnp.maximum(length - K - 1, 0)
    window = jnp.take_along_axis(s.history, start[:, None] + jnp.arange(K + 2), axis=1, mode="clip")
    dc, logits = _resync(m, s.draft_cache.replace(length=start), window, length - start)

    def rollout():
        d, q = draw(None if keys is None else keys[0], logits, sampler)
        step = lambda dc, d, aux, key: (*model_token(m, dc, d[:, None], jnp.ones_like(d), key, sampler), None)
        return _rollout(m, dc, d, q, step, None, keys)

    return _copy_or(m, s, sampler, rollout, dc)


def _copy_or(m: Models, s: DecodeState, sampler: Sampler, rollout, dc):
    """The n-gram copy where a row has a match of 2 tokens or more, rollout() -> (drafts, q, draft cache) elsewhere;
    rollout is skipped (cond) when every row still running has a match, dc then the draft cache returned."""
    copied, found = ngram.propose(s.history, s.cache.length + 1, m.lookahead, 2, m.drafter.ngram_max)
    V = m.target_cfg.vocab_size
    skip = lambda: (copied, None if sampler.greedy else jnp.zeros((*copied.shape, V), jnp.float32), dc)
    drafted, q, dc = jax.lax.cond((found | s.done).all(), skip, rollout)
    drafts = jnp.where(found[:, None], copied, drafted)
    if q is not None:
        q = jnp.where(found[:, None, None], point_mass(copied, V, sampler), q)
    return drafts, q, dc


def new_scratch(m: Models, cache) -> Scratch:
    """An empty scratch for a self-draft round: K rows per layer, in the cache's dtype."""
    L = m.target_cfg.num_layers
    B, (_, H, _, D) = cache.length.shape[0], cache.layer(0).k.shape
    rows = lambda: jnp.zeros((L, B, m.lookahead, H, D), cache.layer(0).k.dtype)  # two buffers: both may be donated
    return Scratch(rows(), rows(), jnp.int32(0))


def self_token(m: Models, cache, sc: Scratch, d, key, sampler: Sampler):
    """One self-draft step: d [B] fed at position cache.length + sc.at, its rows written into the scratch ->
    (the scratch advanced by one row, the next draft [B], its q [B, V] or None). The cache is only read."""
    logits, (k, v) = m.self_forward(d[:, None], cache, sc)
    stack = lambda x: x if hasattr(x, "ndim") else jnp.stack(x)  # [L, B, K, Hkv, D]
    d, q = draw(key, logits[:, -1], sampler)
    return Scratch(stack(k), stack(v), sc.at + 1), d, q


def draft_self(m: Models, s: DecodeState, sampler: Sampler, keys):
    """The target's K tokens over its own window: `next` fed at position length (row 0 of a fresh scratch), then
    each draft at the next row, one traced step in a fori_loop. The scratch is dropped with the round."""
    key = lambda i: None if keys is None else keys[i]
    step = lambda sc, d, aux, k: (*self_token(m, s.cache, sc, d, k, sampler), None)
    sc, d, q, _ = step(new_scratch(m, s.cache), s.next, None, key(0))
    drafts, qs, _ = _rollout(m, sc, d, q, step, None, keys)
    return drafts, qs, s.draft_cache


def draft_ngram_self(m: Models, s: DecodeState, sampler: Sampler, keys):
    """The n-gram copy where a row has a match of 2 tokens or more, the self-draft elsewhere (skipped when every
    row still running has a match)."""
    return _copy_or(m, s, sampler, lambda: draft_self(m, s, sampler, keys), s.draft_cache)


def draft_head(m: Models, s: DecodeState, sampler: Sampler, keys):
    """The head's K tokens: the last round's committed pairs first (s.head_feed, at positions cache.length - n
    .. cache.length - 1; the slots past them may hold the head's rejected steps), then K - 1 steps on its own
    features."""
    f = s.head_feed
    hc = s.draft_cache.replace(length=s.cache.length - f.n)
    h, (k, v) = m.head_hidden(f.tokens, f.feats, hc)
    hc = kvcache.commit(hc, k, v, f.n, m.options)
    # the LM head runs on the pair ending at `next` only (n = 0: a finished row, nothing to draft)
    h = pick(h, jnp.maximum(f.n - 1, 0))
    d, q = draw_head(m, None if keys is None else keys[0], h, sampler)
    step = lambda hc, d, h, key: head_token(m, hc, d, h, key, sampler)
    return _rollout(m, hc, d, q, step, h, keys, unroll=True)


DRAFTERS = {DraftMode.MODEL: draft_model, DraftMode.NGRAM: draft_ngram, DraftMode.NGRAM_MODEL: draft_combined,
            DraftMode.HEAD: draft_head, DraftMode.SELF: draft_self, DraftMode.NGRAM_SELF: draft_ngram_self}
