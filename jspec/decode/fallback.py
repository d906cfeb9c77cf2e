"""Rows whose drafts stop paying, inside one call: each row tracks what its drafting rounds emit, and when no row
that is still running would gain from drafting, the round is a plain decode step (no draft, a verify over one
token) instead of a speculative one.

The engine turns it on where it chose K (lookahead "auto", draft "auto") and the round costs MIN_PAYS plain steps
or more, and gives the program `pays` (Models.fallback): the tokens per row a drafting round must emit to cost no
more than plain steps, the round's price over a plain step's (runtime.lookahead.breakeven). Per row:
- `mean`, the tokens its drafting rounds emitted, averaged with weight HALF on the newest (it starts at K + 1);
- the row drafts while mean >= pays. A row that stops accepting (one token per round) falls under pays after
  rounds_to_stop(K, pays) drafting rounds: floor(log2(K / (pays - 1))) + 1; 2 at K = 4 where a round costs 3
  plain steps, 1 where it costs 5, none where it costs more than K + 1 (it drafts only in its probes).
- a row that stopped drafts again for one round (a probe) after `wait` rounds without: FIRST_WAIT at first,
  doubled by each probe that does not bring it back (up to MAX_WAIT), FIRST_WAIT again once it is back. A row that
  stopped still takes part in the rounds its batch-mates draft: those rounds cost it nothing, what it accepts in
  them counts as a probe's would, and its wait restarts after each (not doubled).
Which rounds draft changes speed only: greedy output is the target's argmax whatever the round; a sampled token
is drawn from the target's distribution either way (decode.speculative), though which sample a seed gives
depends on the rounds.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jspec import struct

# Only where a round costs this many plain steps or more: on one H100 (shipped pair, INT2, 512 tokens, same K on
# and off) the fallback gained 1.18-1.30x with the self-draft (a round at 5.2-5.7 steps), moved the shipped draft
# (2.4-2.6) by 0.89-1.08x, and lost 0.45-0.95x with n-gram lookup (1.3-1.5): its copies come in bursts that a row's
# recent rounds do not foresee, and a row that stopped missed them.
MIN_PAYS = 3.0
HALF = 0.5  # the newest drafting round's weight in a row's mean
FIRST_WAIT = 4  # rounds without drafts before a stopped row's first probe
MAX_WAIT = 64


@struct.dataclass
class RowDrafts:
    """Per row [B]: the mean tokens of its drafting rounds, rounds since it stopped drafting, rounds before its next
    probe, and the rounds it drafted in."""

    mean: jax.Array  # float32
    idle: jax.Array  # int32
    wait: jax.Array  # int32
    drafted: jax.Array  # int32


def used(pays: float | None) -> bool:
    """Whether a call whose round costs `pays` plain steps (None: K fixed by the caller) runs with the fallback."""
    return pays is not None and pays >= MIN_PAYS


def start(batch: int, K: int) -> RowDrafts:
    zeros = jnp.zeros((batch,), jnp.int32)
    return RowDrafts(jnp.full((batch,), K + 1.0, jnp.float32), zeros, zeros + FIRST_WAIT, zeros)


def drafting(r: RowDrafts, pays) -> jax.Array:
    """[B] bool: rows that draft in the next round (their drafts pay, or a probe is due)."""
    return (r.mean >= pays) | (r.idle >= r.wait)


def after(r: RowDrafts, pays, drafted, a, active) -> RowDrafts:
    """r after a round (drafted: whether it drafted, a [B] drafts accepted, active [B] rows still running)."""
    was_on, probing = r.mean >= pays, r.idle >= r.wait
    mean = jnp.where(drafted & active, (1 - HALF) * r.mean + HALF * (a + 1).astype(jnp.float32), r.mean)
    on = mean >= pays
    failed = drafted & probing & ~was_on & ~on  # a probe that did not bring the row back
    idle = jnp.where(drafted | was_on, 0, r.idle + active)  # a drafting round was its probe: the wait restarts
    wait = jnp.where(on, FIRST_WAIT, jnp.where(failed, jnp.minimum(2 * r.wait, MAX_WAIT), r.wait))
    return RowDrafts(mean, idle, wait, r.drafted + (drafted & active))


def rounds_to_stop(K: int, pays: float) -> int | None:
    """Drafting rounds after which a row that accepts nothing stops drafting (None: never, pays <= 1): its mean
    after n of them is 1 + K (1 - HALF)^n, under pays from the first n with K (1 - HALF)^n < pays - 1."""
    if pays <= 1:
        return None
    if pays > K + 1:  # no round can emit that much: it drafts only in its probes
        return 0
    return max(math.floor(math.log(K / (pays - 1)) / -math.log(1 - HALF)) + 1, 1)


def drafted_rounds(state) -> np.ndarray:
    """[B] the rounds each row drafted in: its rounds less the plain steps of the per-row fallback
    (the state's rows)."""
    return np.asarray(state.rounds if state.rows is None else state.rows.drafted)


def drafting_counts(state) -> tuple[np.ndarray, np.ndarray]:
    """(drafting rounds, tokens emitted) per row as if the plain steps of the fallback had not run (each emitted
    one token, none accepted): what the acceptance estimate learns from (lookahead.observe_batch)."""
    drafted = drafted_rounds(state)
    return drafted, np.asarray(state.count) - (np.asarray(state.rounds) - drafted)
