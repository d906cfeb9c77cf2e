"""The values a generate program carries: the models and their drafter (static settings included), the
loop's state, and the program's arguments."""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax

from jspec import struct
from jspec.cache.kvcache import KVCache, init_cache, window_view
from jspec.config import KVConfig, ModelConfig, Options
from jspec.decode import ngram, stops
from jspec.model import head
from jspec.model.decoder import Params, Scratch, forward, forward_taps
from jspec.model.head import HeadConfig, HeadParams
from jspec.model.sampling import Sampler

# A draft model's or head's window (Drafter.window): the shipped pair's acceptance at 2K-4K contexts with it
# (benchmarks/results/long_context_acceptance.json)
DRAFT_WINDOW = KVConfig("window", sink=64, recent=512)


class DraftMode(enum.StrEnum):
    """How a round's K drafts are proposed: one drafter function each (decode.drafters), traced into the program."""

    NONE = "none"  # plain decoding
    MODEL = "model"  # a small draft model over its own BF16 cache
    NGRAM = "ngram"  # prompt lookup over the prompt and the tokens emitted so far
    NGRAM_MODEL = "ngram+model"  # the copy where a row has a match of 2 tokens or more, the draft model elsewhere
    HEAD = "head"  # an EAGLE-3 head on the target's own hidden states
    # the target drafting for itself over its BF16 sink + recent window and the round's own rows (never the INT2
    # history); no weights of its own
    SELF = "self"
    NGRAM_SELF = "ngram+self"  # the copy where a row has a match of 2 tokens or more, the self-draft elsewhere

    @property
    def copies(self) -> bool:
        """Whether it copies from the token history (which the state then keeps)."""
        return self in (DraftMode.NGRAM, DraftMode.NGRAM_MODEL, DraftMode.NGRAM_SELF)

    @property
    def drafts_itself(self) -> bool:
        return self in (DraftMode.SELF, DraftMode.NGRAM_SELF)

    @property
    def uses_model(self) -> bool:
        return self in (DraftMode.MODEL, DraftMode.NGRAM_MODEL)


@struct.dataclass
class Drafter:
    """Whatever proposes the drafts, as one value: the mode and what it drafts with. The Engine holds it and
    every program receives it (Models.drafter)."""

    model: Params | None = None  # the draft model's weights (MODEL, NGRAM_MODEL)
    head: HeadParams | None = None  # the EAGLE-3 head (HEAD)
    mode: DraftMode = struct.field(pytree_node=False, default=DraftMode.NONE)
    model_cfg: ModelConfig | None = struct.field(pytree_node=False, default=None)
    head_cfg: HeadConfig | None = struct.field(pytree_node=False, default=None)
    ngram_max: int = struct.field(pytree_node=False, default=ngram.MAX_N)  # the longest n-gram looked up
    # The draft model's or the head's cache where a call's capacity exceeds this window: sink + recent only
    # (kvcache's "window" layout), so its memory and step cost stay flat with the context; None: always full BF16.
    window: KVConfig | None = struct.field(pytree_node=False, default=DRAFT_WINDOW)

    def at(self, K: int) -> Drafter:
        """The drafter of a call with lookahead K: none at K = 0 (plain decoding needs no draft at all)."""
        return self if K else Drafter()

    def cache_kv(self, capacity: int) -> KVConfig:
        """The KV layout of the draft model's or head's cache for a call of this capacity: the window where the
        capacity exceeds it, else full BF16."""
        w = self.window
        return w if w is not None and capacity > w.sink + w.recent else KVConfig("bf16")

    def init_cache(self, batch: int, capacity: int, dtype, K: int, stacked: bool = False) -> KVCache | None:
        """An empty cache for the draft model or the head (None for the other drafters), laid out by cache_kv."""
        cfg = self.head_cfg.layer if self.head is not None else self.model_cfg
        if cfg is None:
            return None
        return init_cache(cfg, self.cache_kv(capacity), batch, capacity, dtype, K, stacked)


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

    @property
    def draft(self) -> Params | None:
        return self.drafter.model

    @property
    def draft_cfg(self) -> ModelConfig | None:
        return self.drafter.model_cfg

    @property
    def head(self) -> HeadParams | None:
        return self.drafter.head

    @property
    def head_cfg(self) -> HeadConfig | None:
        return self.drafter.head_cfg

    @property
    def draft_mode(self) -> DraftMode:
        return self.drafter.mode

    @property
    def ngram(self) -> bool:
        """Whether the drafter copies from the history (and the state keeps one)."""
        return self.lookahead > 0 and self.drafter.mode.copies

    def without_draft_model(self) -> Models:
        return self.replace(drafter=self.drafter.replace(model=None))

    def target_forward(self, tokens, cache):
        return forward(self.target, self.target_cfg, tokens, cache, attn_impl=self.attn_impl, options=self.options)

    def draft_forward(self, tokens, cache):
        return forward(self.draft, self.draft_cfg, tokens, cache, options=self.options)

    def self_forward(self, tokens, cache, scratch: Scratch):
        """A self-draft step (tokens [B, 1]): the target over the window of its cache and the round's scratch
        rows, never its INT2 history; the cache is read, never committed to."""
        return forward(self.target, self.target_cfg, tokens, window_view(cache), options=self.options, scratch=scratch)

    def target_features(self, tokens, cache):
        """target_forward, and the head's fused features [B, n, E] at the same positions."""
        logits, kv, tapped = forward_taps(self.target, self.target_cfg, tokens, cache, self.head_cfg.taps,
                                          attn_impl=self.attn_impl, options=self.options)
        return logits, kv, head.fuse(self.head, tapped)

    def head_hidden(self, tokens, feats, cache):
        """The head's pre-norm outputs [B, n, E] (its LM head is left to draw_head) and new rows."""
        return head.hidden(self.head, self.head_cfg, self.target.embed, tokens, feats, cache)


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
    stop: stops.StopState | None = None  # stop strings only (decode.stops): their bytes and each row's tail



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
    stops: stops.Stops | None = None  # stop strings (decode.stops); None: no stop strings, the program without them
