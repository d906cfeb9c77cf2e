"""The generate program: prefill, then speculative rounds in one lax.while_loop, jitted once.

A round: the drafter proposes K tokens (decode.drafters), the target verifies [next, d_1..d_K] in one forward,
the acceptance rule picks a accepted drafts and a next token, the a+1 accepted rows are committed to the
target cache (rejected rows never touch it), and the accepted tokens are emitted. Plain decoding is the same
loop with no draft and K = 0: the verify forward is then an ordinary decode step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jspec.cache import kvcache
from jspec.decode import chunks, drafters, fallback, healing, speculative, stops
from jspec.decode.drafters import Chunk, draw, pick
from jspec.decode.state import DecodeState, Models
from jspec.model import sampling
from jspec.model.sampling import Sampler


def prefill(m: Models, prompts, prompt_lens, cache, draft_cache, sampler: Sampler, keys, allowed=None):
    """Runs the prompts through the target and the drafter's share of each chunk (drafters: Proposer.prefill_chunk),
    commits them, draws the first token of each row -> (cache, draft_cache, first, last, keys, the drafter's
    prefill carry).

    prompts [B, P] right-padded, read in chunks (decode.chunks); a row commits only its own tokens of a chunk
    (prompt padding never reaches a cache), and its next-token logits come from the chunk that holds its last
    prompt token. allowed [B, V] bool: the first token's choices where prompts were healed (decode.healing).
    """
    B, P = prompts.shape
    drafter = drafters.of(m)
    following = jnp.pad(prompts[:, 1:], ((0, 0), (0, 1 + -P % chunks.width(m, P))))  # the token after each

    def chunk(i, tokens, carry):
        cache, draft_cache, logits, extra = carry
        c = tokens.shape[1]
        start = i * c  # tokens [B, c] are at positions start..
        last = prompt_lens - 1 - start  # [B] index of the row's last prompt token in this chunk, if here
        here = (last >= 0) & (last < c)
        part = Chunk(tokens, jax.lax.dynamic_slice_in_dim(following, start, c, axis=1),
                     chunks.rows(prompt_lens, i, c), last, here)
        out, (k, v), features = drafter.forward(m, tokens, cache)
        draft_cache, extra = drafter.prefill_chunk(m, draft_cache, part, features, extra)
        cache = kvcache.commit(cache, k, v, part.n, m.options)
        logits = jnp.where(here[:, None], pick(out, jnp.clip(last, 0, c - 1)), logits)
        return cache, draft_cache, logits, extra

    with jax.named_scope("prefill"):
        carry = (cache, draft_cache, jnp.zeros((B, m.target_cfg.vocab_size), jnp.float32),
                 drafter.prefill_carry(m, B))
        cache, draft_cache, logits, extra = chunks.over_chunks(m, prompts, prompt_lens, chunk, carry)
        keys, use = sampling.split_keys(keys, 2)
        first, _ = draw(use, healing.constrain(logits, allowed), sampler)
    last = jnp.take_along_axis(prompts, (prompt_lens - 1)[:, None], axis=1)[:, 0]
    return cache, draft_cache, first, last, keys, extra


def draft_prefill(m: Models, prompts, prompt_lens, draft_cache):
    """The drafter's prefill alone, where it runs as a part of its own (Proposer.split_prefill)."""
    return drafters.of(m).prefill_alone(m, prompts, prompt_lens, draft_cache)


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


def round_step(m: Models, sampler: Sampler, max_new, eos_ids, s: DecodeState) -> DecodeState:
    """One speculative round (one decode step when K = 0). Where rows whose drafts stop paying are tracked
    (Models.fallback, decode.fallback), a round that no running row would draft in is a plain decode step."""
    if s.rows is None:
        return _round(m, sampler, max_new, eos_ids, s, True)
    drafting = (fallback.drafting(s.rows, m.fallback) & ~s.done).any()
    return jax.lax.cond(drafting, lambda s: _round(m, sampler, max_new, eos_ids, s, True),
                        lambda s: _round(m, sampler, max_new, eos_ids, s, False), s)


def _round(m: Models, sampler: Sampler, max_new, eos_ids, s: DecodeState, drafting: bool) -> DecodeState:
    """A round with the call's K drafts, or (drafting False) a plain decode step in a speculative call: no draft,
    the verify over `next` alone, and the drafter's state kept in step (Proposer.idle)."""
    K = m.lookahead if drafting else 0
    if sampler.greedy:  # nothing is drawn at random: no keys are split (K + 3 threefry hashes per round)
        keys, accept_keys, draft_keys = s.keys, None, None
    else:
        all_keys = sampling.split_keys(s.keys, K + 3)  # [K+3, B]
        keys, accept_keys, draft_keys = all_keys[0], all_keys[1:3], all_keys[3:]
    drafter = drafters.of(m)
    with jax.named_scope("draft"):
        if drafting:
            drafts, q, draft = drafter.propose(m, s, sampler, draft_keys)
        else:
            drafts, q, draft = jnp.zeros((s.next.shape[0], 0), jnp.int32), None, s.draft
    fed = jnp.concatenate([s.next[:, None], drafts], 1)  # [B, K+1] at positions length + 0..K
    with jax.named_scope("verify"):
        logits, (k, v), features = drafter.forward(m, fed, s.cache)
    with jax.named_scope("accept"):
        a, nxt = accept(sampler, logits, drafts, q, accept_keys)
    n_commit = jnp.where(s.done, 0, a + 1)
    with jax.named_scope("commit"):  # next, d_1..d_a: rejected rows never reach the cache
        cache = kvcache.commit(s.cache, k, v, n_commit, m.options)
    # emitted: d_1..d_a, then the target's token in slot a
    seq = jnp.where(jnp.arange(K + 1) == a[:, None], nxt[:, None], jnp.concatenate([drafts, fed[:, :1]], 1))
    tokens, count, done, stop = emit(s, seq, a + 1, max_new, eos_ids)
    if drafting:
        draft = drafter.update(m, s, draft, seq, n_commit, features)
    else:  # seq as wide as a drafting round's (its tokens past the first never committed)
        draft = drafter.idle(m, s, draft, jnp.pad(seq, ((0, 0), (0, m.lookahead))), n_commit, features)
    active = ~s.done
    rows = None if s.rows is None else fallback.after(s.rows, m.fallback, drafting, a, active)
    return s.replace(
        tokens=tokens, count=count, next=nxt, last=jnp.take_along_axis(fed, a[:, None], axis=1)[:, 0],
        # accepted: the drafts emitted, not those cut by max_new, EOS or a stop string (emit)
        done=done, keys=keys, rounds=s.rounds + active, accepted=s.accepted + jnp.minimum(a, count - s.count),
        cache=cache, draft=draft, stop=stop, rows=rows,
    )


def _start(m: Models, prompts, prompt_lens, max_new, sampler: Sampler, seeds, cache, draft_cache, eos_ids,
           stop_strings=None, allowed=None):
    """Prefill and the first emitted token: the state the rounds start from."""
    keys = jax.vmap(jax.random.key)(seeds)
    cache, draft_cache, first, last, keys, extra = prefill(m, prompts, prompt_lens, cache, draft_cache, sampler,
                                                           keys, allowed)
    return first_state(m, prompts, prompt_lens, max_new, eos_ids, stop_strings, cache, draft_cache, first, last,
                       keys, extra)


def first_state(m: Models, prompts, prompt_lens, max_new, eos_ids, stop_strings, cache, draft_cache, first, last,
                keys, extra) -> DecodeState:
    """The state after the prefill: the first token emitted (first [B], drawn from the prefill's logits; last [B]
    the last prompt token; extra: the drafter's prefill carry)."""
    B = prompts.shape[0]
    N = cache.capacity  # output buffer: a row emits at most capacity - its prompt (max_new + K + 1) tokens
    zeros = jnp.zeros((B,), jnp.int32)
    draft = drafters.of(m).start(m, draft_cache, prompts, prompt_lens, first, extra, cache.capacity)
    s = DecodeState(
        tokens=jnp.zeros((B, N), jnp.int32), count=zeros, next=first, last=last,
        done=jnp.zeros((B,), bool), keys=keys, rounds=zeros, accepted=zeros, cache=cache, draft=draft,
        stop=None if stop_strings is None else stops.start(stop_strings),
        rows=None if m.fallback is None or not m.lookahead else fallback.start(B, m.lookahead),
    )
    tokens, count, done, stop = emit(s, first[:, None], jnp.ones_like(zeros), max_new, eos_ids)
    return s.replace(tokens=tokens, count=count, done=done, stop=stop)


def _rounds(m: Models, sampler: Sampler, max_new, eos_ids, s: DecodeState) -> DecodeState:
    """The rounds from state s until every row is done."""
    step = functools.partial(round_step, m, sampler, max_new, eos_ids)
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, s)


def _generate(m: Models, prompts, prompt_lens, max_new, sampler: Sampler, seeds, cache, draft_cache,
              eos_ids, stop_strings=None, allowed=None):
    s = _start(m, prompts, prompt_lens, max_new, sampler, seeds, cache, draft_cache, eos_ids, stop_strings, allowed)
    return _rounds(m, sampler, max_new, eos_ids, s)


generate_program = jax.jit(_generate, donate_argnames=("cache", "draft_cache"))
# The same work as two programs run back to back with no host sync between them: the prefill (start_program)
# and the rounds from the state it leaves (rounds_program). On one device the Engine compiles them side by
# side, each holding the target and the draft once.
start_program = jax.jit(_start, donate_argnames=("cache", "draft_cache"))
rounds_program = jax.jit(_rounds, donate_argnums=(4,))
# Where a drafter's prefill runs apart (a draft model: Proposer.split_prefill), the Engine runs it as a third part
# first and start_program on the models without it: the three compile side by side (runtime.parts.part_names).
draft_prefill_program = jax.jit(draft_prefill, donate_argnums=(3,))
# Streaming runs one round per call (a host sync per round).
round_program = jax.jit(round_step, donate_argnums=(4,))

