"""The generate program: prefill, then speculative rounds in one lax.while_loop, jitted once.

A round: the drafter proposes K tokens, the target verifies [next, d_1..d_K] in one forward, the
acceptance rule picks a accepted drafts and a next token, the a+1 accepted rows are committed to the
target cache (rejected rows never touch it), and the accepted tokens are emitted. Plain decoding is
the same loop with no draft and K = 0: the verify forward is then an ordinary decode step.

Draft modes (Models.draft_mode, static: one drafter function is traced into the program):
- "model": a small draft model, K steps over its own BF16 cache (one forward of two rows each: the first
  resyncs the cache, the others feed one draft token);
- "ngram": prompt lookup (jspec.ngram) over the prompt and the tokens emitted so far: no model;
- "ngram+model": the n-gram copy where the row has a match, the draft model's tokens otherwise;
- "head": an EAGLE-3 head (jspec.head) on the target's own hidden states: the verify forward also
  returns the fused features of its K+1 positions, and the next round's drafting starts by feeding the
  a+1 accepted (feature, following token) pairs to the head (its own BF16 cache, masked commit).
Every drafter has the signature (m, s, sampler, keys) -> (drafts [B, K], q [B, K, V] or None when
greedy, draft cache); a copied draft's q is a point mass, so sampling stays lossless.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jspec import head, kvcache, ngram, sampling, speculative, stops, struct
from jspec.config import ModelConfig
from jspec.kvcache import KVCache
from jspec.head import HeadConfig, HeadParams
from jspec.model import Params, forward, forward_taps
from jspec.sampling import Sampler


@struct.dataclass
class HeadFeed:
    """What the head reads first in the next round: the pairs (target feature at a position, the token that
    follows it) of the positions the last round committed, ending at `next`."""

    feats: jax.Array  # [B, K+1, E] fused features at positions cache.length - n ..
    tokens: jax.Array  # [B, K+1] the token after each of those positions (the last real one is `next`)
    n: jax.Array  # [B] int32 how many pairs are real (a + 1; 1 after the prefill)


@struct.dataclass
class DecodeState:
    tokens: jax.Array  # [B, N] emitted tokens (N = capacity >= max_new + K + 1: a round may overshoot)
    count: jax.Array  # [B] int32 tokens emitted so far
    next: jax.Array  # [B] int32 last emitted token; not yet in the caches (it sits at cache.length)
    last: jax.Array  # [B] int32 token at cache.length - 1, re-fed to resync the draft cache
    done: jax.Array  # [B] bool
    keys: jax.Array  # [B] PRNG keys, one stream per row: output does not depend on batch-mates
    rounds: jax.Array  # [B] int32 rounds the row took part in
    accepted: jax.Array  # [B] int32 accepted draft tokens
    cache: KVCache
    draft_cache: KVCache | None  # the draft model's cache, or the head's
    # [B, T] the token at each position, prompt then emitted (T = cache capacity); valid at positions
    # <= cache.length, where `next` sits. Kept by the n-gram draft modes only.
    history: jax.Array | None = None
    head_feed: HeadFeed | None = None  # draft mode "head" only
    stop: stops.StopState | None = None  # stop strings only (jspec.stops): their bytes and each row's tail


@struct.dataclass
class Models:
    target: Params
    draft: Params | None
    target_cfg: ModelConfig = struct.field(pytree_node=False)
    draft_cfg: ModelConfig | None = struct.field(pytree_node=False)
    lookahead: int = struct.field(pytree_node=False)  # K; 0 without a draft
    attn_impl: str = struct.field(pytree_node=False, default="reference")
    draft_mode: str = struct.field(pytree_node=False, default="model")  # a key of DRAFTERS
    head: HeadParams | None = None  # draft mode "head": the EAGLE-3 head (draft is then None)
    head_cfg: HeadConfig | None = struct.field(pytree_node=False, default=None)

    @property
    def ngram(self) -> bool:
        """Whether the drafter copies from the history (and the state keeps one)."""
        return self.lookahead > 0 and self.draft_mode in ("ngram", "ngram+model")

    def target_forward(self, tokens, cache):
        return forward(self.target, self.target_cfg, tokens, cache, attn_impl=self.attn_impl)

    def draft_forward(self, tokens, cache):
        return forward(self.draft, self.draft_cfg, tokens, cache)

    def target_features(self, tokens, cache):
        """target_forward, and the head's fused features [B, n, E] at the same positions."""
        logits, kv, tapped = forward_taps(self.target, self.target_cfg, tokens, cache, self.head_cfg.taps,
                                          attn_impl=self.attn_impl)
        return logits, kv, head.fuse(self.head, tapped)

    def head_hidden(self, tokens, feats, cache):
        """The head's pre-norm outputs [B, n, E] (its LM head is left to draw_head) and new rows."""
        return head.hidden(self.head, self.head_cfg, self.target.embed, tokens, feats, cache)


class ProgramArgs(NamedTuple):
    """The arguments of generate_program (and start_program), in order."""

    models: Models
    prompts: jax.Array  # [B, P] int32, right-padded
    prompt_lens: jax.Array  # [B] int32
    max_new: jax.Array  # [B] int32
    sampler: Sampler
    seeds: jax.Array  # [B] uint32
    cache: KVCache  # donated
    draft_cache: KVCache | None  # donated
    eos_ids: jax.Array  # [E] int32: a row stops at the first of these it emits
    stops: stops.Stops | None = None  # stop strings (jspec.stops); None: no stop strings, the program without them


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


def _pick(x, idx):
    """x [B, n, ...], idx [B] -> [B, ...]: row idx[b] of each x[b]."""
    return jnp.take_along_axis(x, idx.reshape(-1, *(1,) * (x.ndim - 1)), axis=1)[:, 0]


# The prompt is run through the models in chunks of at most this many tokens (a loop inside the program):
# the prompt array can then be as wide as the cache, so one compiled program serves every prompt length
# up to the capacity, while the work follows the longest prompt of the call and the attention scores of
# a chunk stay [B, H, chunk, capacity]. At most the default recent window (256): a longer chunk would
# also read its own older rows as INT2 (attention_split), more program for no gain.
PREFILL_CHUNK = 256


def _chunk_width(P: int) -> int:
    """The width of the prefill's chunks of a prompt array P tokens wide."""
    return min(PREFILL_CHUNK, P)


def _chunk_rows(prompt_lens, i, c: int):
    """[B] the prompt tokens of each row in chunk i (of width c)."""
    return jnp.clip(prompt_lens - i * c, 0, c)


def _over_chunks(prompts, prompt_lens, chunk, carry):
    """carry through chunk(i, tokens [B, c], carry) for the prompts' chunks i of c = _chunk_width(P) tokens
    (the last padded) until the longest prompt is done; one chunk: no loop."""
    P = prompts.shape[1]
    c = _chunk_width(P)
    prompts = jnp.pad(prompts, ((0, 0), (0, -P % c)))  # whole chunks
    body = lambda i, carry: chunk(i, jax.lax.dynamic_slice_in_dim(prompts, i * c, c, axis=1), carry)
    if prompts.shape[1] == c:
        return body(0, carry)
    return jax.lax.fori_loop(0, -(-jnp.max(prompt_lens) // c), body, carry)


def prefill(m: Models, prompts, prompt_lens, cache, draft_cache, sampler: Sampler, keys):
    """Runs the prompts through both models (the target alone where m has no draft), commits them, draws the
    first token of each row.

    prompts [B, P] right-padded, read in chunks (_over_chunks); a row commits only its own tokens of a chunk
    (prompt padding never reaches a cache), and its next-token logits come from the chunk that holds its last
    prompt token.
    """
    B, P = prompts.shape
    following = jnp.pad(prompts[:, 1:], ((0, 0), (0, 1 + -P % _chunk_width(P))))  # the token after each

    def chunk(i, tokens, carry):
        cache, draft_cache, logits, feat = carry
        c = tokens.shape[1]
        start = i * c  # tokens [B, c] are at positions start..
        n = _chunk_rows(prompt_lens, i, c)
        last = prompt_lens - 1 - start  # [B] index of the row's last prompt token in this chunk, if here
        here = (last >= 0) & (last < c)
        if m.head is not None:
            out, (k, v), f = m.target_features(tokens, cache)
            # the head's pairs (feature at t, token t + 1) whose token is in the prompt: all but the last
            _, (hk, hv) = m.head_hidden(jax.lax.dynamic_slice_in_dim(following, start, c, axis=1), f, draft_cache)
            draft_cache = kvcache.commit(draft_cache, hk, hv, jnp.clip(last, 0, c))
            feat = jnp.where(here[:, None], _pick(f, jnp.clip(last, 0, c - 1)), feat)
        else:
            out, (k, v) = m.target_forward(tokens, cache)
        cache = kvcache.commit(cache, k, v, n)
        if m.draft is not None:
            draft_cache = _draft_chunk(m, tokens, n, draft_cache)
        logits = jnp.where(here[:, None], _pick(out, jnp.clip(last, 0, c - 1)), logits)
        return cache, draft_cache, logits, feat

    with jax.named_scope("prefill"):
        feat = None if m.head is None else jnp.zeros((B, m.target_cfg.hidden_size), m.target.embed.dtype)
        carry = (cache, draft_cache, jnp.zeros((B, m.target_cfg.vocab_size), jnp.float32), feat)
        cache, draft_cache, logits, feat = _over_chunks(prompts, prompt_lens, chunk, carry)
        keys, use = sampling.split_keys(keys, 2)
        first, _ = draw(use, logits, sampler)
    last = jnp.take_along_axis(prompts, (prompt_lens - 1)[:, None], axis=1)[:, 0]
    return cache, draft_cache, first, last, keys, feat


def _draft_chunk(m: Models, tokens, n, draft_cache):
    """A chunk of the prompts (tokens [B, c]) through the draft model, the first n [B] of each row committed."""
    _, (k, v) = m.draft_forward(tokens, draft_cache)
    return kvcache.commit(draft_cache, k, v, n)


def draft_prefill(m: Models, prompts, prompt_lens, draft_cache):
    """The draft model's half of prefill alone: its cache with the prompts committed."""
    chunk = lambda i, tokens, dc: _draft_chunk(m, tokens, _chunk_rows(prompt_lens, i, tokens.shape[1]), dc)
    with jax.named_scope("prefill"):
        return _over_chunks(prompts, prompt_lens, chunk, draft_cache)


def _resync(m: Models, dc: KVCache, tokens, at):
    """Feeds tokens [B, W] to the draft model at positions dc.length.., commits the first at + 1 of them
    and returns (cache, logits [B, V] at index at [B]): the position of `next`, where drafting starts.

    Positions fed again hold the same tokens as before (idempotent), and rows past `at` are never
    committed: they may be rejected candidates or not yet known.
    """
    logits, (k, v) = m.draft_forward(tokens, dc)
    return kvcache.commit(dc, k, v, at + 1), _pick(logits, at)


def _model_step(m: Models, d, aux, dc):
    """One draft-model token: d [B] -> (logits [B, V], None, new rows)."""
    logits, kv = m.draft_forward(d[:, None], dc)
    return logits[:, -1], None, kv


def _head_step(m: Models, d, h, hc):
    """One head step: d [B] and the head's own last output h [B, E] -> (its next output [B, E], drawn from by
    draw_head, and again as the next step's feature; new rows)."""
    h, kv = m.head_hidden(d[:, None], h[:, None], hc)
    return h[:, -1], h[:, -1], kv


def _rollout(m: Models, dc: KVCache, x, sampler: Sampler, keys, step_fn=_model_step, aux=None, draw_fn=draw,
             unroll=False):
    """K draft tokens [B, K] and q [B, K, V] (None when greedy) from x at `next` (the logits [B, V] of a draft
    model, the head's output): the first draw, then K - 1 single-token steps of step_fn in a fori_loop. aux is
    what a step passes to the next besides the token: nothing for a draft model, the head's output feature.
    draw_fn(key, x, sampler); keys [K, B], or None when greedy. unroll: the steps unrolled, for a one-layer
    head (no loop inside the round's loop); a draft model keeps one traced step whatever K, which keeps an 8B
    program's compile time down (unrolling the shipped draft's steps measured no gain at batch 1, session 5)."""
    key = lambda i: None if keys is None else keys[i]
    d, q = draw_fn(key(0), x, sampler)
    drafts = jnp.zeros((d.shape[0], m.lookahead), jnp.int32).at[:, 0].set(d)
    qs = None if q is None else jnp.zeros((*drafts.shape, q.shape[-1]), q.dtype).at[:, 0].set(q)

    def step(i, carry):  # feeds d_i (at index i - 1), draws d_{i+1} (at index i)
        dc, d, aux, drafts, qs = carry
        x, aux, (k, v) = step_fn(m, d, aux, dc)
        dc = kvcache.commit(dc, k, v, jnp.ones_like(d))
        d, q = draw_fn(key(i), x, sampler)
        return dc, d, aux, drafts.at[:, i].set(d), None if qs is None else qs.at[:, i].set(q)

    dc, _, _, drafts, qs = jax.lax.fori_loop(1, m.lookahead, step, (dc, d, aux, drafts, qs), unroll=unroll)
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
    layers to the program once more (benchmarks/RESULTS.md, session 11)."""
    key = lambda i: None if keys is None else keys[i]
    B, K = s.next.shape[0], m.lookahead
    resync = jnp.stack([s.last, s.next], 1)

    def step(i, carry):
        dc, drafts, qs = carry
        d = jax.lax.dynamic_index_in_dim(drafts, jnp.maximum(i - 1, 0), 1, keepdims=False)
        first = jnp.full((B,), i == 0)
        logits, (k, v) = m.draft_forward(jnp.where(first[:, None], resync, d[:, None]), dc)
        dc = kvcache.commit(dc, k, v, jnp.where(first, 2, 1))
        d, q = draw(key(i), _pick(logits, first.astype(jnp.int32)), sampler)
        return dc, drafts.at[:, i].set(d), None if qs is None else qs.at[:, i].set(q)

    qs = None if sampler.greedy else jnp.zeros((B, K, m.draft_cfg.vocab_size), jnp.float32)
    dc, drafts, qs = jax.lax.fori_loop(0, K, step, (s.draft_cache.replace(length=s.cache.length - 1),
                                                    jnp.zeros((B, K), jnp.int32), qs))
    return drafts, qs, dc


def draft_ngram(m: Models, s: DecodeState, sampler: Sampler, keys):
    """Prompt lookup over the history, any n-gram from 1 token up: a wrong copy costs only its slot
    in the verify forward."""
    drafts, _ = ngram.propose(s.history, s.cache.length + 1, m.lookahead, min_n=1)
    return drafts, point_mass(drafts, m.target_cfg.vocab_size, sampler), s.draft_cache


def draft_combined(m: Models, s: DecodeState, sampler: Sampler, keys):
    """The n-gram copy where a row has a match of 2 tokens or more, the draft model's tokens elsewhere.

    The draft model may have skipped earlier rounds, so its cache is resynced from the history: the
    K + 2 positions up to `next` (everything since the last resync). Its K - 1 steps are skipped when
    every row still running has a match.
    """
    K, length = m.lookahead, s.cache.length
    copied, found = ngram.propose(s.history, length + 1, K, min_n=2)
    start = jnp.maximum(length - K - 1, 0)
    window = jnp.take_along_axis(s.history, start[:, None] + jnp.arange(K + 2), axis=1, mode="clip")
    dc, logits = _resync(m, s.draft_cache.replace(length=start), window, length - start)
    V = m.target_cfg.vocab_size
    skip = lambda: (copied, None if sampler.greedy else jnp.zeros((*copied.shape, V), jnp.float32), dc)
    drafted, q, dc = jax.lax.cond((found | s.done).all(), skip, lambda: _rollout(m, dc, logits, sampler, keys))
    drafts = jnp.where(found[:, None], copied, drafted)
    if q is not None:
        q = jnp.where(found[:, None, None], point_mass(copied, V, sampler), q)
    return drafts, q, dc


def draft_head(m: Models, s: DecodeState, sampler: Sampler, keys):
    """The head's K tokens: the last round's committed pairs first (s.head_feed, at positions cache.length - n
    .. cache.length - 1; the slots past them may hold the head's rejected steps), then K - 1 steps on its own
    features."""
    f = s.head_feed
    hc = s.draft_cache.replace(length=s.cache.length - f.n)
    h, (k, v) = m.head_hidden(f.tokens, f.feats, hc)
    hc = kvcache.commit(hc, k, v, f.n)
    # the LM head runs on the pair ending at `next` only (n = 0: a finished row, nothing to draft)
    h = _pick(h, jnp.maximum(f.n - 1, 0))
    return _rollout(m, hc, h, sampler, keys, _head_step, h, functools.partial(draw_head, m), unroll=True)


DRAFTERS = {"model": draft_model, "ngram": draft_ngram, "ngram+model": draft_combined, "head": draft_head}


def emit(s: DecodeState, seq, n_emit, max_new, eos_ids):
    """Writes seq[:, :n_emit] at each row's count; stops rows at EOS (dropping what follows), max_new or a stop
    string (dropping the tokens after the one that completes it) -> (tokens, count, done, stop state)."""
    B, n = seq.shape
    j = jnp.arange(n)
    is_eos = jnp.isin(seq, eos_ids) & (j < n_emit[:, None])
    first_eos = jnp.argmax(is_eos, axis=1)
    hit = is_eos.any(1)
    n_emit = jnp.where(hit, first_eos + 1, n_emit)
    n_emit = jnp.minimum(n_emit, max_new - s.count)
    n_emit = jnp.where(s.done, 0, n_emit)
    stop, stopped = s.stop, jnp.zeros_like(hit)
    if stop is not None:
        n_emit, stopped, stop = stops.advance(stop, seq, n_emit)
    idx = jnp.where(j < n_emit[:, None], s.count[:, None] + j, s.tokens.shape[1])
    tokens = s.tokens.at[jnp.arange(B)[:, None], idx].set(seq, mode="drop")
    count = s.count + n_emit
    done = s.done | hit | stopped | (count >= max_new)
    return tokens, count, done, stop


def accept(sampler: Sampler, logits, drafts, q, keys):
    """(a [B] accepted drafts, next token [B]) from the verify logits [B, K+1, V]."""
    if sampler.greedy:
        return speculative.accept_greedy(logits, drafts)
    p = sampling.warp(logits, sampler)
    q = q if drafts.shape[1] else jnp.zeros(p[:, :0].shape, p.dtype)
    return speculative.accept_sampled(p, q, drafts, keys)


def write_tokens(buf, start, seq, n):
    """buf [B, T] with seq[:, :n] (seq [B, m], n [B]) written at positions start [B]..; the rest dropped."""
    j = jnp.arange(seq.shape[1])
    idx = jnp.where(j < n[:, None], start[:, None] + j, buf.shape[1])
    return buf.at[jnp.arange(buf.shape[0])[:, None], idx].set(seq, mode="drop")


def round_step(m: Models, sampler: Sampler, max_new, eos_ids, s: DecodeState) -> DecodeState:
    """One speculative round (one decode step when K = 0)."""
    K = m.lookahead
    if sampler.greedy:  # nothing is drawn at random: no keys are split (K + 3 threefry hashes per round)
        keys, accept_keys, draft_keys = s.keys, None, None
    else:
        all_keys = sampling.split_keys(s.keys, K + 3)  # [K+3, B]
        keys, accept_keys, draft_keys = all_keys[0], all_keys[1:3], all_keys[3:]
    draft_cache = s.draft_cache
    with jax.named_scope("draft"):
        if K:
            drafts, q, draft_cache = DRAFTERS[m.draft_mode](m, s, sampler, draft_keys)
        else:
            drafts, q = jnp.zeros((s.next.shape[0], 0), jnp.int32), None
    fed = jnp.concatenate([s.next[:, None], drafts], 1)  # [B, K+1] at positions length + 0..K
    with jax.named_scope("verify"):
        if s.head_feed is not None:
            logits, (k, v), feats = m.target_features(fed, s.cache)
        else:
            logits, (k, v) = m.target_forward(fed, s.cache)
    with jax.named_scope("accept"):
        a, nxt = accept(sampler, logits, drafts, q, accept_keys)
    n_commit = jnp.where(s.done, 0, a + 1)
    with jax.named_scope("commit"):  # next, d_1..d_a: rejected rows never reach the cache
        cache = kvcache.commit(s.cache, k, v, n_commit)
    # emitted: d_1..d_a, then the target's token in slot a
    seq = jnp.where(jnp.arange(K + 1) == a[:, None], nxt[:, None], jnp.concatenate([drafts, fed[:, :1]], 1))
    tokens, count, done, stop = emit(s, seq, a + 1, max_new, eos_ids)
    # the history gains what the cache gained, shifted by one: d_1..d_a and the new next
    history = None if s.history is None else write_tokens(s.history, s.cache.length + 1, seq, n_commit)
    # the head's next pairs: the feature at length + j with the token after it, seq[:, j] (d_{j+1}, or `nxt`
    # at j = a)
    head_feed = None if s.head_feed is None else HeadFeed(feats, seq, n_commit)
    active = ~s.done
    return s.replace(
        tokens=tokens, count=count, next=nxt, last=jnp.take_along_axis(fed, a[:, None], axis=1)[:, 0],
        done=done, keys=keys, rounds=s.rounds + active, accepted=s.accepted + jnp.where(active, a, 0),
        cache=cache, draft_cache=draft_cache, history=history, head_feed=head_feed, stop=stop,
    )


def _start(m: Models, prompts, prompt_lens, max_new, sampler: Sampler, seeds, cache, draft_cache, eos_ids,
           stop_strings=None):
    """Prefill and the first emitted token: the state the rounds start from."""
    B = prompts.shape[0]
    N = cache.capacity  # output buffer: a row emits at most capacity - its prompt (max_new + K + 1) tokens
    keys = jax.vmap(jax.random.key)(seeds)
    cache, draft_cache, first, last, keys, feat = prefill(m, prompts, prompt_lens, cache, draft_cache, sampler,
                                                          keys)
    zeros = jnp.zeros((B,), jnp.int32)
    history = None
    if m.ngram:  # the prompt, then `next` at position prompt_len (padding past it is never read)
        history = jnp.zeros((B, cache.capacity), jnp.int32).at[:, : prompts.shape[1]].set(prompts)
        history = write_tokens(history, prompt_lens, first[:, None], jnp.ones_like(zeros))
    head_feed = None
    if m.head is not None and m.lookahead:  # one real pair: the last prompt position's feature, `next`
        K1 = m.lookahead + 1
        head_feed = HeadFeed(jnp.zeros((B, K1, feat.shape[-1]), feat.dtype).at[:, 0].set(feat),
                             jnp.zeros((B, K1), jnp.int32).at[:, 0].set(first), jnp.ones_like(zeros))
    s = DecodeState(
        tokens=jnp.zeros((B, N), jnp.int32), count=zeros, next=first, last=last,
        done=jnp.zeros((B,), bool), keys=keys, rounds=zeros, accepted=zeros,
        cache=cache, draft_cache=draft_cache, history=history, head_feed=head_feed,
        stop=None if stop_strings is None else stops.start(stop_strings),
    )
    tokens, count, done, stop = emit(s, first[:, None], jnp.ones_like(zeros), max_new, eos_ids)
    return s.replace(tokens=tokens, count=count, done=done, stop=stop)


def _rounds(m: Models, sampler: Sampler, max_new, eos_ids, s: DecodeState) -> DecodeState:
    """The rounds from state s until every row is done."""
    step = functools.partial(round_step, m, sampler, max_new, eos_ids)
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, s)


def _generate(m: Models, prompts, prompt_lens, max_new, sampler: Sampler, seeds, cache, draft_cache,
              eos_ids, stop_strings=None):
    s = _start(m, prompts, prompt_lens, max_new, sampler, seeds, cache, draft_cache, eos_ids, stop_strings)
    return _rounds(m, sampler, max_new, eos_ids, s)


generate_program = jax.jit(_generate, donate_argnames=("cache", "draft_cache"))
# The same work as two programs run back to back with no host sync between them: the prefill (start_program)
# and the rounds from the state it leaves (rounds_program). On one device the Engine compiles them side by
# side, each holding the target and the draft once (benchmarks/RESULTS.md, session 11).
start_program = jax.jit(_start, donate_argnames=("cache", "draft_cache"))
rounds_program = jax.jit(_rounds, donate_argnums=(4,))
# With a draft model, the Engine runs the draft's prefill as a third part first and start_program on the models
# without the draft: the three compile side by side (engine.part_names).
draft_prefill_program = jax.jit(draft_prefill, donate_argnums=(3,))
# Streaming runs one round per call (a host sync per round).
round_program = jax.jit(round_step, donate_argnums=(4,))
