"""The library entry points: load a target (and draft) from local directories, generate text.

    import jspec
    engine = jspec.load()                      # the shipped pair in checkpoints/
    [result] = engine.generate(["def fibonacci(n):"], jspec.GenerateConfig(max_new_tokens=64))
    print(result.text, result.stats)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import os
import threading
import time
import typing
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jspec import files
from jspec.cache import kvcache
from jspec.config import (ATTENTION_IMPLS, EMPTY_PROMPT, MAX_LOOKAHEAD, ConfigError, GenerateConfig, KVConfig,
                          DraftSpec, ModelConfig, Options, OutOfMemory, SamplingConfig, check_stops,
                          default_platform, stop_tuple)
from jspec.decode import drafters, fallback, healing, loop as decode, stops
from jspec.decode.drafters import self_skip
from jspec.decode.state import DRAFT_WINDOW, Drafter, DraftMode, Models, ProgramArgs
from jspec.io import chat, checkpoint, eagle3, memory
from jspec.model import rotation
from jspec.model.decoder import Params, compile_options
from jspec.model.sampling import Sampler
from jspec.paths import CHECKPOINTS
from jspec.runtime import learned, lookahead, programs, sharding
from jspec.runtime.buckets import capacity_bucket, pad_rows
from jspec.runtime.parts import back_to_back, lower_parts, part_names

DEFAULT_TARGET = CHECKPOINTS / "code-target"
DEFAULT_DRAFT = CHECKPOINTS / "code-draft"
ROTATION_FILE = "rotations.safetensors"
# One INFO line per phase (load, rotations, compile or cache hit, decode), silent unless the application turns the
# "jspec" logger on (the CLI's -v).
log = logging.getLogger("jspec")


@dataclasses.dataclass(frozen=True)
class Stats:
    """What one row of a generate call did, and the call it ran in."""

    new_tokens: int
    rounds: int  # speculative rounds (decode steps when lookahead is 0)
    accepted: int  # draft tokens accepted and emitted (drafts past max_new_tokens, EOS or a stop are not counted)
    accept_length: float  # tokens the rounds emitted per round, the bonus token included: (new_tokens - 1) / rounds,
    # which is 1 + accepted / rounds, less 1 / rounds where the last round was cut before its bonus token
    accept_rate: float  # accepted / proposed drafts (K per drafting round)
    lookahead: int  # K, the drafts per round
    draft_mode: str
    kv_mode: str
    batch_kv_bytes: int  # KV storage allocated for the whole batch the row ran in, target and draft
    bf16_kv_bytes: int  # batch_kv_bytes with the target's cache in BF16: the INT2 cache pays where it is smaller
    compile_s: float  # building the call's program (0 when this process built it before; compile_cached below)
    decode_s: float  # the call's device time, for the whole batch
    batch_tokens_per_s: float
    lookahead_auto: dict | None = None  # with lookahead "auto": the K chosen and why (lookahead.Choice.stats)
    finish_reason: str = "length"  # "stop" (EOS or a stop string) or "length" (max_new_tokens)
    # with draft "auto": the drafter and K chosen, tokens per round, accept rate and every priced candidate
    speculation: dict | None = None
    healed: str = ""  # the prompt's text token healing moved into the first token (decode.healing); "": none
    # True: compile_s went to tracing the program and reading it back from a compilation cache, not to compiling it
    compile_cached: bool = False
    # rounds in which the row drafted: fewer than `rounds` where a K the engine chose let rows whose drafts stopped
    # paying run plain steps (decode.fallback); equal to rounds otherwise (0 at lookahead 0)
    drafted_rounds: int = 0

    @classmethod
    def of(cls, new_tokens: int, rounds: int, accepted: int, lookahead: int, batch_tokens: int, decode_s: float,
           drafted: int | None = None, **call) -> Stats:
        """A row's stats from its counts (the rates derived here, for every caller alike); batch_tokens: what the
        batch emitted in decode_s; drafted: its drafting rounds (None: every round); call: the remaining fields,
        the call's."""
        drafted = (rounds if drafted is None else drafted) if lookahead else 0
        return cls(new_tokens=new_tokens, rounds=rounds, accepted=accepted, drafted_rounds=drafted,
                   accept_length=(new_tokens - 1) / rounds if rounds else 0.0,
                   accept_rate=accepted / (lookahead * drafted) if drafted else 0.0,
                   lookahead=lookahead, decode_s=round(decode_s, 4),
                   batch_tokens_per_s=round(batch_tokens / decode_s, 1) if decode_s > 0 else 0.0, **call)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name in ("lookahead_auto", "speculation", "healed"):  # None / "": not set
            if not d[name]:
                del d[name]
        return d


@dataclasses.dataclass(frozen=True)
class Result:
    prompt: str | list[int]
    text: str
    token_ids: list[int]
    stats: Stats


@dataclasses.dataclass
class Engine:
    """A loaded target and its drafter (decode.state.Drafter: a draft model, n-gram lookup, both, or an EAGLE-3
    head) plus the KV configuration they decode with and the options their programs are built with.

    jspec.load builds one from model directories; tests build one from params by keyword.

    Threads: one Engine may serve several threads at once. Each call builds its own caches and runs its own program;
    what calls share and build on first use (the stop-string byte tables, compiled programs, acceptance counts) is
    built and updated under the engine's lock, so the first calls of several threads neither race nor build twice.
    """

    cfg: ModelConfig
    params: Params
    tokenizer: object
    kv: KVConfig
    drafter: Drafter = Drafter()
    # draft "auto": the drafters it chooses from per call (drafter is then Drafter(mode="auto"), never run)
    candidates: tuple[Drafter, ...] = ()
    dtype: str = "bfloat16"
    attn_impl: str = "reference"
    mesh: jax.sharding.Mesh | None = None  # ("dp", "tp"): see jspec.runtime.sharding
    options: Options = Options()
    chat_template: str | None = None  # the model's chat template (jspec.io.chat.template_of), for chat requests
    source: str = ""  # what load read (model, draft and rotation paths): a job's output records it (jobs.batch)
    # draft "auto": the file its learned estimates are kept in across processes (recall, _learn); None: memory only
    store: learned.Store | None = None
    # Told each slow phase as it starts (measuring lookahead costs, compiling a program): the CLI prints it on
    # stderr; the library stays quiet unless given one.
    say: typing.Callable[[str], None] | None = dataclasses.field(default=None, repr=False)
    _compiled: dict = dataclasses.field(default_factory=dict, repr=False)
    _costs: dict = dataclasses.field(default_factory=dict, repr=False)  # measured costs (lookahead.measure)
    _seen: dict = dataclasses.field(default_factory=dict, repr=False)  # (draft mode, batch bucket) -> acceptance
    _bench: dict = dataclasses.field(default_factory=dict, repr=False)  # (draft mode, batch bucket) -> lookahead.Bench
    _calls: dict = dataclasses.field(default_factory=dict, repr=False)  # batch bucket -> calls observed
    # (draft mode, batch bucket) -> (drafts, Bench or None) read from the store by recall: earlier processes' share
    _recalled: dict = dataclasses.field(default_factory=dict, repr=False)
    _token_bytes: list = dataclasses.field(default_factory=list, repr=False)  # [stops.token_bytes'] once built
    _lock: threading.RLock = dataclasses.field(default_factory=threading.RLock, repr=False, compare=False)
    _past_vocabulary: list = dataclasses.field(default_factory=list, repr=False)  # [tokens_past_vocabulary's]
    # seconds this engine spent building programs: compiling them, and tracing and reading them back from a cache
    built: dict = dataclasses.field(default_factory=lambda: {"compile_s": 0.0, "cache_s": 0.0}, repr=False)

    @property
    def xla_options(self) -> dict | None:
        """XLA's compiler options for this engine's programs (model.compile_options: stacked layers)."""
        return compile_options()

    @property
    def draft_mode(self) -> str:
        return self.drafter.mode

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """text's token ids (add_special_tokens=False: none added, for text a chat template rendered). ConfigError
        for text that is not valid Unicode (a lone surrogate: from JSON's \\ud800, or a command line argument
        that was not UTF-8), which the tokenizer cannot encode."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConfigError(f"the prompt is not valid Unicode: a lone surrogate {text[e.start]!r} at character "
                              f"{e.start} (text given as bytes that are not UTF-8?)") from None
        if add_special_tokens:
            return list(self.tokenizer.encode(text))
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, prompt) -> list[int]:
        """The token ids of one prompt (a string or a sequence of ids); ConfigError for anything else, an
        empty prompt (in the CLI, jobs and library alike) or an id outside the vocabulary."""
        if isinstance(prompt, str):
            ids = self.encode(prompt) if prompt else []
        elif isinstance(prompt, (bytes, bytearray)):
            raise ConfigError("a prompt must be a str or a list of token ids, not bytes: decode it first")
        else:
            try:
                ids = list(prompt)
            except TypeError:
                raise ConfigError(f"a prompt must be a str or a list of token ids, not {type(prompt).__name__}") \
                    from None
        if isinstance(prompt, str):  # its ids past the embedding (a tokenizer may have such tokens), by name
            self._check_vocabulary([ids], [()])
        bad = [x for x in ids if isinstance(x, bool) or not isinstance(x, numbers.Integral)
               or not 0 <= x < self.cfg.vocab_size]
        if bad:
            raise ConfigError(f"token ids must be integers in [0, {self.cfg.vocab_size}), got {bad[0]!r}")
        ids = [int(x) for x in ids]
        if not ids:
            raise ConfigError(EMPTY_PROMPT)
        return ids

    def generate(self, prompts, gen: GenerateConfig = GenerateConfig(),
                 sampling: SamplingConfig | list[SamplingConfig] = SamplingConfig(),
                 max_new_tokens: list[int] | None = None) -> list[Result]:
        """Generates for a batch of prompts (strings or token id lists) in one compiled program.

        sampling may be one config for all rows or one per row; max_new_tokens optionally per row.
        """
        if isinstance(prompts, (str, bytes)):
            raise ConfigError("prompts must be a list of prompts: for one prompt, pass [prompt]")
        prompts = list(prompts)
        gen.validate()
        ids = [self.prompt_ids(p) for p in prompts]
        rows = _per_row("sampling", sampling, len(ids))
        max_new = _per_row("max_new_tokens", gen.max_new_tokens if max_new_tokens is None else max_new_tokens,
                           len(ids))
        for s, m in zip(rows, max_new):
            if not isinstance(s, SamplingConfig):
                raise ConfigError(f"sampling must be a SamplingConfig or a list of them, got {type(s).__name__}")
            s.validate()
            dataclasses.replace(gen, max_new_tokens=m).validate()
        max_new = [int(m) for m in max_new]
        if not ids:
            return []
        out = self.generate_ids(ids, rows, max_new, gen)
        return [Result(p, self.text(t, gen.stop, st.healed), t, st) for p, (t, st) in zip(prompts, out)]

    def text(self, token_ids: list[int], stop: tuple[str, ...] = (), healed: str = "") -> str:
        """The text of generated tokens, special tokens skipped, cut right before the first stop string
        (stops.truncate); healed (Stats.healed): the prompt's text the first token repeats, taken off."""
        text = stops.truncate(self.tokenizer.decode(token_ids, skip_special_tokens=True), stop)[0]
        return healing.unheal(text, healed)

    def heal(self, ids: list[list[int]], stop: list[tuple[str, ...]], gen: GenerateConfig) -> healing.Healed:
        """The prompts token-healed where gen.heal asks (decode.healing.heal), else as given."""
        if not gen.heal:
            return healing.Healed(ids, [""] * len(ids), None)
        return healing.heal(self.token_bytes(), ids, stop)

    def token_bytes(self) -> stops.TokenBytes | None:
        """The tokenizer's byte table for stop strings, built on first use (stops.token_bytes); None where its
        decode is not concatenative: stop strings are then found on the host."""
        with self._lock:
            if not self._token_bytes:
                self._token_bytes.append(stops.token_bytes(self.tokenizer, self.cfg.vocab_size))
            return self._token_bytes[0]

    def chat(self, messages: list[dict], gen: GenerateConfig = GenerateConfig(),
             sampling: SamplingConfig = SamplingConfig()) -> Result:
        """Generates the assistant's reply to a conversation ([{"role", "content"}, ...]) rendered with the
        model's chat template. The rendered text holds the template's special tokens (its BOS included), so
        it is tokenized without adding any, as transformers' apply_chat_template(tokenize=True) does."""
        if self.chat_template is None:
            raise ConfigError("this model has no chat template (tokenizer_config.json, chat_template.jinja or "
                              "GGUF metadata)")
        text = chat.render(self.chat_template, messages, **chat.special_tokens(self.tokenizer))
        ids = self.encode(text, add_special_tokens=False)  # the template's own ending, not healed
        [result] = self.generate([ids], dataclasses.replace(gen, heal=False), sampling)
        return dataclasses.replace(result, prompt=text)

    def lookahead(self, gen: GenerateConfig) -> int:
        """The lookahead a request must leave room for in the context: gen's K when there is a drafter;
        0 without one, and for "auto", which fits K into the room the request leaves."""
        return gen.lookahead if self.draft_mode != DraftMode.NONE and gen.lookahead != "auto" else 0

    def room(self, gen: GenerateConfig) -> int:
        """Prompt + new tokens one row may hold: the context (a sliding window's included) less the
        lookahead and the bonus token. Bucket padding is not counted: capacity caps it to the context."""
        return self.cfg.context - self.lookahead(gen) - 1

    def capacity(self, gen: GenerateConfig, lengths: list[int], max_new: list[int]) -> int:
        """The cache capacity of a batch (check says whether it fits): the bucket of its most demanding row, prompt +
        new tokens + lookahead + 1 (capacity_bucket). It fixes the program's shapes with the batch size."""
        need = max(n + m for n, m in zip(lengths, max_new))
        return capacity_bucket(need + self.lookahead(gen) + 1, self.cfg.context)

    def check(self, gen: GenerateConfig, lengths: list[int] = (), max_new: list[int] | None = None) -> None:
        """Raises ConfigError when a request does not fit, saying why: gen itself, the KV windows with
        its lookahead, and the prompts of `lengths` tokens with their max_new (default gen's) new tokens
        as one batch in the model's context. The CLI, batch jobs and generate all ask here."""
        gen.validate()
        K, context = self.lookahead(gen), self.cfg.context
        self.kv.validate(self.cfg.head_dim, K)
        if self.kv.int2 and self.kv.sink + self.kv.recent > context:
            raise ConfigError(f"sink {self.kv.sink} + recent {self.kv.recent} exceed the model's context of "
                              f"{context} tokens")
        if any(n == 0 for n in lengths):
            raise ConfigError(EMPTY_PROMPT)
        if lengths:  # each row on its own: the cache holds the most demanding row (capacity)
            max_new = max_new or [gen.max_new_tokens] * len(lengths)
            need, n, m = max((n + m, n, m) for n, m in zip(lengths, max_new))
            if need > self.room(gen):
                raise ConfigError(f"prompt of {n} tokens + {m} new tokens + lookahead {K} + 1 exceeds the "
                                  f"model's context of {context} tokens")

    def _check_vocabulary(self, ids: list[list[int]], stop: list[tuple[str, ...]]) -> None:
        """ConfigError naming the token where a prompt (its BOS included) holds an id at or past vocab_size, or a
        stop string is a token the tokenizer numbers there: the tokenizer may have such ids (an added token past
        the embedding: such models load), the model has no row for them and never generates them."""
        if not self._past_vocabulary:
            self._past_vocabulary.append(checkpoint.tokens_past_vocabulary(self.tokenizer, self.cfg.vocab_size))
        past = self._past_vocabulary[0]
        V, name = self.cfg.vocab_size, {i: t for t, i in past.items()}
        for row in ids:
            bad = next((i for i in row if i >= V), None)
            if bad is not None:
                raise ConfigError(f"the prompt holds token {name.get(bad, '?')!r} (id {bad}), past the model's "
                                  f"vocabulary (vocab_size {V}): the model has no embedding row for it")
        for s in (s for row in stop for s in row if s in past):
            raise ConfigError(f"stop string {s!r} is token id {past[s]}, past the model's vocabulary (vocab_size "
                              f"{V}): the model can never generate it")

    def generate_ids(self, ids: list[list[int]], rows: list[SamplingConfig], max_new: list[int],
                     gen: GenerateConfig, stop: list[tuple[str, ...]] | None = None):
        """Token-level generate: returns [(token_ids, stats)] per row. stop: each row's stop strings (default
        gen.stop for every row); a row's token ids then run through the token that completes its first stop
        string (Engine.text cuts the text before it), and stats.finish_reason is "stop" (EOS or a stop
        string) or "length"."""
        stop = _per_row_stops(gen, stop, len(ids))
        self._check_vocabulary(ids, stop)
        healed = self.heal(ids, stop, gen)
        ids = healed.ids
        gen, choice = self.plan(gen, [len(x) for x in ids], max_new)
        return self.using(choice)._run(ids, rows, max_new, gen, stop, choice, healed)

    def _run(self, ids, rows, max_new, gen: GenerateConfig, stop, choice, healed):
        """generate_ids' call once planned (healed: heal's)."""
        args = self.prepare(ids, rows, max_new, gen, stop, allowed=healed.allowed, choice=choice)
        kv_bytes = self.kv_bytes(args)
        program, compile_s, cached = self.build(args)
        t0 = time.perf_counter()
        try:
            state = jax.block_until_ready(program(*args))  # the caches are donated: gone after this call
        except jax.errors.JaxRuntimeError as e:  # the estimate (check_cache_memory) missed XLA's own buffers
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            raise OutOfMemory(f"a batch of {len(ids)} rows ran out of device memory: fewer rows (--batch-size) or "
                              "fewer tokens") from None
        decode_s = time.perf_counter() - t0
        log.info("decoded %d tokens in %.2f s", int(np.asarray(state.count).sum()), decode_s)
        K, key = args.models.lookahead, (self.draft_mode, lookahead.batch_bucket(len(ids)))
        rounds, count = fallback.drafting_counts(state)
        rounds, count = rounds[: len(ids)], count[: len(ids)]
        with self._lock:
            self._seen[key] = lookahead.observe_batch(self._seen.get(key, (0, 0)), K, rounds, count)
            self._learn(key, K, lookahead.last_alpha(K, rounds, count), choice)
        out = self._results(state, K, choice, compile_s, decode_s, kv_bytes)[: len(ids)]  # dummy rows dropped
        return [self.finish(t, dataclasses.replace(st, healed=h, compile_cached=cached), s, gen)
                for (t, st), s, h in zip(out, stop, healed.removed)]

    def observe(self, K: int, batch: int, rounds: int, accepted: int, choice=None) -> None:
        """Learns from rows that ran `rounds` rounds with `accepted` drafts accepted in all, in a batch of this
        size: the acceptance estimate the lookahead choice reads (plan); choice: what planned them (plan's)."""
        key = (self.draft_mode, lookahead.batch_bucket(batch))
        with self._lock:
            self._seen[key] = lookahead.observe(self._seen.get(key, (0, 0)), K, rounds, accepted)
            self._learn(key, K, lookahead.alpha_from_accepted(accepted / rounds, K) if K and rounds else None, choice)

    def _learn(self, key, K: int, alpha: float | None, choice) -> None:
        """Keeps a draft "auto" call's own acceptance for its fallback and probes (lookahead.after_call, read by
        auto_alpha), counts the call in its batch bucket and writes what was learnt to the store. Under the lock."""
        calls = self._calls.get(key[1], 0)
        if alpha is not None and choice is not None and choice.priced:
            self._bench[key] = lookahead.after_call(self._bench.get(key), choice.costs, key[0], K, alpha, calls)
        self._calls[key[1]] = calls + 1
        if self.store is not None:
            self.store.write(self._seen, self._bench, self._calls)

    def recall(self) -> None:
        """Continues from what earlier processes learnt: the store's estimates, benches and call counts in place of
        this engine's (load calls it once; nothing without a store)."""
        if self.store is None:
            return
        seen, bench, calls = self.store.read()
        with self._lock:
            self._seen.update(seen)
            self._bench.update(bench)
            self._calls.update(calls)
            self._recalled.update({k: (seen.get(k, (0, 0))[0], bench.get(k)) for k in seen.keys() | bench.keys()})

    def _told(self, key, source: str) -> str:
        """auto_alpha's source for (mode, bucket) `key`, saying what of it was read from the store (recall)."""
        drafts, bench = self._recalled.get(key, (0, None))
        if source == "last call" and bench is not None and self._bench.get(key) is bench:
            return "last call (read from disk)"
        return f"{source} ({int(drafts)} read from disk)" if drafts and source.endswith("drafts measured") else source

    def program(self, name: str, jitted, *args):
        """(jitted compiled for these arguments' shapes, compile seconds): kept in the engine's program cache under
        name, compiled on first use (0.0 seconds after), with the engine's XLA options."""
        key = (name, jax.tree.structure(args), tuple((x.shape, x.dtype) for x in jax.tree.leaves(args)))
        if key in self._compiled:
            return self._compiled[key], 0.0
        build = lambda: programs.compiled(jitted, *args, options=self.xla_options)
        self._compiled[key], seconds, _ = self._timed(build)
        return self._compiled[key], seconds

    def _timed(self, build):
        """(build(), its seconds, whether every program it built was read back from a compilation cache), the
        seconds counted in self.built."""
        t0, (asked, hits) = time.perf_counter(), programs.cache_counts()
        out = build()
        seconds = time.perf_counter() - t0
        asked, hits = (n - m for n, m in zip(programs.cache_counts(), (asked, hits)))
        cached = asked > 0 and hits == asked
        self.built["cache_s" if cached else "compile_s"] += seconds
        return out, seconds, cached

    def kv_bytes(self, args: ProgramArgs) -> tuple[int, int]:
        """(the KV storage of a call, the same with the target's cache in BF16): shapes only, nothing allocated."""
        B, N, K = args.prompts.shape[0], args.cache.capacity, args.models.lookahead
        bf16 = jax.eval_shape(lambda: kvcache.init_cache(self.cfg, KVConfig("bf16"), B, N, jnp.dtype(self.dtype), K))
        draft = 0 if args.draft_cache is None else args.draft_cache.nbytes()
        return args.kv_bytes(), sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(bf16.layers)) + draft

    def row_stats(self, new_tokens: int, rounds: int, accepted: int, K: int, *, kv_bytes: tuple[int, int],
                  compile_s: float, decode_s: float, batch_tokens: int, choice=None, drafted=None) -> Stats:
        """Stats.of for a row of this engine's calls (its drafter and KV mode); kv_bytes: Engine.kv_bytes'."""
        st = Stats.of(new_tokens, rounds, accepted, K, batch_tokens, decode_s, drafted,
                      draft_mode=str(self.draft_mode),
                      kv_mode=self.kv.mode, batch_kv_bytes=int(kv_bytes[0]), bf16_kv_bytes=int(kv_bytes[1]),
                      compile_s=round(compile_s, 3), lookahead_auto=None if choice is None else choice.stats())
        if choice is None or not choice.priced:
            return st
        return dataclasses.replace(st, speculation=dict(
            drafter=str(self.draft_mode), K=K, tokens_per_round=round(st.accept_length, 3),
            accept_rate=round(st.accept_rate, 3), drafted_rounds=st.drafted_rounds,
            why=dict(winner=choice.mode, candidates=[p.stats() for p in choice.priced])))

    def finish(self, tokens: list[int], stats: Stats, stop: tuple[str, ...], gen: GenerateConfig):
        """(tokens, stats with finish_reason): "stop" where the text holds a stop string or the row ended at EOS,
        else "length". Where stop strings are found on the host (no byte table), the ids are cut here."""
        found = False
        if stop:
            decode = lambda t: self.tokenizer.decode(t, skip_special_tokens=True)
            found = stops.truncate(decode(tokens), stop)[1]
            if found and self.token_bytes() is None:
                tokens = stops.cut_ids(decode, tokens, stop)
        eos = bool(tokens) and gen.stop_at_eos and tokens[-1] in self.cfg.eos_token_ids
        return tokens, dataclasses.replace(stats, finish_reason="stop" if found or eos else "length")

    def stream(self, prompt, gen: GenerateConfig = GenerateConfig(), sampling: SamplingConfig = SamplingConfig()):
        """Yields the text of each round's accepted tokens as soon as the round ends (one host sync per
        round; generate() keeps the whole loop on device). A character whose bytes are split between
        rounds is held back until it is complete. Returns (as StopIteration's value) the row's Stats, its
        decode_s the wall time of the rounds, host syncs included."""
        sampling.validate()
        healed = self.heal([self.prompt_ids(prompt)], [gen.stop], gen)
        gen, choice = self.plan(gen, [len(healed.ids[0])], [gen.max_new_tokens])
        return (yield from self.using(choice)._stream(healed, gen, sampling, choice))

    def _stream(self, healed, gen: GenerateConfig, sampling: SamplingConfig, choice):
        """stream once planned (healed: heal's, of the one prompt)."""
        args = self.prepare(healed.ids, [sampling], [gen.max_new_tokens], gen, [gen.stop], allowed=healed.allowed,
                            choice=choice)
        last = []
        t0 = time.perf_counter()
        yield from text_pieces(self.tokenizer, self._rounds(args, last), gen.stop, healed.removed[0])
        kv_bytes = self.kv_bytes(args)
        [(_, stats)] = self._results(last[0], args.models.lookahead, choice, 0.0, time.perf_counter() - t0, kv_bytes)
        return dataclasses.replace(stats, healed=healed.removed[0])

    def _rounds(self, args, last: list):
        """Yields (tokens so far, done) after the prefill and after each round of one row; the latest state is
        kept in last (the reader may stop early: a stop string)."""
        with sharding.context(self.mesh):  # traced under the mesh, like generate's program
            s = decode.start_program(*args)
        while True:
            done = bool(s.done[0])
            last[:] = [s]
            yield np.asarray(s.tokens[0, : int(s.count[0])]).tolist(), done
            if done:
                return
            with sharding.context(self.mesh):
                s = decode.round_program(args.models, args.sampler, args.max_new, args.eos_ids, s)

    def plan(self, gen: GenerateConfig, lengths: list[int], max_new: list[int]):
        """(gen with its lookahead fixed, lookahead.Choice or None): "auto" resolved for a batch of prompts of
        `lengths` tokens, from the costs at its shapes (measured on first use) and the acceptance expected
        in this draft mode; K stays within the room the request leaves and the BF16 window. Under draft "auto"
        the drafter is chosen too (plan_auto): the call then runs as using(choice)."""
        if self.candidates:
            return self.plan_auto(gen, lengths, max_new)
        if gen.lookahead != "auto":
            return gen, None
        self.check(gen, lengths, max_new)
        mode, k_max = self.draft_mode, self._k_max(gen, lengths, max_new)
        if mode == DraftMode.NONE or k_max < 1:
            return dataclasses.replace(gen, lookahead=0), None
        t0 = time.perf_counter()
        costs = self._measure(self.drafter, gen, lengths, max_new, k_max)
        B = len(lengths)
        alpha, source = lookahead.estimate(mode, self._seen.get((mode, lookahead.batch_bucket(B)), (0, 0)), B)
        K, gain = lookahead.choose(costs, mode, alpha, k_max)
        choice = lookahead.Choice(K, mode, alpha, source, gain, costs, time.perf_counter() - t0)
        return dataclasses.replace(gen, lookahead=K), choice

    def plan_auto(self, gen: GenerateConfig, lengths: list[int], max_new: list[int]):
        """plan under draft "auto": every candidate drafter priced at its best K (gen's K where fixed) from its
        costs at the call's shapes and its acceptance (lookahead.auto_alpha: the prior before any call measured
        one; a drafter whose last call lost priced at that call's acceptance, bar its probes), against plain
        decoding -> (gen with the winner's K, Choice naming the winner, every candidate in Choice.priced)."""
        self.check(gen, lengths, max_new)
        k_max = self._k_max(gen, lengths, max_new) if gen.lookahead == "auto" else gen.lookahead
        if k_max < 1:
            return dataclasses.replace(gen, lookahead=0), None
        ks = lookahead.CANDIDATES if gen.lookahead == "auto" else (gen.lookahead,)
        B, t0 = len(lengths), time.perf_counter()
        bucket = lookahead.batch_bucket(B)
        priced, costs = [], {}
        for d in self.candidates:
            costs[d.mode] = self._measure(d, gen, lengths, max_new, k_max)
            alpha, source = lookahead.auto_alpha(d.mode, self._seen.get((d.mode, bucket), (0, 0)),
                                                 self._bench.get((d.mode, bucket)), self._calls.get(bucket, 0), B)
            priced.append(lookahead.price(costs[d.mode], d.mode, alpha, self._told((d.mode, bucket), source), k_max,
                                          ks))
        priced.insert(0, lookahead.plain(costs[self.candidates[0].mode]))
        w = lookahead.winner(priced)
        shared = costs[self.candidates[0].mode]  # plain decoding's: the verify every candidate shares
        choice = lookahead.Choice(w.K, w.mode, w.alpha, w.alpha_from, w.speedup, costs.get(w.mode, shared),
                                  time.perf_counter() - t0, tuple(priced))
        return dataclasses.replace(gen, lookahead=w.K), choice

    def using(self, choice) -> Engine:
        """The engine a call planned by plan runs as: under draft "auto", one with the chosen drafter alone
        (plain decoding where none was chosen) that shares this one's programs, costs, estimates and lock; else
        this one."""
        if not self.candidates:
            return self
        d = next((d for d in self.candidates if choice is not None and choice.K and d.mode == choice.mode), Drafter())
        return dataclasses.replace(self, drafter=d, candidates=())

    def _k_max(self, gen: GenerateConfig, lengths: list[int], max_new: list[int]) -> int:
        """The largest K a call may take: the room its rows leave and the BF16 window."""
        need = max(n + m for n, m in zip(lengths, max_new))
        window = self.kv.recent - 1 if self.kv.int2 else MAX_LOOKAHEAD  # candidates are attended in BF16
        return min(MAX_LOOKAHEAD, window, self.room(gen) - need)

    def _measure(self, drafter: Drafter, gen: GenerateConfig, lengths, max_new, k_max: int):
        """lookahead.measure for drafter at a call's shapes: once per batch size and power of two of the largest
        capacity K may need (self._costs, and on disk)."""
        capacity, context = lookahead.cost_shape(
            self.capacity(dataclasses.replace(gen, lookahead=k_max), lengths, max_new), k_max)
        dp = sharding.dp_size(self.mesh)
        return lookahead.measure(self._models(k_max, drafter), self.kv, -(-len(lengths) // dp) * dp, capacity,
                                 context, k_max, jnp.dtype(self.dtype), self.mesh, self._costs, say=self.say)

    def prepare(self, ids, rows, max_new, gen, stop: list[tuple[str, ...]] | None = None,
                capacity: int | None = None, allowed: np.ndarray | None = None, choice=None) -> ProgramArgs:
        """The program's arguments for a batch (caches included), checked, padded to its capacity bucket
        and to the mesh's dp, and placed on the mesh. A lookahead of "auto" is resolved first (plan). stop:
        each row's stop strings (generate_ids). capacity: a larger cache than the batch's own (runtime.slots:
        a batch whose slots take the rows of a whole bucket). allowed: [B, V] the first token's choices of healed
        prompts (heal). choice: what planned gen's K, where the caller planned (plan's): a K the engine chose runs
        with the per-row fallback where its round costs MIN_PAYS plain steps or more (decode.fallback.used)."""
        stop = _per_row_stops(gen, stop, len(ids))
        if self.candidates:  # draft "auto": the drafter chosen first
            gen, choice = self.plan(gen, [len(x) for x in ids], max_new)
            return self.using(choice).prepare(ids, rows, max_new, gen, stop, capacity, allowed, choice)
        if gen.lookahead == "auto":  # the callers here plan first (once per call)
            gen, choice = self.plan(gen, [len(x) for x in ids], max_new)
        self.check(gen, [len(x) for x in ids], max_new)
        dp = sharding.dp_size(self.mesh)
        stop = stop + [()] * (-(-len(ids) // dp) * dp - len(ids))
        ids, rows, max_new = pad_rows(ids, rows, max_new, -(-len(ids) // dp) * dp)
        capacity = max(capacity or 0, self.capacity(gen, [len(x) for x in ids], max_new))
        prompts = np.zeros((len(ids), capacity), np.int32)  # as wide as the cache: the prefill reads it in chunks
        for b, x in enumerate(ids):
            prompts[b, : len(x)] = x
        sampler = Sampler.make(len(ids), [s.temperature for s in rows], [s.top_k for s in rows],
                               [s.top_p for s in rows])
        args = self._program_args(prompts, ids, rows, max_new, capacity, self.lookahead(gen), sampler, gen,
                                  lookahead.breakeven(choice))
        if any(stop) and self.token_bytes() is not None:  # else no stop strings in the program (or on the host)
            on_device = self.stop_arrays(stops.pack(self.token_bytes(), stop))
            args = args._replace(stops=on_device if self.mesh is None else sharding.shard_stops(self.mesh, on_device))
        if allowed is not None:  # padding rows may start with any token
            allowed = np.concatenate([allowed, np.ones((len(ids) - len(allowed), allowed.shape[1]), bool)])
            allowed = jax.device_put(allowed)
            args = args._replace(allowed=allowed if self.mesh is None else sharding.shard_batch(allowed, self.mesh))
        return args

    def stop_arrays(self, host: dict) -> stops.Stops:
        """stops.pack's arrays on the device; the token tables are put there once and reused."""
        with self._lock:
            if len(self._token_bytes) < 2:
                self._token_bytes.append({k: jax.device_put(host[k]) for k in ("table", "lens", "lead")})
        return stops.Stops(**self._token_bytes[1], strings=jax.device_put(host["strings"]),
                           sizes=jax.device_put(host["sizes"]))

    def _models(self, K: int, drafter: Drafter | None = None) -> Models:
        return Models(self.params, (drafter or self.drafter).at(K), self.cfg, K, self.attn_impl, self.options)

    def _program_args(self, prompts, ids, rows, max_new, capacity, K, sampler, gen, pays=None):
        dt = jnp.dtype(self.dtype)
        B = len(ids)
        make = lambda: (kvcache.init_cache(self.cfg, self.kv, B, capacity, dt, K),
                        # the draft model's or head's: windowed where the capacity exceeds its window (cache_kv)
                        drafters.init_cache(self.drafter, B, capacity, dt, K))
        check_cache_memory(jax.eval_shape(make), B, capacity)
        cache, draft_cache = make()
        # No id is -1: a row that must not stop at EOS gets that as its only stop token.
        eos = (gen.stop_at_eos and self.cfg.eos_token_ids) or (-1,)
        # made on the host and put on the device: a conversion or jnp.asarray there would each be a program
        host = lambda x, dt: jax.device_put(np.asarray(x, dt))
        models = self._models(K).replace(fallback=np.float32(pays) if K and fallback.used(pays) else None)
        args = ProgramArgs(models, jax.device_put(prompts), host([len(x) for x in ids], np.int32),
                           host(max_new, np.int32), sampler, host([s.seed for s in rows], np.uint32), cache,
                           draft_cache, host(eos, np.int32))
        return args if self.mesh is None else sharding.shard_program_args(self.mesh, args)

    def compile(self, args: ProgramArgs):
        """(the generate program compiled for these arguments' shapes, compile seconds): compiled on first
        use, then reused (0.0 seconds). On one device it is two programs, decode.start_program and
        decode.rounds_program (three with a draft model: decode.draft_prefill_program), compiled side by side
        and run back to back (trace_parts); on a mesh the one decode.generate_program (the rounds' input
        shardings are only known once the prefill is compiled). Under the lock: a program compiles once."""
        return self.build(args)[:2]

    def build(self, args: ProgramArgs):
        """compile's (program, seconds), and whether the program was read back from a compilation cache (the
        seconds then went to tracing and reading it, not to compiling)."""
        with self._lock:
            return self._compile(args)

    def _compile(self, args: ProgramArgs):
        key = jax.tree.structure(args), tuple((x.shape, x.dtype) for x in jax.tree.leaves(args))
        if key in self._compiled:
            return self._compiled[key], 0.0, False
        what = (f"the generate program for batch {args.prompts.shape[0]}, capacity {args.cache.capacity}, "
                f"lookahead {args.models.lookahead}")
        if self.say is not None:
            self.say(f"reading {what} from the compilation cache" if programs.seen(args, self.xla_options) else
                     f"compiling {what} (once per shape; later runs read it from the compilation cache)")
        compiled, seconds, cached = self._timed(lambda: self._built_program(args))
        self._compiled[key] = compiled
        log.info("%s: %s in %.1f s", what, "read from the compilation cache" if cached else "compiled", seconds)
        programs.mark_seen(args, self.xla_options)
        return compiled, seconds, cached

    def _built_program(self, args: ProgramArgs):
        with sharding.context(self.mesh):  # traced under the mesh: attention_split.per_shard sees it
            if self.mesh is None:
                keys = [(name, args) for name in part_names(args.models)]
                return back_to_back(*programs.compiled_together(keys, lambda: lower_parts(args), self.xla_options))
            return programs.compiled(decode.generate_program, *args, options=self.xla_options)

    def _results(self, state, K, choice, compile_s, decode_s, kv_bytes):
        tokens, count = np.asarray(state.tokens), np.asarray(state.count)
        rounds, accepted = np.asarray(state.rounds), np.asarray(state.accepted)
        drafted = fallback.drafted_rounds(state)
        total = int(count.sum())
        stats = lambda b: self.row_stats(int(count[b]), int(rounds[b]), int(accepted[b]), K, kv_bytes=kv_bytes,
                                         compile_s=compile_s, decode_s=decode_s, batch_tokens=total, choice=choice,
                                         drafted=int(drafted[b]))
        return [(tokens[b, : count[b]].tolist(), stats(b)) for b in range(len(count))]


def check_cache_memory(caches, B: int, capacity: int) -> None:
    """OutOfMemory, before they are allocated, when the caches (shapes, from jax.eval_shape) take more than the free
    memory of the device (on the CPU, the host's): XLA would fail the call with RESOURCE_EXHAUSTED, or the
    process be killed."""
    need = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(caches))
    free = memory.device_available()
    free = memory.host_available() if free is None else free
    if free is not None and need > free:
        raise OutOfMemory(f"a batch of {B} rows at capacity {capacity} needs {need / 2**30:.2f} GiB of KV cache, "
                          f"more than the {free / 2**30:.2f} GiB of memory free: fewer rows (--batch-size) or fewer "
                          "tokens")


def text_pieces(tokenizer, rounds, stop: tuple[str, ...] = (), healed: str = ""):
    """The new text of each round, from (all tokens so far, done) per round. Text ending in U+FFFD (an
    incomplete UTF-8 character at the end of the tokens) is held back until a later round completes it, and
    so is an end that may be the start of a stop string; the text ends before the first stop string (no
    round is asked for after it); the last round flushes whatever is left. healed: the prompt's text the first
    token repeats (token healing), not shown again."""
    shown = ""
    for tokens, done in rounds:
        text, found = stops.truncate(tokenizer.decode(tokens, skip_special_tokens=True), stop)
        text = healing.unheal(text, healed)
        if not (done or found):
            text = text.rstrip("\ufffd")
            text = text[: len(text) - max((n for s in stop for n in range(1, len(s)) if text.endswith(s[:n])),
                                          default=0)]
        if len(text) > len(shown):
            yield text[len(shown):]
            shown = text
        if found:
            return


def _per_row_stops(gen: GenerateConfig, stop, n: int) -> list[tuple[str, ...]]:
    """Each row's stop strings, checked (check_stops): stop per row, or gen.stop for every row."""
    stop = [gen.stop] * n if stop is None else [stop_tuple(s) for s in stop]
    if len(stop) != n:
        raise ConfigError(f"stop has {len(stop)} entries for {n} prompts")
    for s in stop:
        check_stops(s)
    return stop


def _per_row(name: str, value, n: int) -> list:
    """One value for all n rows, or a list of exactly n (ConfigError otherwise)."""
    if not isinstance(value, (list, tuple)):
        return [value] * n
    if len(value) != n:
        raise ConfigError(f"{name} has {len(value)} entries for {n} prompts")
    return list(value)


def _default_impl(options: Options = Options()) -> str:
    return "pallas" if options.gpu else "reference"


def _check_same_tokenizer(tok, dtok, cfg: ModelConfig, dcfg: ModelConfig) -> None:
    if cfg.vocab_size != dcfg.vocab_size or tok.get_vocab() != dtok.get_vocab():
        raise ConfigError("the draft model's tokenizer differs from the target's: they must share one")


def _rotate(params: Params, cfg: ModelConfig, model_dir: Path, kv: KVConfig, mode: str,
            rotations: str | Path | None) -> tuple[Params, KVConfig]:
    """Applies the rotation of `mode` ("auto": OSCAR when a rotation file exists) for an int2 cache -> (params, kv
    with the rotation file's searched clip where kv leaves a clip unset; params with the file's key noise where
    the cache codes keys as it was measured, _key_noise)."""
    path = Path(rotations) if rotations else checkpoint.rotation_path(model_dir)
    if mode == "auto":
        mode = "oscar" if kv.int2 and path.is_file() else ("hadamard" if kv.int2 else "none")
    log.info("rotations: %s%s", mode, f" from {path}" if mode == "oscar" else "")
    if mode == "none":
        return params, kv
    rotation.check_head_dim(cfg.head_dim)
    if mode == "hadamard":
        rot_k, rot_v = rotation.hadamard_rotations(cfg)
    elif mode == "oscar":
        rot_k, rot_v, meta = rotation.load_rotations(path, cfg)
        kv = _with_searched_clips(kv, rotation.searched_clips(meta, cfg))
    else:
        raise ConfigError(f"unknown rotation {mode!r}; use none, hadamard or oscar")
    params = _apply_rotations(params, cfg, rot_k, rot_v)
    noise = _key_noise(meta, cfg, kv) if mode == "oscar" else None
    return (params if noise is None else rotation.with_key_noise(params, noise)), kv


def _key_noise(meta: dict, cfg: ModelConfig, kv: KVConfig):
    """Layer.key_noise [L, Hkv] of a rotation file where JSPEC_KEY_NOISE=on and the cache codes keys as the file
    measured them (its searched key clip and group size); else None (no shift; a clip mismatch said in the log)."""
    noise, found = rotation.key_noise(meta, cfg), rotation.searched_clips(meta, cfg)
    if noise is None or found is None or os.environ.get("JSPEC_KEY_NOISE") != "on":  # off by default: docs/design.md
        return None
    measured = (found["clip_model"][0], json.loads(meta.get("clip_search", "{}")).get("group_size", cfg.head_dim))
    if (kv.clips[0], kv.group(cfg.head_dim)) != measured:
        log.info("key-noise correction off: measured at key clip %s, group %s; this cache codes keys at %s, %s",
                 *measured, kv.clips[0], kv.group(cfg.head_dim))
        return None
    return noise


def _with_searched_clips(kv: KVConfig, found: dict | None) -> KVConfig:
    """kv with the file's model-wide clip pair (jspec calibrate's search) in the clips the caller left unset."""
    if found is None:
        return kv
    ck, cv = found["clip_model"]
    return dataclasses.replace(kv, clip_k=ck if kv.clip_k is None else kv.clip_k,
                               clip_v=cv if kv.clip_v is None else kv.clip_v)


# One device program for the whole fold (run eagerly it was a dozen small ones, each compiled); the loaded
# params are donated, so the weights it leaves alone are not copied.
_apply_rotations = jax.jit(rotation.apply_rotations, static_argnums=1, donate_argnums=0)


def load(model: str | Path | None = None, draft: str | Path | None = "shipped", *, kv: KVConfig = KVConfig("auto"),
         rotation_mode: str = "auto", rotations: str | Path | None = None, dtype: str = "bfloat16",
         attn_impl: str = "auto", mesh: str | jax.sharding.Mesh | None = "auto", scan_layers: bool = False,
         options: Options = Options(), draft_window: KVConfig | None = DRAFT_WINDOW,
         draft_layers: int | None = None, learn: str | None = None) -> Engine:
    """Loads a target (default: the shipped code model) and a drafter from local Hugging Face directories
    or GGUF files (model.gguf: jspec.io.gguf; its rotations default to model.rotations.safetensors beside it).

    draft: a draft model's directory, or an EAGLE-3 head's (its config.json's architectures name
    LlamaForCausalLMEagle3: jspec.io.eagle3); "shipped": the shipped draft when the shipped target is used;
    "auto": the drafter and K chosen per call (Engine.plan_auto) among n-gram lookup, the self-draft, every
    registered drafter without weights that has cost probes, and the shipped draft with the shipped target;
    "ngram": prompt lookup, no model; "ngram+DIR" or "ngram+shipped": the n-gram copy where a row has a
    match, the draft model elsewhere; "self": the target drafts for itself over the BF16 window of its own cache
    (no extra weights); "ngram+self": the copy where a row has a match, the self-draft elsewhere; the name of a
    drafter registered without weights (decode.drafters.register), or "ngram+" it; None/"none": no speculation
    (the grammar: config.DraftSpec).
    draft_window: the draft model's or head's cache where a call's capacity exceeds this window (KV mode
    "window": sink + recent only, so its cost and memory stay flat with the context); None: always full BF16.
    draft_layers: "self-skip" (or "ngram+self-skip") drafts with the target's first N layers, its norm and head
    (decode.drafters.self_skip); None: its default share of the layers.
    learn: where draft "auto" keeps what its calls learn: "disk" (the estimates of earlier processes on this model
    pair are read back, and each call's written: runtime.learned), "memory" (this engine only, from the priors);
    None: $JSPEC_LEARN, else "disk".

    kv "auto" is INT2 OSCAR when the target directory holds a rotation file, else BF16.
    mesh: "tp=N,dp=M", a Mesh, "auto" (every local device data-parallel) or None (jspec.runtime.sharding).
    scan_layers: each forward's loop over the layers rolled (Options.layer_unroll = 1, one layer's ops in the
    program) on a GPU too (the CPU's default): programs that compile ~4x and load ~17x faster, a decode step 0-6%
    slower in INT2 (BF16 11% at batch 1; H200, docs/design.md).
    options: how the programs are built (config.Options; the defaults are what runs; its platform, where None,
    is JAX's default backend).
    """
    model_dir, t0 = Path(model) if model else DEFAULT_TARGET, time.perf_counter()
    learn = learned.mode(learn)
    if dtype not in ("bfloat16", "float32"):
        raise ConfigError(f"dtype must be bfloat16 or float32, got {dtype!r}")
    if rotations:  # whatever the kv mode: a named file must be one
        files.require(Path(rotations), "rotation file")
    cfg, params, tok = checkpoint.load_model(model_dir, jnp.dtype(dtype))
    if kv.mode == "auto":
        has_rotations = (Path(rotations) if rotations else checkpoint.rotation_path(model_dir)).is_file()
        kv = dataclasses.replace(kv, mode="int2" if has_rotations else "bf16")
    kv.validate(cfg.head_dim)
    params, kv = _rotate(params, cfg, model_dir, kv, rotation_mode, rotations)
    if draft == "auto":
        candidates = tuple(d.replace(window=draft_window) for d in _auto_drafters(model_dir, cfg, tok, jnp.dtype(dtype)))
        drafter = Drafter(mode="auto")
    else:
        candidates = ()
        drafter = _load_drafter(draft, model_dir, cfg, tok, jnp.dtype(dtype)).replace(window=draft_window)
    drafter = drafter.replace(layers=_draft_layers(draft_layers, drafter, cfg))
    if attn_impl not in ATTENTION_IMPLS:
        raise ConfigError(f"attn_impl must be one of {', '.join(ATTENTION_IMPLS)}, got {attn_impl!r}")
    options = dataclasses.replace(options, platform=options.platform or default_platform(),  # decided once, here
                                  layer_unroll=1 if scan_layers else options.layer_unroll)
    impl = _default_impl(options) if attn_impl == "auto" else attn_impl
    mesh = sharding.resolve_mesh(mesh, cfg)
    if mesh is not None:  # placed once here; the per-call placement in _program_args is then a no-op
        params, drafter = sharding.shard_params(params, cfg, mesh), sharding.replicate(drafter, mesh)
        candidates = tuple(sharding.replicate(d, mesh) for d in candidates)
    template = tok.chat_template if checkpoint.is_gguf(model_dir) else chat.template_of(model_dir)
    source = f"model={model_dir.resolve()} draft={draft} rotation={rotation_mode} rotations={rotations}"
    log.info("loaded %s (draft %s, kv %s) in %.1f s", model_dir, drafter.mode, kv.mode, time.perf_counter() - t0)
    store = learned.store(source, cfg, candidates, kv, dtype) if candidates and learn == "disk" else None
    eng = Engine(cfg=cfg, params=params, tokenizer=tok, kv=kv, drafter=drafter, candidates=candidates,
                 dtype=dtype, attn_impl=impl,
                 mesh=mesh, options=options, chat_template=template, source=source, store=store)
    eng.recall()
    return eng


def _auto_drafters(model_dir: Path, cfg: ModelConfig, tok, dtype) -> list[Drafter]:
    """The drafters draft "auto" chooses from: every registered one that needs no weights and has cost probes
    (n-gram lookup, the self-draft, ngram+self, any registered from outside), and with the shipped target the
    shipped draft (model, ngram+model)."""
    out = [Drafter(mode=n) for n in drafters.names()
           if n not in ("none", "model", "head", "ngram+model") and _has_probes(drafters.proposer(n))]
    d = _load_drafter("shipped", model_dir, cfg, tok, dtype)
    return out + ([d, d.replace(mode="ngram+model")] if d.mode == DraftMode.MODEL else [])  # (else ngram: in out)


def _has_probes(p) -> bool:
    """Whether a drafter prices its rounds (overrides Proposer.probes): one without is never chosen by auto."""
    return type(p).probes is not drafters.Proposer.probes


def _draft_layers(n, drafter: Drafter, cfg: ModelConfig) -> int | None:
    """load's draft_layers, checked: for a self-skip drafter only, a layer count of the target."""
    if n is not None and DraftSpec.parse(drafter.mode).model != DraftMode.SELF_SKIP:
        raise ConfigError(f"draft layers go with the self-skip drafter (draft 'self-skip'), not {drafter.mode!r}")
    self_skip.check_layers(n, cfg)
    return n


def _load_drafter(draft, model_dir: Path, cfg: ModelConfig, tok, dtype) -> Drafter:
    """load's draft argument as a Drafter (see load)."""
    spec = DraftSpec.parse(draft)
    if spec.model == "auto" and not spec.copies:
        raise ConfigError("draft 'auto' chooses among drafters per call: it is load's own value, not a drafter")
    if spec.model in ("shipped", "auto"):  # (ngram+auto: ngram+shipped) the shipped draft with the shipped target;
        # prompt lookup (free, lossless) with any other
        shipped = model_dir.resolve() == DEFAULT_TARGET.resolve() and DEFAULT_DRAFT.is_dir()
        spec = DraftSpec(spec.copies, DEFAULT_DRAFT) if shipped else DraftSpec(True, None)
    if spec.model in (None, "none"):
        return Drafter(mode=spec.mode(None))
    if isinstance(spec.model, str) and spec.model in set(drafters.names()) - {"model", "head"}:
        return Drafter(mode=spec.mode(spec.model))  # self, or a registered drafter with no weights of its own
    if eagle3.is_head_dir(spec.model):
        if spec.copies:
            raise ConfigError("an EAGLE-3 head does not combine with ngram: give the head's directory alone")
        head_cfg, head = eagle3.load_head(spec.model, cfg, dtype)
        return Drafter(head=head, mode=DraftMode.HEAD, head_cfg=head_cfg)
    draft_cfg, model, dtok = checkpoint.load_model(spec.model, dtype)
    _check_same_tokenizer(tok, dtok, cfg, draft_cfg)
    return Drafter(model=model, mode=spec.mode(DraftMode.MODEL), model_cfg=draft_cfg)
