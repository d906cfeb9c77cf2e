"""GGUF files (llama.cpp's format) -> jspec: the config, the weights and the tokenizer of one file.

Read as transformers reads a GGUF (`from_pretrained(dir, gguf_file=...)`, its legacy loader for these
architectures), with the `gguf` package: the header memory-mapped by gguf.GGUFReader, each tensor
dequantized on the host by gguf.quants.dequantize, then laid out as jspec Params like a safetensors
checkpoint (jspec.io.checkpoint). What transformers does, and so does this module:
- the config from the `<arch>.*` keys (head_dim from rope.dimension_count for llama; the word
  embeddings tied when there is no output.weight; a llama file named "mistral" is a Mistral). No
  rope scaling is read: llama.cpp keeps Llama 3.1's as a rope_freqs tensor, which transformers skips;
- for the llama architecture, the q and k projections un-permuted (llama.cpp's converter interleaves
  the two halves of each head's rotary dimensions);
- the tokenizer rebuilt from the `tokenizer.ggml.*` keys with the `tokenizers` library (gpt2 byte-level
  BPE or llama sentencepiece-style BPE), its special tokens and `tokenizer.chat_template`.
A file that is truncated or lies about its contents is a CheckpointError (ConfigError for an
unsupported architecture or bad config values); sizes are checked against the file before anything
is dequantized. tests/test_gguf.py compares logits and tokens with transformers.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from jspec.io import memory
from jspec.io.layout import CheckpointError, read_layers
from jspec.config import ConfigError, ModelConfig, model_config_from_hf
from jspec.model.decoder import Params

ARCHITECTURES = ("llama", "qwen2", "qwen3")  # general.architecture; Mistral files say llama
# The ggml types jspec dequantizes (all with gguf.quants.dequantize; tests/test_gguf.py checks each).
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# HF tensor names (jspec.io.layout.LAYER_NAMES, under model.layers.{i}.) -> GGUF (under blk.{i}.)
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}
# Errors the gguf package raises on a malformed file (it has no error type of its own).
_READ_ERRORS = (ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error, UnicodeDecodeError,
                MemoryError, AssertionError)


def open_gguf(path: str | Path):
    """gguf.GGUFReader over the file (memory-mapped: no tensor is read yet); CheckpointError when the
    header cannot be parsed."""
    try:
        import gguf
    except ImportError:
        raise ConfigError("reading GGUF files needs the gguf package: pip install -e '.[real]' in the clone") from None
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    try:
        return gguf.GGUFReader(path)
    except _READ_ERRORS as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def load_model(path: str | Path, dtype, tokenizer: bool = True):
    """(ModelConfig, Params on the device, jspec Tokenizer or None) of a GGUF file; the tokenizer carries
    the file's chat template as `chat_template` (None without one)."""
    import jax

    reader = open_gguf(path)
    cfg = model_config(reader)
    need = sum(int(t.n_elements) for t in reader.tensors) * np.dtype(dtype).itemsize
    memory.check_memory(need, memory.host_available(), memory.device_available(), np.dtype(dtype), str(path))
    params = jax.device_put(host_params(reader, cfg, dtype))
    return cfg, params, load_tokenizer(reader, cfg) if tokenizer else None


def chat_template(path: str | Path) -> str | None:
    """The file's `tokenizer.chat_template`, None without one."""
    template = _value(open_gguf(path), "tokenizer.chat_template", None)
    return template if isinstance(template, str) else None


_REQUIRED = object()


def _value(reader, key: str, default=_REQUIRED):
    """A metadata value as Python (str, int, float, bool or a list); CheckpointError when unreadable."""
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise ConfigError(f"{reader.data.filename}: missing GGUF metadata key {key!r}")
        return default
    try:
        return field.contents()
    except _READ_ERRORS as e:
        raise CheckpointError(f"{reader.data.filename}: GGUF metadata key {key!r} is unreadable ({e})") from None


# ------------------------------------------------------------------------------------------------
# The config


def hf_config(reader) -> dict:
    """The config.json dict transformers builds from the file's metadata (GGUF_CONFIG_MAPPING)."""
    arch = _value(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{reader.data.filename}: unsupported GGUF architecture {arch!r}; jspec reads "
                          f"{', '.join(ARCHITECTURES)} (Mistral files are llama)")
    get = lambda key, default=None: _value(reader, f"{arch}.{key}", default)
    model_type = "mistral" if arch == "llama" and _value(reader, "general.name", None) == "mistral" else arch
    names = {t.name for t in reader.tensors}
    hf = {
        "model_type": model_type,
        "max_position_embeddings": get("context_length"),
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "hidden_size": get("embedding_length"),
        "rope_theta": get("rope.freq_base"),
        "num_attention_heads": get("attention.head_count"),
        "num_key_value_heads": get("attention.head_count_kv"),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "vocab_size": get("vocab_size") or len(_value(reader, "tokenizer.ggml.tokens", ())),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _value(reader, "tokenizer.ggml.bos_token_id", None),
        "eos_token_id": _value(reader, "tokenizer.ggml.eos_token_id", None),
    }
    if arch == "llama":  # transformers reads head_dim from rope.dimension_count for llama only
        hf["head_dim"] = get("rope.dimension_count")
    elif arch == "qwen3":  # and Qwen3Config's head_dim defaults to 128 (every Qwen3's)
        hf["head_dim"] = get("attention.key_length", 128)
    if model_type == "mistral":
        hf["sliding_window"] = 4096  # MistralConfig's default: the file has no key for it
    else:
        hf["use_sliding_window"] = False
    return {k: v for k, v in hf.items() if v is not None}


def model_config(reader) -> ModelConfig:
    try:
        return model_config_from_hf(hf_config(reader))
    except ConfigError as e:
        prefix = f"{reader.data.filename}: "
        raise ConfigError(str(e) if str(e).startswith(prefix) else prefix + str(e)) from None


# ------------------------------------------------------------------------------------------------
# The weights


def _tensor_reader(reader, cfg: ModelConfig):
    """read(gguf name, shape as jspec reads it, transpose?, dtype) -> numpy array, checked against the
    file before it is dequantized."""
    import gguf

    tensors = {t.name: t for t in reader.tensors}
    size = reader.data.size
    permute = _value(reader, "general.architecture") == "llama"

    def read(name: str, shape: tuple[int, ...], transpose: bool, dtype) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise CheckpointError(f"missing tensor {name!r} in {reader.data.filename}")
        stored = tuple(int(n) for n in reversed(t.shape))  # ggml lists dimensions innermost first
        want = shape[::-1] if transpose else shape
        kind = getattr(t.tensor_type, "name", str(t.tensor_type))
        if kind not in TYPES:
            raise CheckpointError(f"tensor {name!r} is stored as ggml type {kind}, which jspec does not read "
                                  f"(it reads {', '.join(TYPES)})")
        block, block_bytes = gguf.GGML_QUANT_SIZES[t.tensor_type]
        n = math.prod(stored)
        if n % block or int(t.n_bytes) != n // block * block_bytes or int(t.data_offset) + int(t.n_bytes) > size:
            raise CheckpointError(f"tensor {name!r}: {kind} {stored} does not fit its {int(t.n_bytes)} bytes at "
                                  f"offset {int(t.data_offset)} of a {size}-byte file")
        if stored != want:
            raise CheckpointError(f"tensor {name!r} has shape {stored}, expected {want}")
        x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type)).reshape(stored)
        if permute and (".attn_q." in name or ".attn_k." in name):
            x = _unpermute(x, cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads)
        x = x.T if transpose else x
        return x.astype(dtype, order="C")  # the transpose laid out, the cast rounded as XLA does

    return read


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's permute of a q or k projection [heads * D, ...] (or its bias): its converter
    stores each head's rows as (D/2, 2) interleaved where HF has (2, D/2) halves (rotate-half RoPE)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def host_params(reader, cfg: ModelConfig, dtype) -> Params:
    """The file's weights as jspec Params of numpy arrays in `dtype` (jspec.io.checkpoint.host_params's
    layout: q/k/v and gate/up fused, matrices transposed to [in, out])."""
    read = _tensor_reader(reader, cfg)
    dtype = np.dtype(dtype)
    layers = read_layers(read, cfg, dtype, lambda i, name: f"blk.{i}.{LAYER_TENSORS[name]}")
    E, V = cfg.hidden_size, cfg.vocab_size
    embed = read("token_embd.weight", (V, E), False, dtype)
    lm_head = None if cfg.tie_embeddings else read("output.weight", (E, V), True, dtype)
    return Params(embed, layers, read("output_norm.weight", (E,), False, dtype), lm_head)


# ------------------------------------------------------------------------------------------------
# The tokenizer


def load_tokenizer(reader, cfg: ModelConfig):
    """The tokenizer transformers builds from the file (AutoTokenizer.from_pretrained(dir, gguf_file=...)),
    as a jspec Tokenizer; ConfigError for a tokenizer model other than gpt2 or llama."""
    from jspec.io.gguf_tokenizer import build

    meta = {key: _value(reader, f"tokenizer.ggml.{key}", None)
            for key in ("model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id", "eos_token_id",
                        "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token")}
    try:
        tok = build(meta, cfg.model_type)
    except ConfigError as e:
        raise ConfigError(f"{reader.data.filename}: {e}") from None
    template = _value(reader, "tokenizer.chat_template", None)
    tok.chat_template = template if isinstance(template, str) else None
    return tok
