"""Frozen configuration: the model (from a Hugging Face config.json), the KV cache and the run."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# jspec.attention.rule.attend's paths: the pure-jnp reference, or the split path with the Pallas INT2 kernel
# ("pallas"); "auto" picks pallas on GPU.
ATTENTION_IMPLS = ("auto", "reference", "pallas", "mosaic", "triton")  # pallas: mosaic on Hopper, else triton
INT32_MAX = 2**31 - 1  # lengths, top_k and token ids travel to the device as int32
UINT32_MAX = 2**32 - 1  # seeds travel as uint32
FLOAT32_MAX = 3.4028234663852886e38  # temperatures and top_p travel as float32
# K draft tokens per round: the verify forward widens with K, and on any draft worth running the chance
# that all K are accepted falls geometrically, so rounds beyond 16 never pay.
MAX_LOOKAHEAD = 16
# Below this a temperature is greedy in effect, and logits / temperature could overflow float32.
MIN_TEMPERATURE = 1e-4
EMPTY_PROMPT = "empty prompt: give at least one token"  # the library, the CLI and jobs alike
# Stop strings (GenerateConfig.stop, a job line's "stop"): each is matched on the device against every byte a
# round emits, so their count and length bound the per-round work (decode.stops).
MAX_STOPS = 16
MAX_STOP_BYTES = 64  # UTF-8 bytes of one stop string


# The device mesh's axes (jspec.runtime.sharding): batch rows over "dp", KV heads and MLP units over "tp".
DP, TP = "dp", "tp"


class ConfigError(ValueError):
    """A configuration that jspec cannot run (bad value, unsupported architecture)."""


class OutOfMemory(ConfigError):
    """A batch whose caches do not fit in the memory free (a smaller batch may)."""


def _plain_numbers(cfg) -> None:
    """Replaces numpy scalars in a frozen config's fields by Python ones (np.int64(2) -> 2), so that a value
    that passes validation behaves as an int or float everywhere after it (arithmetic, hashing, JSON)."""
    for field in dataclasses.fields(cfg):  # numpy registers its scalars with the numbers ABCs
        x = getattr(cfg, field.name)
        if isinstance(x, numbers.Integral) and type(x) not in (int, bool):
            object.__setattr__(cfg, field.name, int(x))
        elif isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral) and type(x) is not float:
            object.__setattr__(cfg, field.name, float(x))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of one Llama-family decoder."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    # llama3 rope scaling as a hashable tuple: (factor, low_freq_factor, high_freq_factor, original_max_pos)
    rope_llama3: tuple[float, float, float, int] | None = None
    rope_linear: float | None = None  # linear rope scaling's factor: positions / factor
    max_position: int = 2048
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2; Llama and Qwen3 with attention_bias
    o_bias: bool = False  # Llama and Qwen3 with attention_bias
    mlp_bias: bool = False  # Llama with mlp_bias: gate, up and down
    qk_norm: bool = False  # Qwen3
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # Mistral; jspec attends to the full context, so runs must fit in it

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def context(self) -> int:
        """The most tokens one row may hold: jspec has no sliding-window attention, so a Mistral-style
        model is exact only while a row fits in its window."""
        return min(self.max_position, self.sliding_window or self.max_position)


def model_config_from_hf(hf: dict) -> ModelConfig:
    """Builds a ModelConfig from the dict of a Hugging Face config.json (ConfigError names a bad field)."""
    if not isinstance(hf, dict):
        raise ConfigError(f"must be a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"unsupported model_type {model_type!r}; jspec supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    hidden, heads = _positive(hf, "hidden_size"), _positive(hf, "num_attention_heads")
    kv_heads = _positive(hf, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = _positive(hf, "head_dim", None) or hidden // heads
    if head_dim < 1:
        raise ConfigError(f"hidden_size {hidden} is smaller than num_attention_heads {heads}")
    act = hf.get("hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise ConfigError(f"field 'hidden_act' is {act!r}: jspec implements silu only")
    # transformers reads attention_bias (q, k, v and o) in Llama and Qwen3 and mlp_bias in Llama only; Qwen2 has
    # q, k, v biases always and Mistral none, whatever the config says
    attention_bias = _flag(hf, "attention_bias") and model_type in ("llama", "qwen3")
    mlp_bias = _flag(hf, "mlp_bias") and model_type == "llama"
    vocab = _positive(hf, "vocab_size")
    for name in ("bos_token_id", "eos_token_id"):
        past = [i for i in _token_ids(hf, name) if i >= vocab]
        if past:
            raise ConfigError(f"field {name!r} holds {past[0]}, past the vocabulary (vocab_size {vocab})")
    return ModelConfig(
        model_type=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_positive(hf, "intermediate_size"),
        num_layers=_positive(hf, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_eps=_positive(hf, "rms_norm_eps", 1e-6, integer=False),
        rope_theta=_rope_theta(hf),
        rope_llama3=_rope_llama3(hf),
        rope_linear=_rope_linear(hf),
        max_position=_positive(hf, "max_position_embeddings", 2048),
        tie_embeddings=_flag(hf, "tie_word_embeddings"),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias,
        mlp_bias=mlp_bias,
        qk_norm=model_type == "qwen3",
        bos_token_id=_token_ids(hf, "bos_token_id")[0] if hf.get("bos_token_id") is not None else None,
        eos_token_ids=_token_ids(hf, "eos_token_id"),
        sliding_window=_positive(hf, "sliding_window", None) if hf.get("use_sliding_window", True) else None,
    )


_REQUIRED = object()
SUPPORTED_ACTIVATIONS = ("silu", "swish")  # the same function in transformers' ACT2FN


def _flag(d: dict, name: str) -> bool:
    """d[name] as a bool, False when absent or null; a ConfigError names the field when it is not a bool."""
    x = d.get(name)
    if x is None:
        return False
    if not isinstance(x, bool):
        raise ConfigError(f"field {name!r} must be true or false, got {x!r}")
    return x


def _positive(d: dict, name: str, default=_REQUIRED, where: str = "", integer: bool = True):
    """d[name] as an integer (or a finite number) > 0: `default` when absent or null, required when
    there is none; a ConfigError names the field."""
    x = d.get(name)
    if x is None:
        if default is _REQUIRED:
            raise ConfigError(f"missing field '{where}{name}'")
        return default
    if isinstance(x, bool) or not isinstance(x, int if integer else (int, float)) or not 0 < x < math.inf:
        raise ConfigError(f"field '{where}{name}' must be a positive {'integer' if integer else 'number'}, got {x!r}")
    return x if integer else float(x)


def _token_ids(hf: dict, name: str) -> tuple[int, ...]:
    """A token id or a list of them (HF allows both for eos_token_id) as a tuple; () when absent."""
    x = hf.get(name)
    ids = () if x is None else tuple(x) if isinstance(x, list) else (x,)
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ConfigError(f"field {name!r} must be a token id or a list of them, got {x!r}")
    return ids


ROPE_KINDS = ("default", "linear", "llama3")  # transformers' rope_type values that jspec computes


def _rope_params(hf: dict) -> tuple[str, dict]:
    """(the key it came from, the rope block): transformers 5 writes `rope_parameters` into every config it saves,
    4.x wrote `rope_scaling`, and transformers reads `rope_scaling` first when both are there. Both present must
    agree on every setting they both name (the rope type included), else jspec cannot tell which one runs."""
    if hf.get("partial_rotary_factor", 1.0) != 1.0:  # transformers moves it into the rope block
        raise ConfigError(f"field 'partial_rotary_factor' is {hf['partial_rotary_factor']!r}: jspec rotates the "
                          "whole head")
    blocks = {}
    for key in ("rope_scaling", "rope_parameters"):
        rp = hf.get(key)
        if rp is not None and not isinstance(rp, dict):
            raise ConfigError(f"field {key!r} must be an object, got {rp!r}")
        if rp:
            blocks[key] = dict(rp, rope_type=_rope_kind(key, rp))
    if len(blocks) == 2:
        a, b = blocks.values()
        differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
        if differ:
            raise ConfigError(f"fields 'rope_scaling' and 'rope_parameters' disagree on {', '.join(differ)}: "
                              "keep one of them")
        return "rope_scaling", b | a
    return next(iter(blocks.items()), ("rope_parameters", {}))


def _rope_kind(key: str, rp: dict) -> str:
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise ConfigError(f"field '{key}' asks for rope scaling {kind!r}, which jspec does not implement "
                          f"(it implements {', '.join(ROPE_KINDS)})")
    factor = rp.get("partial_rotary_factor", 1.0)
    if factor != 1.0:
        raise ConfigError(f"field '{key}.partial_rotary_factor' is {factor!r}: jspec rotates the whole head")
    return kind


def _rope_theta(hf: dict) -> float:
    key, rp = _rope_params(hf)
    if "rope_theta" in rp:
        return _positive(rp, "rope_theta", where=f"{key}.", integer=False)
    return _positive(hf, "rope_theta", 10000.0, integer=False)


def _rope_llama3(hf: dict):
    key, rp = _rope_params(hf)
    if rp.get("rope_type") != "llama3":
        return None
    where = f"{key}."
    return (
        _positive(rp, "factor", where=where, integer=False),
        _positive(rp, "low_freq_factor", where=where, integer=False),
        _positive(rp, "high_freq_factor", where=where, integer=False),
        _positive(rp, "original_max_position_embeddings", where=where),
    )


def _rope_linear(hf: dict) -> float | None:
    key, rp = _rope_params(hf)
    return _positive(rp, "factor", where=f"{key}.", integer=False) if rp.get("rope_type") == "linear" else None


def load_model_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {str(model_dir)!r}")
    try:
        return model_config_from_hf(json.loads(path.read_bytes()))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


DEFAULT_CLIPS = (0.96, 0.92)  # key and value clip quantiles where neither the caller nor a rotation file sets one


@dataclasses.dataclass(frozen=True)
class KVConfig:
    """The target's KV cache: plain BF16, or OSCAR mixed (BF16 sink + BF16 recent + INT2 history).

    The attention rule: a query at position t reads key p in BF16 iff p < sink or p > t - recent,
    otherwise the INT2 (dequantized) copy. `mode="bf16"` keeps every key in BF16. `mode="window"`: the BF16 sink
    and a ring of the recent keys only, no history: a key outside the window is not attended at all (a drafter's
    cache whose size and cost stay flat with the context, and the self-draft's view of the target's cache).
    """

    mode: str = "int2"  # "bf16" | "int2" | "window" ("auto" is resolved by jspec.load from the model directory)
    sink: int = 64
    recent: int = 256
    group_size: int | None = None  # None: one group per row (G = head_dim)
    # Clip quantiles of the INT2 keys and values (clips: the pair in use). None: the rotation file's searched clip
    # where jspec.load finds one (jspec calibrate writes it), else DEFAULT_CLIPS.
    clip_k: float | None = None
    clip_v: float | None = None
    scale_dtype: str = "bfloat16"  # "bfloat16" | "float32"

    def __post_init__(self):
        _plain_numbers(self)

    @property
    def int2(self) -> bool:
        return self.mode == "int2"

    @property
    def clips(self) -> tuple[float, float]:
        """(clip_k, clip_v) with DEFAULT_CLIPS where unset."""
        return (DEFAULT_CLIPS[0] if self.clip_k is None else self.clip_k,
                DEFAULT_CLIPS[1] if self.clip_v is None else self.clip_v)

    @property
    def windowed(self) -> bool:
        """Only the sink and the recent window are attended (no history)."""
        return self.mode == "window"

    def check_values(self) -> None:
        """The checks that need no model ("auto" is still a mode here)."""
        if self.mode not in ("auto", "bf16", "int2", "window"):
            raise ConfigError(f"unknown kv mode {self.mode!r}; use bf16 or int2")
        for name, value in zip(("clip_k", "clip_v"), self.clips):  # a quantile: 1 (the row's maximum) or <= 0 disables
            check_number(name, value, -FLOAT32_MAX, 1.0)
        check_int("sink", self.sink, 0, INT32_MAX)
        check_int("recent", self.recent, 1, INT32_MAX)
        if self.group_size is not None:
            check_int("group_size", self.group_size, 1, INT32_MAX)

    def validate(self, head_dim: int, lookahead: int = 0) -> None:
        if self.mode not in ("bf16", "int2", "window"):
            raise ConfigError(f"unknown kv mode {self.mode!r}; use bf16 or int2")
        self.check_values()
        if not self.int2:
            return
        if self.sink < 0 or self.recent < 1:
            raise ConfigError(f"invalid windows: sink={self.sink} must be >= 0 and recent={self.recent} >= 1")
        if self.recent <= lookahead:
            raise ConfigError(
                f"recent window {self.recent} must exceed the lookahead {lookahead}: verified candidates"
                " are attended in BF16"
            )
        if head_dim % 4:
            raise ConfigError(f"head_dim {head_dim} must be a multiple of 4 for INT2 packing")
        g = self.group(head_dim)
        if g < 1 or head_dim % g:
            raise ConfigError(f"group size {g} must divide head_dim {head_dim}")
        if self.scale_dtype not in ("bfloat16", "float32"):
            raise ConfigError(f"scale dtype {self.scale_dtype!r} must be bfloat16 or float32")

    def group(self, head_dim: int) -> int:
        return self.group_size or head_dim


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0

    def __post_init__(self):
        _plain_numbers(self)

    def validate(self) -> None:
        check_number("temperature", self.temperature, 0.0, FLOAT32_MAX)
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ConfigError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE}, got {self.temperature}")
        check_int("top_k", self.top_k, 0, INT32_MAX)  # above the vocabulary size it keeps every token
        check_number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_int("seed", self.seed, 0, UINT32_MAX)


@dataclasses.dataclass(frozen=True)
class DraftSpec:
    """A drafter as load's draft argument and the CLI's --draft name it: "ngram" (the copy alone), "ngram+X" (the
    copy where a row has a match, X elsewhere) or X alone, where X is a draft model's or head's directory, "auto",
    "self", "none" or a registered drafter's name (decode.drafters.registry)."""

    copies: bool  # the n-gram copy in front
    model: str | Path | None  # X; None: the copy alone (or no drafter)

    @classmethod
    def parse(cls, draft: str | Path | None) -> DraftSpec:
        """ConfigError for "ngram+" with nothing after the '+'."""
        if not isinstance(draft, str) or draft.partition("+")[0] != "ngram":
            return cls(False, draft)
        model = draft.partition("+")[2]
        if draft != "ngram" and not model:
            raise ConfigError("draft 'ngram+' needs a draft model after the '+': a directory, auto or self")
        return cls(True, model or None)

    def mode(self, model_mode: str | None) -> str:
        """The drafter's name when X drafts as model_mode ("model", "self", ...; None: no X)."""
        if model_mode is None:
            return "ngram" if self.copies else "none"
        return f"ngram+{model_mode}" if self.copies else model_mode


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    """One generate call: lengths, speculation and stopping."""

    max_new_tokens: int = 128
    # K draft tokens per round (0..MAX_LOOKAHEAD; ignored without a draft), or "auto": K (0 included) chosen
    # per call from costs measured on the device and the acceptance expected (jspec.runtime.lookahead)
    lookahead: int | str = "auto"
    stop_at_eos: bool = True  # False: a row runs to max_new_tokens, EOS or not
    # The text ends right before the first stop string generated (decode.stops); the row stops generating in the
    # round that completes it. A tuple of non-empty str; a str or a list is taken as the tuple of it (stop_tuple).
    stop: tuple[str, ...] = ()
    # Token healing (decode.healing): each prompt's last token backed off and the first generated token made to
    # start with its text, so that a prompt ending in "\n" or mid-word continues as its text would. Off here, so
    # that the library runs the exact token ids it is given; the CLI and jobs turn it on (--no-heal turns it off).
    heal: bool = False

    def __post_init__(self):
        _plain_numbers(self)
        object.__setattr__(self, "stop", stop_tuple(self.stop))

    def validate(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens, 1, INT32_MAX)
        check_stops(self.stop)
        if not isinstance(self.heal, bool):
            raise ConfigError(f"heal must be True or False, got {self.heal!r}")
        K = self.lookahead
        if K != "auto" and (isinstance(K, bool) or not isinstance(K, numbers.Integral) or not 0 <= K <= MAX_LOOKAHEAD):
            raise ConfigError(f"lookahead must be 'auto' or in [0, {MAX_LOOKAHEAD}], got {K!r}: compile time grows "
                              "with K and longer rounds never pay")


def stop_tuple(stop):
    """A stop value as the tuple check_stops takes: one string -> a 1-tuple, a list -> a tuple, else as given."""
    return (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else stop


def check_stops(stop) -> None:
    """ConfigError unless stop is a tuple of at most MAX_STOPS non-empty str of at most MAX_STOP_BYTES UTF-8
    bytes each."""
    if not isinstance(stop, tuple) or not all(isinstance(s, str) for s in stop):
        raise ConfigError(f"stop must be a tuple of strings, got {stop!r}")
    if len(stop) > MAX_STOPS:
        raise ConfigError(f"at most {MAX_STOPS} stop strings, got {len(stop)}")
    for s in stop:
        if not s:
            raise ConfigError("a stop string must not be empty")
        try:
            size = len(s.encode("utf-8"))
        except UnicodeEncodeError:
            raise ConfigError(f"stop string {s!r} is not valid Unicode (a lone surrogate)") from None
        if "\ufffd" in s:  # decoded text holds U+FFFD for bytes that are not text yet: it would match those
            raise ConfigError(f"stop string {s!r} holds U+FFFD, the replacement character, which stands for bytes "
                              "that are not (yet) text and matches no generated character")
        if size > MAX_STOP_BYTES:
            raise ConfigError(f"a stop string may have at most {MAX_STOP_BYTES} UTF-8 bytes, got {size}: {s[:20]!r}...")


def check_int(name: str, x, low: int, high: int) -> None:
    """ConfigError unless x is an integer (not a bool) in [low, high]."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {x!r}")
    if not low <= x <= high:
        raise ConfigError(f"{name} must be in [{low}, {high}], got {x}")


def check_number(name: str, x, low: float, high: float, low_open: bool = False) -> None:
    """ConfigError unless x is a finite real number in [low, high] ((low, high] when low_open)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ConfigError(f"{name} must be a number, got {x!r}")
    if not math.isfinite(x):
        raise ConfigError(f"{name} must be finite, got {x}")
    if not (low < x if low_open else low <= x) or x > high:
        raise ConfigError(f"{name} must be in {'(' if low_open else '['}{low:g}, {high:g}], got {x}")


@dataclasses.dataclass(frozen=True)
class Options:
    """How a program is built, not what it computes: which parts run as fused kernels, and group and chunk
    sizes. A field of every program's static arguments (decode.state.Models), so that jit and the program
    store key each program by it. The defaults are what runs; benchmarks and tests build others for A/B runs.

    The fused switches: None, where the kernel pays (a GPU, outside a mesh: a Pallas call takes whole
    arrays, which GSPMD cannot split); True, always (interpret mode off a GPU: the tests); False, never.
    """

    # The INT2 commit as one Pallas kernel (kernels/int2_commit.py) where a row is one group: 0.34 ms off the 8B
    # step at batch 1 / 128K as a kernel per layer, 0.11 ms more as one for all layers (H200, docs/kernels.md).
    fused_commit: bool | None = None
    # The BF16 window parts and the merge as two Pallas kernels per layer (kernels/window_merge.py) where XLA runs
    # about nine small ones: 1.04-1.05x per 8B step (H200).
    fused_window: bool | None = None
    # The residual adds and the norms after them in one Pallas kernel each (kernels/add_norm.py), for models at
    # least FUSED_NORM_WIDTH wide (narrower ones stay in XLA, whose fusions the shipped autotuning covers).
    fused_norms: bool | None = None
    # The prompt runs through the models in chunks of at most this many tokens (a loop inside the program), so
    # one program serves every prompt length up to the capacity; at most the default recent window, else a chunk
    # would read its own older rows as INT2.
    prefill_chunk: int = 256
    # The forward's loop over the stacked layers, lax.scan's unroll: True, every layer's ops laid out in the
    # program; an int U, U layers per trip of a rolled loop (1: one layer's ops, a program that compiles about 2x
    # (CPU) to 4x (H200) and loads 17x faster). None: True on a GPU, where the rolled 8B step was 0.94-1.01x as
    # fast (H200), 1 on the CPU, where the rolled step was as fast or faster (docs/design.md).
    layer_unroll: bool | int | None = None
    # The JAX platform the programs are built for ("gpu", "cpu"): the fused switches' auto choice and the kernels'
    # interpret mode follow it. engine.load decides it once (default_platform); None asks JAX where it is read.
    platform: str | None = None

    def __post_init__(self):
        if self.platform is not None and not (isinstance(self.platform, str) and self.platform):
            raise ConfigError(f"platform must be None or a JAX platform name such as 'gpu', got {self.platform!r}")
        for name in ("fused_commit", "fused_window", "fused_norms"):
            if getattr(self, name) not in (None, True, False):
                raise ConfigError(f"{name} must be None (auto), True or False, got {getattr(self, name)!r}")
        if self.layer_unroll is not None and not isinstance(self.layer_unroll, bool):
            check_int("layer_unroll", self.layer_unroll, 1, INT32_MAX)
        check_int("prefill_chunk", self.prefill_chunk, 1, INT32_MAX)

    @property
    def backend(self) -> str:
        """The platform the programs are built for: platform, else JAX's default backend (default_platform)."""
        return self.platform or default_platform()

    @property
    def gpu(self) -> bool:
        """Whether the programs are built for a GPU (backend)."""
        return self.backend == "gpu"

    @property
    def unroll(self) -> bool | int:
        """lax.scan's unroll for the layer loop: layer_unroll, or where None, all layers on a GPU, one elsewhere."""
        if self.layer_unroll is not None:
            return self.layer_unroll
        return True if self.gpu else 1


def default_platform() -> str:
    """JAX's default backend: the one place jspec asks which platform it runs on. jspec.load asks once and the
    value travels in Options.platform; what stands outside any program's options (the program store, the Mosaic
    kernels' priming, attend_split called with no interpret) asks here. jax is imported here, not with config:
    `jspec generate --help` imports no jax."""
    import jax

    return jax.default_backend()


FUSED_NORM_WIDTH = 1024  # measured to pay at 4096 (the 8B shape); the shipped pair (384, 256) stays in XLA
