"""The values a generate program carries: the models and their drafter (static settings included), the
loop's state, and the program's arguments."""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax

from jspec import struct
from jspec.cache.kvcache import KVCache
from jspec.config import KVConfig, ModelConfig, Options
from jspec.decode import fallback, ngram, stops
from jspec.model.decoder import Params, forward
from jspec.model.head import HeadConfig, HeadParams
from jspec.model.sampling import Sampler

# A draft model's or head's window (Drafter.window): the shipped pair's acceptance at 2K-4K contexts with it
# (benchmarks/results/long_context_acceptance.json)
DRAFT_WINDOW = KVConfig("window", sink=64, recent=512)


class DraftMode(enum.StrEnum):
    """The built-in drafters' names (decode.drafters: one module each); a drafter registered from outside the
    package has a name of its own (Drafter.mode is any registered name)."""

    NONE = "none"  # plain decoding
    MODEL = "model"  # a small draft model over its own BF16 cache
    NGRAM = "ngram"  # prompt lookup over the prompt and the tokens emitted so far
    NGRAM_MODEL = "ngram+model"  # the copy where a row has a match of 2 tokens or more, the draft model elsewhere
    HEAD = "head"  # an EAGLE-3 head on the target's own hidden states
    # the target drafting for itself over its BF16 sink + recent window and the round's own rows (never the INT2
    # history); no weights of its own
    SELF = "self"
    NGRAM_SELF = "ngram+self"  # the copy where a row has a match of 2 tokens or more, the self-draft elsewhere
    SELF_SKIP = "self-skip"  # the target's first Drafter.layers layers, its norm and head, over the self-draft's view


@struct.dataclass
class Drafter:
    """Whatever proposes the drafts, as one value: its name (decode.drafters.registry) and what it drafts with.
    The Engine holds it and every program receives it (Models.drafter)."""

    model: Params | None = None  # the draft model's weights (model, ngram+model)
    head: HeadParams | None = None  # the EAGLE-3 head (head)
    mode: str = struct.field(pytree_node=False, default=DraftMode.NONE)
    model_cfg: ModelConfig | None = struct.field(pytree_node=False, default=None)
    head_cfg: HeadConfig | None = struct.field(pytree_node=False, default=None)
    ngram_max: int = struct.field(pytree_node=False, default=ngram.MAX_N)  # the longest n-gram looked up
    # The draft model's or the head's cache where a call's capacity exceeds this window: sink + recent only
    # (kvcache's "window" layout), so its memory and step cost stay flat with the context; None: always full BF16.
    window: KVConfig | None = struct.field(pytree_node=False, default=DRAFT_WINDOW)
    # self-skip: how many of the target's first layers draft (None: drafters.self_skip.DEFAULT_FRACTION of them)
    layers: int | None = struct.field(pytree_node=False, default=None)

    def at(self, K: int) -> Drafter:
        """The drafter of a call with lookahead K: none at K = 0 (plain decoding needs no draft at all)."""
        return self if K else Drafter()

    def cache_kv(self, capacity: int) -> KVConfig:
        """The KV layout of a drafter's own cache for a call of this capacity: the window where the capacity
        exceeds it, else full BF16."""
        w = self.window
        return w if w is not None and capacity > w.sink + w.recent else KVConfig("bf16")


@struct.dataclass
class Models:
    """A program's models and how it runs them: the target, its drafter, K, the attention path and the build
    options (every field but the weights is static: part of the program's key)."""

    target: Params
    drafter: Drafter
    target_cfg: ModelConfig = struct.field(pytree_node=False)
    lookahead: int = struct.field(pytree_node=False)  # K; 0: plain decoding
    attn_impl: str = struct.field(pytree_node=False, default="reference")
    options: Options = struct.field(pytree_node=False, default=Options())
    # [] float32: the tokens per row a drafting round must emit to pay for itself (decode.fallback: rounds that no
    # row would draft in run as plain steps); None: every round drafts K
    fallback: jax.Array | None = None

    def target_forward(self, tokens, cache):
        return forward(self.target, self.target_cfg, tokens, cache, attn_impl=self.attn_impl, options=self.options)


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
    # the drafter's own state between rounds, opaque here (decode.drafters: a cache, a token history, a feed, or
    # None); row b of every array in it is row b's
    draft: object = None
    stop: stops.StopState | None = None  # stop strings only (decode.stops): their bytes and each row's tail
    rows: fallback.RowDrafts | None = None  # with Models.fallback: what each row's drafting rounds emit


class ProgramArgs(NamedTuple):
    """The arguments of generate_program (and start_program), in order."""

    models: Models
    prompts: jax.Array  # [B, P] int32, right-padded
    prompt_lens: jax.Array  # [B] int32
    max_new: jax.Array  # [B] int32
    sampler: Sampler
    seeds: jax.Array  # [B] uint32
    cache: KVCache  # donated
    draft_cache: KVCache | None  # donated: the drafter's own (decode.drafters.init_cache)
    eos_ids: jax.Array  # [E] int32: a row stops at the first of these it emits
    stops: stops.Stops | None = None  # stop strings (decode.stops); None: no stop strings, the program without them
    allowed: jax.Array | None = None  # [B, V] bool the first token's choices (decode.healing); None: any token

    def kv_bytes(self) -> int:
        """The KV storage of the call: the target's cache and the drafter's."""
        return self.cache.nbytes() + (0 if self.draft_cache is None else self.draft_cache.nbytes())
