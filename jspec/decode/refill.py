"""Rows refilled as they finish: one batch whose slots take the next prompts of a job, at fixed shapes.

The generate program (decode.loop) runs its rows until the last is done, so a batch waits for its slowest row.
Here the rounds stop early instead, and a second program restarts the slots that are done with new prompts:

- empty_program: a state of the batch's shapes with every row done (no prompt yet, no model run);
- refill_program: the prefill of the rows in a mask [B], written into the batch's caches and state in place.
  The other rows are given a prompt length of 0 there, so they commit nothing to either cache and their state
  is kept as it was; the masked rows get the state decode.loop._start gives a new row (keys from their seeds,
  the first token emitted);
- rounds_until_program: rounds until every row is done, `want` rows are done or `limit` rounds have run
  (arrays: any bound without a recompile); it returns the rounds it ran.

The host (runtime.slots) loops over the three: run rounds, write out the rows that are done, refill their
slots. A slot's old cache content needs no clearing: a row attends only to positions below its own length,
and every one of those is written by its own prefill and rounds (decode.loop's invariant for any cache).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jspec.decode.loop import _start, first_state, round_step
from jspec.decode.state import DecodeState, Models
from jspec.model.sampling import Sampler


def _empty(m: Models, prompts, prompt_lens, max_new, seeds, cache, draft_cache, eos_ids,
           stop_strings=None) -> DecodeState:
    """_start's state with no prefill: every row done at once (max_new 0), nothing in the caches."""
    B = prompts.shape[0]
    zeros = jnp.zeros((B,), jnp.int32)
    feat = None if m.head is None else jnp.zeros((B, m.target_cfg.hidden_size), m.target.embed.dtype)
    keys = jax.vmap(jax.random.key)(seeds)
    return first_state(m, prompts, prompt_lens, jnp.zeros_like(max_new), eos_ids, stop_strings, cache,
                       draft_cache, zeros, zeros, keys, feat)


def _rows(mask, new, old):
    """new where mask [B] is set, else old (arrays [B, ...])."""
    return jnp.where(mask.reshape(mask.shape + (1,) * (new.ndim - 1)), new, old)


def _refill(m: Models, prompts, prompt_lens, max_new, sampler: Sampler, seeds, eos_ids, stop_strings, mask,
            s: DecodeState) -> DecodeState:
    """s with the rows of mask [B] started afresh on prompts [B, P] (prompt_lens, max_new, seeds as _start's);
    the other rows and their cache slots are left as they are."""
    restart = lambda c: None if c is None else c.replace(length=jnp.where(mask, 0, c.length))
    # the other rows read a prompt of 0 tokens: the prefill commits nothing of theirs
    fresh = _start(m, prompts, jnp.where(mask, prompt_lens, 0), max_new, sampler, seeds, restart(s.cache),
                   restart(s.draft_cache), eos_ids, stop_strings)
    per_row = lambda x: x.replace(cache=None, draft_cache=None, stop=None)
    out = jax.tree.map(functools.partial(_rows, mask), per_row(fresh), per_row(s))
    stop = None
    if s.stop is not None:  # the stop strings are the call's (every row's, packed by the host); the tails per row
        stop = fresh.stop.replace(tail=_rows(mask, fresh.stop.tail, s.stop.tail),
                                  started=_rows(mask, fresh.stop.started, s.stop.started))
    return out.replace(cache=fresh.cache, draft_cache=fresh.draft_cache, stop=stop)


def _rounds_until(m: Models, sampler: Sampler, max_new, eos_ids, limit, want, s: DecodeState):
    """(the state, rounds run [] int32): rounds from s until every row is done, `want` rows are done (done
    counts rows without a prompt too), or `limit` rounds have run."""
    step = functools.partial(round_step, m, sampler, max_new, eos_ids)

    def more(c):
        s, i = c
        return ~jnp.all(s.done) & (i < limit) & (jnp.sum(s.done) < want)

    return jax.lax.while_loop(more, lambda c: (step(c[0]), c[1] + 1), (s, jnp.zeros((), jnp.int32)))


empty_program = jax.jit(_empty, donate_argnames=("cache", "draft_cache"))
refill_program = jax.jit(_refill, donate_argnums=(9,))
rounds_until_program = jax.jit(_rounds_until, donate_argnums=(6,))
