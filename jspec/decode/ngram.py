"""Prompt lookup: draft tokens copied from earlier in the sequence, on device, in fixed shapes.

Per row, the last n tokens of the history (the prompt, then every token emitted so far) are looked for
at every earlier position; the longest n in [min_n, max_n] wins, and among its occurrences the most
recent. The K tokens that followed that occurrence are the drafts. An occurrence close to the end runs
out of known followers: the copy then continues periodically (the tokens from the occurrence to the end
repeat), which is what a match predicts in a repeating sequence. A row without a match proposes its
last token K times (cheap to verify, and right now and then: runs of spaces, closing brackets).

One fused pass of [B, T, max_n] comparisons and a [B, K] gather per round: no host sync, no
data-dependent shapes. The draft distribution is a point mass on each draft (speculative.py).
"""

from __future__ import annotations

import jax.numpy as jnp

MAX_N = 4  # longest n-gram tried


def match(history, end, min_n: int = 1, max_n: int = MAX_N):
    """history [B, T] int32, valid at positions < end [B] -> (n [B], e [B]).

    n: length of the longest match in [min_n, max_n] (0: none); e: the position right after its most
    recent occurrence, i.e. of the first token to copy (e < end, so the suffix itself never counts).
    """
    B, T = history.shape
    e = jnp.arange(T)
    run = jnp.ones((B, T), bool)  # [B, e]: the last j tokens before e equal the last j before end
    n = jnp.zeros((B, T), jnp.int32)
    for j in range(1, max_n + 1):  # max_n is small and static
        tail = jnp.take_along_axis(history, jnp.maximum(end - j, 0)[:, None], axis=1)  # [B, 1]
        before = jnp.pad(history, ((0, 0), (j, 0)), constant_values=-1)[:, :T]  # token j before e; -1: none
        run = run & (before == tail)
        n = n + run
    ok = (e < end[:, None]) & (n >= min_n)
    score = jnp.max(jnp.where(ok, n * T + e, -1), axis=1)  # longest first, then most recent
    found = score >= 0
    return jnp.where(found, score // T, 0), jnp.where(found, score % T, end - 1)


def propose(history, end, K: int, min_n: int = 1, max_n: int = MAX_N):
    """-> (drafts [B, K] int32, found [B] bool): the K tokens that followed the match (see match)."""
    n, e = match(history, end, min_n, max_n)
    period = jnp.maximum(end - e, 1)  # [B] tokens from the occurrence to the end; 1 without a match
    idx = e[:, None] + jnp.arange(K) % period[:, None]  # < end: only known tokens are copied
    return jnp.take_along_axis(history, idx, axis=1), n > 0
