"""Prompt lookup (decode.ngram) over the prompt and the tokens emitted so far: no model. Its state is the token
history [B, T] (T = the cache's capacity): the token at each position, prompt then emitted, valid at positions
<= cache.length, where `next` sits."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec.decode import ngram
from jspec.decode.drafters.base import Probe, Proposer, point_mass
from jspec.decode.state import DecodeState, Models
from jspec.model.sampling import Sampler


def write_tokens(buf, start, seq, n):
    """buf [B, T] with seq[:, :n] (seq [B, m], n [B]) written at positions start [B]..; the rest dropped."""
    j = jnp.arange(seq.shape[1])
    idx = jnp.where(j < n[:, None], start[:, None] + j, buf.shape[1])
    return buf.at[jnp.arange(buf.shape[0])[:, None], idx].set(seq, mode="drop")


def start_history(prompts, prompt_lens, first, capacity: int):
    """The prompt, then `next` at position prompt_len (padding past it is never read)."""
    B = prompts.shape[0]
    history = jnp.zeros((B, capacity), jnp.int32).at[:, : prompts.shape[1]].set(prompts)
    return write_tokens(history, prompt_lens, first[:, None], jnp.ones((B,), jnp.int32))


def after_verify(history, s: DecodeState, seq, n_commit):
    """The history gains what the cache gained, shifted by one: d_1..d_a and the new next."""
    return write_tokens(history, s.cache.length + 1, seq, n_commit)


def lookup_probe(m: Models, batch: int, capacity: int, context: int, K: int) -> Probe:
    """One lookup of K drafts over a [B, capacity] history and their write into it."""
    def step(m, history):
        end = jnp.full((batch,), context, jnp.int32)
        drafts, _ = ngram.propose(history, end, K, 1, m.drafter.ngram_max)
        return write_tokens(history, end - K, drafts, jnp.full((batch,), K))  # the next lookup reads them

    make = lambda place: place.batch(jax.random.randint(jax.random.key(0), (batch, capacity), 0, 64, jnp.int32))
    models = m.replace(target=None, drafter=m.drafter.replace(model=None))
    return Probe(dict(K=K), models, step, make)


@dataclasses.dataclass(frozen=True)
class NGram(Proposer):
    # a little under the shipped pair's acceptance on held-out code (greedy, K = 4: 0.52 at batch 8)
    prior_alpha: float = 0.45

    def start(self, m, cache, prompts, prompt_lens, first, carry, capacity):
        return start_history(prompts, prompt_lens, first, capacity)

    def propose(self, m: Models, s: DecodeState, sampler: Sampler, keys):
        """Any n-gram from 1 token up: a wrong copy costs only its slot in the verify forward."""
        drafts, _ = ngram.propose(s.draft, s.cache.length + 1, m.lookahead, 1, m.drafter.ngram_max)
        return drafts, point_mass(drafts, m.target_cfg.vocab_size, sampler), s.draft

    def update(self, m, s, history, seq, n_commit, features):
        return after_verify(history, s, seq, n_commit)

    def probes(self, m, kv, batch, capacity, context, k_max, dtype):
        return {"ngram": lookup_probe(m, batch, capacity, context, k_max)}

    def round_cost(self, costs, K):
        return costs.step("ngram")
