"""The library entry points: load a target (and draft) from local directories, generate text.

    import jspec
    engine = jspec.load()                      # the shipped pair in checkpoints/
    [result] = engine.generate(["def fibonacci(n):"], jspec.GenerateConfig(max_new_tokens=64))
    print(result.text, result.stats)
"""

from __future__ import annotations

import base64
import dataclasses
import json
import numbers
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jspec import checkpoint, decode, eagle3, kvcache, lookahead, programs, rotation, sharding
from jspec.config import (ATTENTION_IMPLS, MAX_LOOKAHEAD, ConfigError, GenerateConfig, KVConfig, ModelConfig,
                          SamplingConfig)
from jspec.decode import ProgramArgs
from jspec.head import HeadConfig, HeadParams
from jspec.io import chat
from jspec.model import Params, compile_options, is_stacked, stack_layers
from jspec.sampling import Sampler

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
DEFAULT_TARGET = CHECKPOINTS / "code-target"
DEFAULT_DRAFT = CHECKPOINTS / "code-draft"
ROTATION_FILE = "rotations.safetensors"


@dataclasses.dataclass(frozen=True)
class Result:
    prompt: str | list[int]
    text: str
    token_ids: list[int]
    stats: dict


@dataclasses.dataclass
class Engine:
    """A loaded target (and optional draft model and/or n-gram drafter) plus the KV configuration they
    decode with.

    jspec.load builds one from model directories; tests build one from params by keyword.
    """

    cfg: ModelConfig
    params: Params
    tokenizer: object
    kv: KVConfig
    draft_cfg: ModelConfig | None = None
    draft_params: Params | None = None
    dtype: str = "bfloat16"
    attn_impl: str = "reference"
    mesh: jax.sharding.Mesh | None = None  # ("dp", "tp"): see jspec.sharding
    ngram: bool = False  # draft by prompt lookup (with the draft model, if any, where it finds no match)
    head_cfg: HeadConfig | None = None  # an EAGLE-3 head drafting from the target's hidden states
    head_params: HeadParams | None = None
    chat_template: str | None = None  # the target's (jspec.io.chat.template_of), for chat()
    _compiled: dict = dataclasses.field(default_factory=dict, repr=False)
    _costs: dict = dataclasses.field(default_factory=dict, repr=False)  # measured costs (lookahead.measure)
    _seen: dict = dataclasses.field(default_factory=dict, repr=False)  # (draft mode, batch bucket) -> acceptance

    @property
    def xla_options(self) -> dict | None:
        """XLA's compiler options for this engine's programs (model.compile_options: stacked layers)."""
        return compile_options(self.params, self.draft_params)

    @property
    def draft_mode(self) -> str:
        """"model", "ngram", "ngram+model", "head" (decode.DRAFTERS) or "none"."""
        if self.head_params is not None:
            return "head"
        model = self.draft_params is not None
        return ("ngram+model" if model else "ngram") if self.ngram else ("model" if model else "none")

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt))

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
            bad = [x for x in ids if isinstance(x, bool) or not isinstance(x, numbers.Integral)
                   or not 0 <= x < self.cfg.vocab_size]
            if bad:
                raise ConfigError(f"token ids must be integers in [0, {self.cfg.vocab_size}), got {bad[0]!r}")
            ids = [int(x) for x in ids]
        if not ids:
            raise ConfigError("empty prompt: give at least one token")
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
        return [Result(p, self.tokenizer.decode(t, skip_special_tokens=True), t, st)
                for p, (t, st) in zip(prompts, out)]

    def chat(self, messages: list[dict], gen: GenerateConfig = GenerateConfig(),
             sampling: SamplingConfig = SamplingConfig()) -> Result:
        """Generates the assistant's reply to a conversation ([{"role", "content"}, ...]) rendered with the
        model's chat template. The rendered text holds the template's special tokens (its BOS included), so
        it is tokenized without adding any, as transformers' apply_chat_template(tokenize=True) does."""
        if self.chat_template is None:
            raise ConfigError("this model has no chat template (tokenizer_config.json, chat_template.jinja or "
                              "GGUF metadata)")
        text = chat.render(self.chat_template, messages, **chat.special_tokens(self.tokenizer))
        [result] = self.generate([self.tokenizer.encode(text, add_special_tokens=False)], gen, sampling)
        return dataclasses.replace(result, prompt=text)

    def lookahead(self, gen: GenerateConfig) -> int:
        """The lookahead a request must leave room for in the context: gen's K when there is a drafter;
        0 without one, and for "auto", which fits K into the room the request leaves."""
        return gen.lookahead if self.draft_mode != "none" and gen.lookahead != "auto" else 0

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
            raise ConfigError("empty prompt: give at least one token")
        if lengths:  # each row on its own: the cache holds the most demanding row (capacity)
            max_new = max_new or [gen.max_new_tokens] * len(lengths)
            need, n, m = max((n + m, n, m) for n, m in zip(lengths, max_new))
            if need > self.room(gen):
                raise ConfigError(f"prompt of {n} tokens + {m} new tokens + lookahead {K} + 1 exceeds the "
                                  f"model's context of {context} tokens")

    def generate_ids(self, ids: list[list[int]], rows: list[SamplingConfig], max_new: list[int],
                     gen: GenerateConfig):
        """Token-level generate: returns [(token_ids, stats)] per row."""
        gen, choice = self.plan(gen, [len(x) for x in ids], max_new)
        args = self.prepare(ids, rows, max_new, gen)
        kv_bytes = args.cache.nbytes() + (args.draft_cache.nbytes() if args.draft_cache is not None else 0)
        program, compile_s = self.compile(args)
        t0 = time.perf_counter()
        state = jax.block_until_ready(program(*args))  # the caches are donated: gone after this call
        decode_s = time.perf_counter() - t0
        K, key = args.models.lookahead, (self.draft_mode, lookahead.batch_bucket(len(ids)))
        self._seen[key] = lookahead.observe_batch(self._seen.get(key, (0, 0)), K, np.asarray(state.rounds)[: len(ids)],
                                                  np.asarray(state.count)[: len(ids)])
        return self._results(state, K, choice, compile_s, decode_s, kv_bytes)[: len(ids)]  # dummy rows dropped

    def stream(self, prompt, gen: GenerateConfig = GenerateConfig(), sampling: SamplingConfig = SamplingConfig()):
        """Yields the text of each round's accepted tokens as soon as the round ends (one host sync per
        round; generate() keeps the whole loop on device). A character whose bytes are split between
        rounds is held back until it is complete."""
        sampling.validate()
        args = self.prepare([self.prompt_ids(prompt)], [sampling], [gen.max_new_tokens], gen)
        yield from text_pieces(self.tokenizer, self._rounds(args))

    def _rounds(self, args):
        """Yields (tokens so far, done) after the prefill and after each round of one row."""
        with sharding.context(self.mesh):  # traced under the mesh, like generate's program
            s = decode.start_program(*args)
        while True:
            done = bool(s.done[0])
            yield np.asarray(s.tokens[0, : int(s.count[0])]).tolist(), done
            if done:
                return
            with sharding.context(self.mesh):
                s = decode.round_program(args.models, args.sampler, args.max_new, args.eos_ids, s)

    def plan(self, gen: GenerateConfig, lengths: list[int], max_new: list[int]):
        """(gen with its lookahead fixed, lookahead.Choice or None): "auto" resolved for a batch of prompts of
        `lengths` tokens, from the costs at its shapes (measured on first use) and the acceptance expected
        in this draft mode; K stays within the room the request leaves and the BF16 window."""
        if gen.lookahead != "auto":
            return gen, None
        self.check(gen, lengths, max_new)
        mode, dp = self.draft_mode, sharding.dp_size(self.mesh)
        need = max(n + m for n, m in zip(lengths, max_new))
        window = self.kv.recent - 1 if self.kv.int2 else MAX_LOOKAHEAD  # candidates are attended in BF16
        k_max = min(MAX_LOOKAHEAD, window, self.room(gen) - need)
        if mode == "none" or k_max < 1:
            return dataclasses.replace(gen, lookahead=0), None
        # measured once per batch size and power of two of the largest capacity K may need (self._costs, and
        # on disk)
        capacity, context = lookahead.cost_shape(
            self.capacity(dataclasses.replace(gen, lookahead=k_max), lengths, max_new), k_max)
        t0 = time.perf_counter()
        costs = lookahead.measure(self._models(k_max), self.kv, -(-len(lengths) // dp) * dp, capacity, context,
                                  k_max, jnp.dtype(self.dtype), self.mesh, self._costs)
        B = len(lengths)
        alpha, source = lookahead.estimate(mode, self._seen.get((mode, lookahead.batch_bucket(B)), (0, 0)), B)
        K, gain = lookahead.choose(costs, mode, alpha, k_max)
        choice = lookahead.Choice(K, mode, alpha, source, gain, costs, time.perf_counter() - t0)
        return dataclasses.replace(gen, lookahead=K), choice

    def prepare(self, ids, rows, max_new, gen) -> ProgramArgs:
        """The program's arguments for a batch (caches included), checked, padded to its capacity bucket
        and to the mesh's dp, and placed on the mesh. A lookahead of "auto" is resolved first (plan)."""
        gen, _ = self.plan(gen, [len(x) for x in ids], max_new)
        self.check(gen, [len(x) for x in ids], max_new)
        dp = sharding.dp_size(self.mesh)
        ids, rows, max_new = pad_rows(ids, rows, max_new, -(-len(ids) // dp) * dp)
        capacity = self.capacity(gen, [len(x) for x in ids], max_new)
        prompts = np.zeros((len(ids), capacity), np.int32)  # as wide as the cache: the prefill reads it in chunks
        for b, x in enumerate(ids):
            prompts[b, : len(x)] = x
        sampler = Sampler.make(len(ids), [s.temperature for s in rows], [s.top_k for s in rows],
                               [s.top_p for s in rows])
        return self._program_args(prompts, ids, rows, max_new, capacity, self.lookahead(gen), sampler, gen)

    def _models(self, K: int) -> decode.Models:
        model = self.draft_params is not None and K > 0  # K = 0: plain decoding, no drafter at all
        with_head = self.head_params is not None and K > 0
        return decode.Models(self.params, self.draft_params if model else None, self.cfg,
                             self.draft_cfg if model else None, K, self.attn_impl,
                             self.draft_mode if K else "model", self.head_params if with_head else None,
                             self.head_cfg if with_head else None)

    def _program_args(self, prompts, ids, rows, max_new, capacity, K, sampler, gen):
        dt = jnp.dtype(self.dtype)
        B = len(ids)
        cache = kvcache.init_cache(self.cfg, self.kv, B, capacity, dt, K, stacked=is_stacked(self.params))
        draft_cache = None
        if K and self.draft_params is not None:
            draft_cache = kvcache.init_cache(self.draft_cfg, KVConfig("bf16"), B, capacity, dt,
                                             stacked=is_stacked(self.draft_params))
        if K and self.head_params is not None:
            draft_cache = kvcache.init_cache(self.head_cfg.layer, KVConfig("bf16"), B, capacity, dt)
        # No id is -1: a row that must not stop at EOS gets that as its only stop token.
        eos = (gen.stop_at_eos and self.cfg.eos_token_ids) or (-1,)
        # made on the host and put on the device: a conversion or jnp.asarray there would each be a program
        host = lambda x, dt: jax.device_put(np.asarray(x, dt))
        args = ProgramArgs(self._models(K), jax.device_put(prompts), host([len(x) for x in ids], np.int32),
                           host(max_new, np.int32), sampler, host([s.seed for s in rows], np.uint32), cache,
                           draft_cache, host(eos, np.int32))
        return args if self.mesh is None else sharding.shard_program_args(self.mesh, args)

    def compile(self, args: ProgramArgs):
        """(the generate program compiled for these arguments' shapes, compile seconds): compiled on first
        use, then reused (0.0 seconds). On one device it is two programs, decode.start_program and
        decode.rounds_program (three with a draft model: decode.draft_prefill_program), compiled side by side
        and run back to back (trace_parts); on a mesh the one decode.generate_program (the rounds' input
        shardings are only known once the prefill is compiled)."""
        key = jax.tree.structure(args), tuple((x.shape, x.dtype) for x in jax.tree.leaves(args))
        if key in self._compiled:
            return self._compiled[key], 0.0
        t0 = time.perf_counter()
        with sharding.context(self.mesh):  # traced under the mesh: attention_split.per_shard sees it
            if self.mesh is None:
                keys = [(name, args) for name in part_names(args.models)]
                compiled = _back_to_back(*programs.compiled_together(keys, lambda: lower_parts(args),
                                                                     self.xla_options))
            else:
                compiled = programs.compiled(decode.generate_program, *args, options=self.xla_options)
        self._compiled[key] = compiled
        return compiled, time.perf_counter() - t0

    def _results(self, state, K, choice, compile_s, decode_s, kv_bytes):
        tokens, count = np.asarray(state.tokens), np.asarray(state.count)
        rounds, accepted = np.asarray(state.rounds), np.asarray(state.accepted)
        total = int(count.sum())
        out = []
        for b in range(len(count)):
            r = int(rounds[b])
            stats = dict(
                new_tokens=int(count[b]), rounds=r, accepted=int(accepted[b]),
                accept_length=(int(count[b]) - 1) / r if r else 0.0,
                accept_rate=int(accepted[b]) / (K * r) if K and r else 0.0,
                lookahead=K, draft_mode=self.draft_mode, kv_mode=self.kv.mode, batch_kv_bytes=int(kv_bytes),
                compile_s=round(compile_s, 3), decode_s=round(decode_s, 4),
                batch_tokens_per_s=round(total / decode_s, 1) if decode_s > 0 else 0.0,
            )
            if choice is not None:
                stats["lookahead_auto"] = choice.stats()
            out.append((tokens[b, : count[b]].tolist(), stats))
        return out


def text_pieces(tokenizer, rounds):
    """The new text of each round, from (all tokens so far, done) per round. Text ending in U+FFFD (an
    incomplete UTF-8 character at the end of the tokens) is held back until a later round completes it;
    the last round flushes whatever is left."""
    shown = ""
    for tokens, done in rounds:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        if not done:
            text = text.rstrip("\ufffd")
        if len(text) > len(shown):
            yield text[len(shown):]
            shown = text


def part_names(m: decode.Models) -> list:
    """The generate program's parts on one device (trace_parts), by name: the prefill and the rounds, and with a
    draft model the draft's prefill, a part of its own so that the two prefills compile side by side."""
    return ["start", "rounds"] + ["draft_prefill"] * (m.draft is not None)


def trace_parts(args: ProgramArgs, start=decode.start_program, rounds=decode.rounds_program,
                draft_prefill=decode.draft_prefill_program) -> list:
    """The generate program's parts (part_names) traced for args, jitted as decode's: the prefill (start), the
    rounds from the state it leaves (rounds) and the draft's prefill (draft_prefill: run first, start then
    given the models without the draft)."""
    m = args.models
    split = "draft_prefill" in part_names(m)
    first = start.trace(*args._replace(models=m.replace(draft=None))) if split else start.trace(*args)
    parts = [first, rounds.trace(m, args.sampler, args.max_new, args.eos_ids, first.out_info)]
    if split:
        parts.append(draft_prefill.trace(m, args.prompts, args.prompt_lens, args.draft_cache))
    return parts


def lower_parts(args: ProgramArgs, *jitted) -> list:
    """trace_parts, lowered."""
    return [part.lower() for part in trace_parts(args, *jitted)]


def _back_to_back(start, rounds, draft_prefill=None):
    """The generate program as its compiled parts (trace_parts'), each enqueued on the results of the one
    before."""
    def run(*args):
        a = ProgramArgs(*args)
        models = a.models
        if draft_prefill is not None:  # start was traced on the target alone
            a = a._replace(models=models.replace(draft=None),
                           draft_cache=draft_prefill(models, a.prompts, a.prompt_lens, a.draft_cache))
        return rounds(models, a.sampler, a.max_new, a.eos_ids, start(*a))
    return run


def _per_row(name: str, value, n: int) -> list:
    """One value for all n rows, or a list of exactly n (ConfigError otherwise)."""
    if not isinstance(value, (list, tuple)):
        return [value] * n
    if len(value) != n:
        raise ConfigError(f"{name} has {len(value)} entries for {n} prompts")
    return list(value)


def capacity_bucket(n: int, limit: int) -> int:
    """The cache capacity for a row of n tokens (prompt + new + K + 1): n rounded up on a grid of eight
    steps per power of two (multiples of 2^(e-4) in (2^(e-1), 2^e], at least 16), at most `limit`.

    The capacity and the batch size are all the shapes of a compiled program (the prompt array is as
    wide as the cache; prompt lengths and max_new_tokens are arrays), so one program serves every
    request in a bucket. The grid bounds what bucketing costs in cache memory: a bucket exceeds the
    capacity it serves by less than 12.5% (from 128 tokens on; by at most 15 tokens below). A geometric
    grid of ratio 1.125 would bound it alike with odd sizes; these are multiples of 16, and of 256 from
    2048 tokens on (the BF16 window's alignment, kvcache.ALIGN), so the cache's tiles stay whole.
    """
    step = max(16, 1 << max((n - 1).bit_length() - 4, 0))
    return min(-(-n // step) * step, limit)


def pad_rows(ids: list, rows: list[SamplingConfig], max_new: list[int], size: int):
    """Pads a batch to `size` rows with dummy rows (one token, max_new 0: done before the first round, so
    they emit nothing); callers drop the results past the real rows."""
    extra = size - len(ids)
    return ids + [[0]] * extra, rows + rows[:1] * extra, max_new + [0] * extra


def use_compile_cache(path: str | Path, max_gib: float = 4.0) -> None:
    """Turns on JAX's persistent compilation cache in directory `path` for this process: a later process
    that needs a program of the same shapes loads it from there instead of compiling it. Every program
    is kept, the small ones too (the weight fold, the cache allocation), which would otherwise cost a
    compile each (a tenth of a second on GPU) at every start. Past max_gib, JAX evicts the least recently
    used programs.

    Always with a size bound: JAX's evicting cache keeps an access-time file beside each entry and
    fails every later write in a directory where an entry lacks one (as an unbounded cache writes
    them), so every writer of a directory must bound it. Entries an unbounded cache left (earlier jspec
    versions) get an access time now."""
    path = Path(path)
    _stamp_entries(path)
    seed_autotune(path)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_compilation_cache_max_size", int(max_gib * 2**30))


# XLA's GEMM autotuning results for the shipped pair's programs (the README command's) and the 8B-shaped
# benchmark program (benchmarks/startup.py's "8b+draft") on an H200, the files XLA's per-fusion autotune cache
# wrote (one small proto per fusion, in a subfolder per GPU kind, named by a hash of the fusion's HLO), packed
# as one JSON of base64 contents per jaxlib version. Autotuning is most of a cold compile: with them in place
# the cold README command took 22.1-22.6 s against 33.9 s, the 8B program's compile 14.9 s against 22.9 s (H200,
# sessions 13 and 14, benchmarks/RESULTS.md). On another GPU or jaxlib no file matches and XLA autotunes as usual.
AUTOTUNE_DIR = Path(__file__).parent / "autotune"
PER_FUSION = "xla_gpu_per_fusion_autotune_cache_dir"  # where JAX points XLA's autotune cache in its cache dir


def seed_autotune(path: Path, source: Path | None = None) -> int:
    """Writes the shipped autotuning results of this jaxlib (source: a JSON of relative path -> base64
    contents) into the per-fusion autotune folder of the compilation cache at `path`, keeping files that
    are there already. Returns the number of files written."""
    import jaxlib

    source = source or AUTOTUNE_DIR / f"jaxlib-{jaxlib.__version__}.json"
    written = 0
    try:
        files = json.loads(source.read_text()) if source.is_file() else {}
        for name, data in files.items():
            dst = path / PER_FUSION / name
            if not dst.exists():  # written whole, then renamed: XLA never reads half a file
                dst.parent.mkdir(parents=True, exist_ok=True)
                tmp = dst.with_name(f".{dst.name}.{os.getpid()}")
                tmp.write_bytes(base64.b64decode(data))
                tmp.replace(dst)
                written += 1
    except (OSError, ValueError):  # an unwritable cache or a damaged file: XLA autotunes as without them
        pass
    return written


def _stamp_entries(path: Path) -> None:
    """Gives each `<key>-cache` entry without a `<key>-atime` file one (now, as 8 little-endian bytes of
    nanoseconds: the format of jax._src.lru_cache). Unwritable directories are left alone."""
    try:
        for entry in path.glob("*-cache"):
            atime = entry.with_name(entry.name.removesuffix("-cache") + "-atime")
            if not atime.exists():
                atime.write_bytes(time.time_ns().to_bytes(8, "little"))
    except OSError:
        pass


def _default_impl() -> str:
    return "pallas" if jax.default_backend() == "gpu" else "reference"


def _check_same_tokenizer(tok, dtok, cfg: ModelConfig, dcfg: ModelConfig) -> None:
    if cfg.vocab_size != dcfg.vocab_size or tok.get_vocab() != dtok.get_vocab():
        raise ConfigError("the draft model's tokenizer differs from the target's: they must share one")


def _rotate(params: Params, cfg: ModelConfig, model_dir: Path, kv: KVConfig, mode: str,
            rotations: str | Path | None) -> Params:
    """Applies the rotation of `mode` ("auto": OSCAR when a rotation file exists) for an int2 cache."""
    path = Path(rotations) if rotations else checkpoint.rotation_path(model_dir)
    if mode == "auto":
        mode = "oscar" if kv.int2 and path.is_file() else ("hadamard" if kv.int2 else "none")
    if mode == "none":
        return params
    rotation.check_head_dim(cfg.head_dim)
    if mode == "hadamard":
        rot_k, rot_v = rotation.hadamard_rotations(cfg)
    elif mode == "oscar":
        rot_k, rot_v, _ = rotation.load_rotations(path, cfg)
    else:
        raise ConfigError(f"unknown rotation {mode!r}; use none, hadamard or oscar")
    return _apply_rotations(params, cfg, rot_k, rot_v)


# One device program for the whole fold (run eagerly it was a dozen small ones, each compiled); the loaded
# params are donated, so the weights it leaves alone are not copied.
_apply_rotations = jax.jit(rotation.apply_rotations, static_argnums=1, donate_argnums=0)


def load(model: str | Path | None = None, draft: str | Path | None = "auto", *, kv: KVConfig = KVConfig("auto"),
         rotation_mode: str = "auto", rotations: str | Path | None = None, dtype: str = "bfloat16",
         attn_impl: str = "auto", mesh: str | jax.sharding.Mesh | None = "auto", scan_layers: bool = False) -> Engine:
    """Loads a target (default: the shipped code model) and a drafter from local Hugging Face directories
    or GGUF files (model.gguf: jspec.io.gguf; its rotations default to model.rotations.safetensors beside it).

    draft: a draft model's directory, or an EAGLE-3 head's (its config.json's architectures name
    LlamaForCausalLMEagle3: jspec.eagle3); "auto": the shipped draft when the shipped target is used;
    "ngram": prompt lookup, no model; "ngram+DIR" or "ngram+auto": the n-gram copy where a row has a
    match, the draft model elsewhere; None/"none": no speculation.

    kv "auto" is INT2 OSCAR when the target directory holds a rotation file, else BF16.
    mesh: "tp=N,dp=M", a Mesh, "auto" (every local device data-parallel) or None (jspec.sharding).
    scan_layers: the target's and draft's layers stacked (model.stack_layers), each forward one lax.scan: programs
    that compile ~4x and load ~17x faster, a decode step 0-6% slower in INT2 (BF16 11% at batch 1; H200, README).
    """
    model_dir = Path(model) if model else DEFAULT_TARGET
    if dtype not in ("bfloat16", "float32"):
        raise ConfigError(f"dtype must be bfloat16 or float32, got {dtype!r}")
    if rotations and not Path(rotations).is_file():  # whatever the kv mode: a named file must exist
        raise FileNotFoundError(f"rotation file {str(rotations)!r} does not exist")
    cfg, params, tok = checkpoint.load_model(model_dir, jnp.dtype(dtype))
    if kv.mode == "auto":
        has_rotations = (Path(rotations) if rotations else checkpoint.rotation_path(model_dir)).is_file()
        kv = dataclasses.replace(kv, mode="int2" if has_rotations else "bf16")
    kv.validate(cfg.head_dim)
    params = _rotate(params, cfg, model_dir, kv, rotation_mode, rotations)
    ngram, draft = _split_draft(draft)
    if draft == "auto":
        draft = DEFAULT_DRAFT if model_dir.resolve() == DEFAULT_TARGET.resolve() and DEFAULT_DRAFT.is_dir() else None
    draft_cfg = draft_params = head_cfg = head_params = None
    if draft not in (None, "none") and eagle3.is_head_dir(draft):
        if ngram:
            raise ConfigError("an EAGLE-3 head does not combine with ngram: give the head's directory alone")
        head_cfg, head_params = eagle3.load_head(draft, cfg, jnp.dtype(dtype))
    elif draft not in (None, "none"):
        draft_cfg, draft_params, dtok = checkpoint.load_model(draft, jnp.dtype(dtype))
        _check_same_tokenizer(tok, dtok, cfg, draft_cfg)
    if attn_impl not in ATTENTION_IMPLS:
        raise ConfigError(f"attn_impl must be one of {', '.join(ATTENTION_IMPLS)}, got {attn_impl!r}")
    impl = _default_impl() if attn_impl == "auto" else attn_impl
    mesh = sharding.resolve_mesh(mesh, cfg)
    if scan_layers:
        params = stack_layers(params)
        draft_params = None if draft_params is None else stack_layers(draft_params)
    if mesh is not None:  # placed once here; the per-call placement in _program_args is then a no-op
        params, draft_params = sharding.shard_params(params, cfg, mesh), sharding.replicate(draft_params, mesh)
        head_params = sharding.replicate(head_params, mesh)
    template = tok.chat_template if checkpoint.is_gguf(model_dir) else chat.template_of(model_dir)
    return Engine(cfg=cfg, params=params, tokenizer=tok, kv=kv, draft_cfg=draft_cfg, draft_params=draft_params,
                  dtype=dtype, attn_impl=impl, mesh=mesh, ngram=ngram, head_cfg=head_cfg, head_params=head_params,
                  chat_template=template)


def _split_draft(draft: str | Path | None) -> tuple[bool, str | Path | None]:
    """load's draft argument -> (n-gram drafting on, the draft model's directory, "auto" or None)."""
    if not isinstance(draft, str) or draft.partition("+")[0] != "ngram":
        return False, draft
    model = draft.partition("+")[2]
    if draft != "ngram" and not model:
        raise ConfigError("draft 'ngram+' needs a draft model after the '+': a directory or auto")
    return True, model or None
