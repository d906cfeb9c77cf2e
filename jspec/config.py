"""Frozen configuration: the model (from a Hugging Face config.json), the KV cache and the run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# jspec.attention.attend's paths: the pure-jnp reference, or the split path with the Pallas INT2 kernel
# ("pallas"); "auto" picks pallas on GPU.
ATTENTION_IMPLS = ("auto", "reference", "pallas", "mosaic", "triton")  # pallas: mosaic on Hopper, else triton


class ConfigError(ValueError):
    """A configuration that jspec cannot run (bad value, unsupported architecture)."""


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
    max_position: int = 2048
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # Mistral; jspec attends to the full context, so runs must fit in it

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads


def model_config_from_hf(hf: dict) -> ModelConfig:
    """Builds a ModelConfig from the dict of a Hugging Face config.json."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"unsupported model_type {model_type!r}; jspec supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    eos = hf.get("eos_token_id")
    eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return ModelConfig(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(hf),
        rope_llama3=_rope_llama3(hf),
        max_position=hf.get("max_position_embeddings", 2048),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos,
        sliding_window=hf.get("sliding_window") if hf.get("use_sliding_window", True) else None,
    )


def _rope_params(hf: dict) -> dict:
    # transformers 5 moved rope settings into `rope_parameters`; 4.x used rope_theta/rope_scaling.
    return hf.get("rope_parameters") or hf.get("rope_scaling") or {}


def _rope_theta(hf: dict) -> float:
    return float(_rope_params(hf).get("rope_theta", hf.get("rope_theta", 10000.0)))


def _rope_llama3(hf: dict):
    rp = _rope_params(hf)
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ConfigError(f"unsupported rope scaling type {kind!r} (jspec supports default and llama3)")
    return (
        float(rp["factor"]),
        float(rp["low_freq_factor"]),
        float(rp["high_freq_factor"]),
        int(rp["original_max_position_embeddings"]),
    )


def load_model_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {str(model_dir)!r}")
    return model_config_from_hf(json.loads(path.read_text()))


@dataclasses.dataclass(frozen=True)
class KVConfig:
    """The target's KV cache: plain BF16, or OSCAR mixed (BF16 sink + BF16 recent + INT2 history).

    The attention rule: a query at position t reads key p in BF16 iff p < sink or p > t - recent,
    otherwise the INT2 (dequantized) copy. `mode="bf16"` keeps every key in BF16.
    """

    mode: str = "int2"  # "bf16" | "int2" ("auto" is resolved by jspec.load from the model directory)
    sink: int = 64
    recent: int = 256
    group_size: int | None = None  # None: one group per row (G = head_dim)
    clip_k: float = 0.96
    clip_v: float = 0.92
    scale_dtype: str = "bfloat16"  # "bfloat16" | "float32"

    @property
    def int2(self) -> bool:
        return self.mode == "int2"

    def validate(self, head_dim: int, lookahead: int = 0) -> None:
        if self.mode not in ("bf16", "int2"):
            raise ConfigError(f"unknown kv mode {self.mode!r}; use bf16 or int2")
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

    def validate(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")


MAX_LOOKAHEAD = 16  # K per round, at most


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    """One generate call: lengths, speculation and stopping."""

    max_new_tokens: int = 128
    # K draft tokens per round (0..MAX_LOOKAHEAD; ignored without a draft), or "auto": K (0 included) chosen
    # per call from costs measured on the device and the acceptance expected (jspec.lookahead)
    lookahead: int | str = "auto"
    stop_at_eos: bool = True  # False: a row runs to max_new_tokens, EOS or not

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.lookahead != "auto" and (not isinstance(self.lookahead, int) or isinstance(self.lookahead, bool)
                                         or not 0 <= self.lookahead <= MAX_LOOKAHEAD):
            raise ConfigError(f"lookahead must be 'auto' or an integer in 0..{MAX_LOOKAHEAD}, got {self.lookahead!r}")
