"""The `ngram+X` combinator: the n-gram copy where a row has a match of 2 tokens or more, drafter X's tokens
elsewhere; X's drafting (past what it must do every round: Proposer.resynced) is skipped when every row still
running has a match. Its state is the token history and X's own."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec import struct
from jspec.decode import ngram
from jspec.decode.drafters import ngram as copy
from jspec.decode.drafters.base import Proposer, point_mass
from jspec.decode.state import DecodeState, Models
from jspec.model.sampling import Sampler


@struct.dataclass
class CopyState:
    history: jax.Array  # [B, T] (drafters.ngram)
    inner: object  # X's state


@dataclasses.dataclass(frozen=True)
class Combined(Proposer):
    inner: Proposer = Proposer()

    def init_cache(self, d, batch, capacity, dtype, K):
        return self.inner.init_cache(d, batch, capacity, dtype, K)

    def forward(self, m, tokens, cache):
        return self.inner.forward(m, tokens, cache)

    def prefill_carry(self, m, batch):
        return self.inner.prefill_carry(m, batch)

    def prefill_chunk(self, m, cache, chunk, features, carry):
        return self.inner.prefill_chunk(m, cache, chunk, features, carry)

    def split_prefill(self, m):
        return self.inner.split_prefill(m)

    def prefill_alone(self, m, prompts, prompt_lens, cache):
        return self.inner.prefill_alone(m, prompts, prompt_lens, cache)

    def without_prefill(self, m):
        return self.inner.without_prefill(m)

    def start(self, m, cache, prompts, prompt_lens, first, carry, capacity):
        return CopyState(copy.start_history(prompts, prompt_lens, first, capacity),
                         self.inner.start(m, cache, prompts, prompt_lens, first, carry, capacity))

    def cache_of(self, state):
        return self.inner.cache_of(state.inner)

    def propose(self, m: Models, s: DecodeState, sampler: Sampler, keys):
        st = s.draft
        inner, rest = self.inner.resynced(m, s, st.inner, st.history, sampler, keys)
        copied, found = ngram.propose(st.history, s.cache.length + 1, m.lookahead, 2, m.drafter.ngram_max)
        V = m.target_cfg.vocab_size
        skip = lambda: (copied, None if sampler.greedy else jnp.zeros((*copied.shape, V), jnp.float32), inner)
        drafted, q, inner = jax.lax.cond((found | s.done).all(), skip, rest)
        drafts = jnp.where(found[:, None], copied, drafted)
        if q is not None:
            q = jnp.where(found[:, None, None], point_mass(copied, V, sampler), q)
        return drafts, q, st.replace(inner=inner)

    def update(self, m, s, state, seq, n_commit, features):
        return self._after(self.inner.update, m, s, state, seq, n_commit, features)

    def idle(self, m, s, state, seq, n_commit, features):
        return self._after(self.inner.idle, m, s, state, seq, n_commit, features)

    @staticmethod
    def _after(inner_step, m, s, state, seq, n_commit, features):
        """The history gains the round's tokens; X's state is what inner_step (its update or idle) makes of it."""
        inner = inner_step(m, s.replace(draft=state.inner), state.inner, seq, n_commit, features)
        return CopyState(copy.after_verify(state.history, s, seq, n_commit), inner)

    def probes(self, m, kv, batch, capacity, context, k_max, dtype):
        return {**self.inner.probes(m, kv, batch, capacity, context, k_max, dtype),
                "ngram": copy.lookup_probe(m, batch, capacity, context, k_max)}

    def round_cost(self, costs, K):
        """X's drafting as if it ran every round (it skips its steps when every row matches: an upper bound) and
        the lookup."""
        return self.inner.round_cost(costs, K) + costs.step("ngram")
