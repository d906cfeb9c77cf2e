"""The layer-skipping self-draft ("self-skip"): the target's first N layers, then its final norm and LM head (an
early exit, as LayerSkip drafts; untrained here), over the BF16 window of its own cache and a round's scratch, as
the self-draft (self_draft.py) reads them. Each draft step reads N / L of the target's layer weights, which is what
a step costs at small batch; the verify runs every layer, so the output is the target's whatever N.
N is Drafter.layers (None: DEFAULT_FRACTION of the target's layers)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jspec.cache import kvcache, scratch
from jspec.config import ConfigError, ModelConfig
from jspec.decode.drafters.base import Probe, Proposer, at_context, key_at, layer_key, rollout
from jspec.decode.drafters.self_draft import self_token
from jspec.decode.state import Drafter, DecodeState, Models
from jspec.model.sampling import Sampler

# The shipped target (8 layers) over its window, float32, greedy, K = 4, 3 prompts at 1K: per-draft alpha 0.63 on
# code and 0.50 on prose with its first 6 layers, 0.68 / 0.62 with 7, 0.26 / 0.17 with 4 (self: 0.87 / 0.83;
# benchmarks/results/self_skip.json): under 3/4 of the layers an untrained early exit drafts too poorly to pay.
DEFAULT_FRACTION = 0.75


def draft_layers(d: Drafter, cfg: ModelConfig) -> int:
    """N: how many of the target's first layers draft."""
    n = d.layers if d.layers is not None else math.ceil(DEFAULT_FRACTION * cfg.num_layers)
    return min(max(1, n), cfg.num_layers)  # (load refuses an N past the target's layers: check_layers)


def check_layers(n, cfg: ModelConfig) -> None:
    """ConfigError unless n is None or a layer count of this target (1..L)."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cfg.num_layers):
        raise ConfigError(f"draft layers must be in [1, {cfg.num_layers}] (the target's layers), got {n!r}")


def first_layers(tree, n: int):
    """The first n layers of [L, ...] stacks."""
    return jax.tree.map(lambda x: x[:n], tree)


def skipped(m: Models, cache):
    """(m with its target cut to the first N layers, the cache's first N layers): what a self-skip step runs."""
    n = draft_layers(m.drafter, m.target_cfg)
    target = m.target.replace(layers=first_layers(m.target.layers, n))
    return m.replace(target=target), cache.replace(layers=first_layers(cache.layers, n))


def new_scratch(m: Models, cache) -> scratch.Scratch:
    """An empty scratch for the cut cache (skipped's): K rows per drafting layer."""
    return scratch.new_scratch(cache, draft_layers(m.drafter, m.target_cfg), m.lookahead)


@dataclasses.dataclass(frozen=True)
class SelfSkip(Proposer):
    # the default N on the shipped target: alpha 0.50-0.63 (above), taken under for so few tokens
    prior_alpha: float = 0.45

    def propose(self, m: Models, s: DecodeState, sampler: Sampler, keys):
        """As the self-draft's, with the cut target over the cut cache."""
        mm, cache = skipped(m, s.cache)
        step = lambda sc, d, aux, k: (*self_token(mm, cache, sc, d, k, sampler), None)
        sc, d, q, _ = step(new_scratch(m, cache), s.next, None, key_at(keys, 0))
        drafts, qs, _ = rollout(m, sc, d, q, step, None, keys)
        return drafts, qs, s.draft

    def probes(self, m, kv, batch, capacity, context, k_max, dtype):
        """One self-skip token over a target cache of this capacity (read through its window: flat with the
        context) and a round's scratch, its row put back."""
        greedy = Sampler.make(batch)

        def step(m, carry):
            tok, sc, cache = carry
            mm, cut = skipped(m, cache)
            sc, t, _ = self_token(mm, cut, sc, tok, None, greedy)
            return t, sc.replace(at=jnp.minimum(sc.at, m.lookahead - 1)), cache

        def make(place):
            cache = kvcache.init_cache(m.target_cfg, kv, batch, capacity, dtype, m.lookahead)
            cache = place.cache(at_context(cache, context), True)
            return place.batch(jnp.zeros((batch,), jnp.int32)), new_scratch(m, skipped(m, cache)[1]), cache

        what = dict(model=m.target_cfg, kv=kv, K=k_max, layers=draft_layers(m.drafter, m.target_cfg),
                    **layer_key(m.options))
        return {"self_skip": Probe(what, m, step, make)}

    def round_cost(self, costs, K):
        return K * costs.step("self_skip")
