"""Rows refilled as they finish: one batch whose slots take the next prompts of a job, at fixed shapes.

The generate program (decode.loop) runs its rows until the last is done, so a batch waits for its slowest row.
Here the rounds stop early instead, and a second program restarts the slots that are done with new prompts:

- empty_program: a state of the batch's shapes with every row done (no prompt yet, no model run);
- refill_program: R new rows (R fixed per batch, at most B) started as decode.loop._start starts a batch of R
  (their prefill into fresh caches of R rows, keys from their seeds, the first token emitted), then scattered
  into the batch's caches and state at their slots [R] (a slot index of B: a padding row, dropped). Only the R
  rows are prefilled, and only their rows of the caches are written; the other rows are left as they are;
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

from jspec.cache.kvcache import KVCache
from jspec.decode import drafters
from jspec.decode.loop import _start, first_state, round_step
from jspec.decode.state import DecodeState, Models
from jspec.model.sampling import Sampler


def _empty(m: Models, prompts, prompt_lens, max_new, seeds, cache, draft_cache, eos_ids,
           stop_strings=None) -> DecodeState:
    """_start's state with no prefill: every row done at once (max_new 0), nothing in the caches."""
    B = prompts.shape[0]
    zeros = jnp.zeros((B,), jnp.int32)
    keys = jax.vmap(jax.random.key)(seeds)
    return first_state(m, prompts, prompt_lens, jnp.zeros_like(max_new), eos_ids, stop_strings, cache,
                       draft_cache, zeros, zeros, keys, drafters.of(m).prefill_carry(m, B))


def _put(slots, axis: int, big, rows):
    """big with rows [.., R, ..] written at big's rows `slots` [R] along axis (an index past the end: dropped)."""
    return big.at[(slice(None),) * axis + (slots,)].set(rows, mode="drop")


def _cache_map(fn, cache: KVCache | None, *others: KVCache):
    """fn(leaf, *other leaves, batch axis) over a cache's arrays (its layers' [L, B, ...])."""
    if cache is None:
        return None
    layers = jax.tree.map(lambda *x: fn(*x, 1), cache.layers, *(o.layers for o in others))
    return cache.replace(layers=layers, length=fn(cache.length, *(o.length for o in others), 0))


def _rows_map(fn, tree, *others):
    """fn(leaf, *other leaves, batch axis) over a tree of per-row arrays, caches among them (_cache_map)."""
    is_cache = lambda x: isinstance(x, KVCache)
    each = lambda x, *o: _cache_map(fn, x, *o) if is_cache(x) else fn(x, *o, 0)
    return jax.tree.map(each, tree, *others, is_leaf=is_cache)


def _refill(m: Models, prompts, prompt_lens, max_new, sampler: Sampler, seeds, eos_ids, stop_strings, all_stops,
            slots, s: DecodeState, allowed=None) -> DecodeState:
    """s with R new rows started at its rows `slots` [R] (B: a padding row): prompts [R, P], prompt_lens,
    max_new, sampler, seeds, stop_strings and allowed the R rows' (as _start's); all_stops: every row's stop
    strings after the refill (or None). The other rows and their cache rows are left as they are."""
    R = prompts.shape[0]
    # zeros behind a barrier: XLA constant-folded the prefill's reads of them (a "constant folding > 1s" alarm in
    # benchmarks/jobs.py; the tiny model's first step compiled in 11.8 s with it, 12.9 s without, CPU)
    empty = lambda c: jax.lax.optimization_barrier(
        _cache_map(lambda x, axis: jnp.zeros(x.shape[:axis] + (R,) + x.shape[axis + 1:], x.dtype), c))
    fresh = _start(m, prompts, prompt_lens, max_new, sampler, seeds, empty(s.cache),
                   empty(drafters.of(m).cache_of(s.draft)), eos_ids, stop_strings, allowed)
    put = functools.partial(_put, slots)
    per_row = lambda x: x.replace(cache=None, draft=None, stop=None)
    out = jax.tree.map(lambda big, rows: put(0, big, rows), per_row(s), per_row(fresh))
    stop = None
    if s.stop is not None:  # the stop strings of every row now; each row's tail
        stop = s.stop.replace(stops=all_stops, tail=put(0, s.stop.tail, fresh.stop.tail),
                              started=put(0, s.stop.started, fresh.stop.started))
    rows = lambda big, fresh: _rows_map(lambda b, r, axis: put(axis, b, r), big, fresh)
    return out.replace(cache=rows(s.cache, fresh.cache), draft=rows(s.draft, fresh.draft), stop=stop)


def _rounds_until(m: Models, sampler: Sampler, max_new, eos_ids, limit, want, s: DecodeState):
    """(the state, rounds run [] int32): rounds from s until every row is done, `want` rows are done (done
    counts rows without a prompt too), or `limit` rounds have run."""
    step = functools.partial(round_step, m, sampler, max_new, eos_ids)

    def more(c):
        s, i = c
        return ~jnp.all(s.done) & (i < limit) & (jnp.sum(s.done) < want)

    return jax.lax.while_loop(more, lambda c: (step(c[0]), c[1] + 1), (s, jnp.zeros((), jnp.int32)))


empty_program = jax.jit(_empty, donate_argnames=("cache", "draft_cache"))
refill_program = jax.jit(_refill, donate_argnums=(10,))
rounds_until_program = jax.jit(_rounds_until, donate_argnums=(6,))
