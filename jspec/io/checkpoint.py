"""Hugging Face checkpoints <-> jspec params: local directories only, never the hub."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jspec import files
from jspec.config import ConfigError, ModelConfig, load_model_config
from jspec.io import tokenizer
from jspec.io import memory
from jspec.io.layout import LAYER_NAMES, CheckpointError, layer_shapes, read_layers, unfuse_field
from jspec.model.decoder import Params


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map")
    except (ValueError, AttributeError):  # not JSON (JSONDecodeError, UnicodeDecodeError), not an object
        weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: not a safetensors index (no 'weight_map' of tensor names to files)")
    return weight_map


def open_tensors(model_dir: Path) -> dict[str, tuple[Path, str]]:
    """Maps every tensor name to its shard, from the index when there is one."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _weight_map(index)
        outside = [s for s in weight_map.values() if Path(s).is_absolute() or ".." in Path(s).parts or s in ("", ".")]
        if outside:
            raise CheckpointError(f"{index}: shard {outside[0]!r} is not a file inside the model directory")
        return {name: (model_dir / shard, name) for name, shard in weight_map.items()}
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors weights in {str(model_dir)!r}")
    names = {}
    for shard in shards:
        names.update({name: (shard, name) for name in _shard(shard)[0]})
    return names


# ------------------------------------------------------------------------------------------------
# Reading safetensors on the host. Weights are read, transposed, cast and fused with numpy and the
# whole Params tree is put on the device in one transfer: done with jax arrays, each of those steps
# was a small device program compiled on first use (about 58 of them, most of a 4 s load on GPU).

# safetensors dtype names -> numpy (bf16 from ml_dtypes, which jax depends on)
_DTYPES = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
           "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_}


def _shard(path: Path) -> tuple[dict, np.ndarray]:
    """(tensor name -> (dtype, shape, byte range), the data as read-only memory-mapped bytes) of one
    safetensors file: an 8-byte little-endian header length, the JSON header, then the raw tensors.
    A CheckpointError names the file when it is missing, truncated or not safetensors."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            size = path.stat().st_size - 8 - n  # bytes of tensor data
            if size < 0:
                raise ValueError(f"a header of {n} bytes does not fit in the file")
            header = json.loads(f.read(n))
        data = np.memmap(path, np.uint8, mode="r", offset=8 + n) if size else np.zeros(0, np.uint8)
        return {name: _entry(name, info, size) for name, info in header.items() if name != "__metadata__"}, data
    except (OSError, ValueError, struct.error, TypeError, KeyError, AttributeError) as e:  # ValueError: JSON, UTF-8
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def _entry(name: str, info: dict, size: int):
    if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
        raise ValueError(f"tensor {name!r}: dtype {info.get('dtype') if isinstance(info, dict) else info!r} is not "
                         "one jspec reads")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not _ints(shape) or not _ints(offsets) or len(offsets) != 2:
        raise ValueError(f"tensor {name!r}: shape {shape!r} and data_offsets {offsets!r} must be lists of "
                         "non-negative integers")
    dtype, shape, (lo, hi) = np.dtype(_DTYPES[info["dtype"]]), tuple(shape), offsets
    if hi - lo != dtype.itemsize * math.prod(shape) or not 0 <= lo <= hi <= size:
        raise ValueError(f"tensor {name!r}: bytes {lo}..{hi} do not hold {shape} {info['dtype']} in {size} bytes")
    return dtype, shape, lo, hi


def _ints(x) -> bool:
    """Whether x is a list of non-negative integers (JSON numbers such as 2.0 or true are not)."""
    return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in x)


def tensor_reader(tensors: dict):
    shards = {}

    def read(name: str, shape: tuple[int, ...], transpose: bool, dtype) -> np.ndarray:
        if name not in tensors:
            raise CheckpointError(f"missing tensor {name!r} in checkpoint")
        path, key = tensors[name]
        if path not in shards:
            shards[path] = _shard(path)
        header, data = shards[path]
        if key not in header:
            raise CheckpointError(f"{path}: cannot read tensor {name!r} (not in the file)")
        stored, stored_shape, lo, hi = header[key]
        x = data[lo:hi].view(stored).reshape(stored_shape)  # a view of the mapped file: nothing read yet
        x = x.T if transpose else x
        if x.shape != shape:
            raise CheckpointError(f"tensor {name!r} has shape {x.shape[::-1] if transpose else x.shape}, "
                                  f"expected {shape[::-1] if transpose else shape}")
        return x.astype(dtype, order="C")  # one pass: the transpose laid out, the cast rounded as XLA does

    return read


def host_params(model_dir: str | Path, cfg: ModelConfig, dtype=jnp.bfloat16) -> Params:
    """Reads HF safetensors (one file or index + shards) into jspec Params of numpy arrays in `dtype`."""
    tensors = open_tensors(Path(model_dir))
    read = tensor_reader(tensors)
    dtype = np.dtype(dtype)  # jnp.bfloat16 is ml_dtypes' bfloat16
    layers = read_layers(read, cfg, dtype, lambda i, name: f"model.layers.{i}.{name}")
    E, V = cfg.hidden_size, cfg.vocab_size
    embed = read("model.embed_tokens.weight", (V, E), False, dtype)
    if cfg.tie_embeddings and "lm_head.weight" in tensors:
        _check_tied(read, V, E, dtype)
    lm_head = None if cfg.tie_embeddings else read("lm_head.weight", (E, V), True, dtype)
    return Params(embed, layers, read("model.norm.weight", (E,), False, dtype), lm_head)


def _check_tied(read, V: int, E: int, dtype) -> None:
    """A tied model whose file also holds a different lm_head.weight: transformers then unties them and uses it,
    jspec would use the embedding; refused rather than run another model."""
    embed, head = (read(name, (V, E), False, dtype) for name in ("model.embed_tokens.weight", "lm_head.weight"))
    if not np.array_equal(embed, head):
        raise CheckpointError("config.json sets tie_word_embeddings but the checkpoint's lm_head.weight differs from "
                              "model.embed_tokens.weight (jspec does not untie them): set tie_word_embeddings to false")


def load_params(model_dir: str | Path, cfg: ModelConfig, dtype=jnp.bfloat16) -> Params:
    """Reads HF safetensors into jspec Params in `dtype`, laid out on the host, then put on the device
    in one transfer; first checks that they fit in the memory of both (memory.check_memory)."""
    need = weight_bytes(open_tensors(Path(model_dir)), dtype)
    memory.check_memory(need, memory.host_available(), memory.device_available(), np.dtype(dtype), str(model_dir))
    return jax.device_put(host_params(model_dir, cfg, dtype))


def weight_bytes(tensors: dict[str, tuple[Path, str]], dtype) -> int:
    """Bytes of every tensor of the checkpoint in `dtype` (from the shards' headers: nothing else is read)."""
    itemsize, total = np.dtype(dtype).itemsize, 0
    for shard in {path for path, _ in tensors.values()}:
        header = _shard(shard)[0]
        total += sum(math.prod(header[key][1]) * itemsize for path, key in tensors.values()
                     if path == shard and key in header)
    return total


# ------------------------------------------------------------------------------------------------


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def load_tokenizer(model_dir: str | Path):
    """The directory's tokenizer as transformers would build it, without importing it (jspec.io.tokenizer)."""
    if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {str(model_dir)!r}")
    try:
        return tokenizer.load_tokenizer(model_dir)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(f"no usable tokenizer in {str(model_dir)!r}: {first}") from None


def tokens_past_vocabulary(tok, vocab_size: int) -> dict[str, int]:
    """{token: id} of the tokenizer's tokens at or past the model's vocab_size (added tokens beyond the
    embedding; fine-tunes and small models often do not pad their vocabulary): such a model loads, and only a
    prompt or stop string that uses one is refused (runtime.engine.Engine.generate_ids). {} without a tokenizer or
    one with no vocabulary to list (a library user's minimal tokenizer may only decode)."""
    vocab = getattr(tok, "get_vocab", None)
    return {} if vocab is None else {t: i for t, i in vocab().items() if i >= vocab_size}


def load_model(model_dir: str | Path, dtype=jnp.bfloat16, tokenizer: bool = True):
    """Loads (ModelConfig, Params, tokenizer or None) from a local Hugging Face directory or a GGUF file."""
    model_dir = Path(model_dir)
    if is_gguf(model_dir):
        from jspec.io import gguf

        files.require(model_dir, "GGUF model file")
        return gguf.load_model(model_dir, dtype, tokenizer)
    files.require(model_dir, "model directory", "a directory")
    cfg = load_model_config(model_dir)
    tok = load_tokenizer(model_dir) if tokenizer else None
    return cfg, load_params(model_dir, cfg, dtype), tok


def is_gguf(path: str | Path) -> bool:
    """Whether a model path names a GGUF file (jspec.io.gguf) rather than a Hugging Face directory."""
    return Path(path).suffix.lower() == ".gguf"


def rotation_path(model: str | Path) -> Path:
    """Where a model's OSCAR rotations are by default: DIR/rotations.safetensors, or beside a GGUF file
    FILE.gguf as FILE.rotations.safetensors."""
    model = Path(model)
    return model.with_name(f"{model.stem}.rotations.safetensors") if is_gguf(model) else model / "rotations.safetensors"


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a jspec ModelConfig (Llama, Mistral, Qwen2 or Qwen3 architecture)."""
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}[cfg.model_type]
    eos = list(cfg.eos_token_ids)
    if cfg.model_type in ("llama", "qwen3") and cfg.qkv_bias != cfg.o_bias:
        raise ConfigError(f"a {cfg.model_type} config.json biases q, k, v and o together (attention_bias): "
                          f"qkv_bias={cfg.qkv_bias} with o_bias={cfg.o_bias} cannot be saved")
    if cfg.mlp_bias and cfg.model_type != "llama":
        raise ConfigError(f"a {cfg.model_type} config.json has no mlp_bias")
    rope = {}
    if cfg.rope_llama3 is not None:
        # the 4.x spelling, which transformers 5 still reads (and so does config._rope_params)
        factor, low, high, orig = cfg.rope_llama3
        rope = {"rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                 "high_freq_factor": high, "original_max_position_embeddings": orig}}
    elif cfg.rope_linear is not None:
        rope = {"rope_scaling": {"rope_type": "linear", "factor": cfg.rope_linear}}
    return {
        "architectures": [arch],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        **rope,
        "max_position_embeddings": cfg.max_position,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.o_bias if cfg.model_type in ("llama", "qwen3") else cfg.qkv_bias,
        "mlp_bias": cfg.mlp_bias,
        "hidden_act": "silu",
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "torch_dtype": "bfloat16",
    }


def save_hf(model_dir: str | Path, params: Params, cfg: ModelConfig) -> None:
    """Writes config.json + model.safetensors (bf16) that jspec and transformers both load."""
    from safetensors.flax import save_file  # jax arrays keep bf16 (numpy has no bf16)

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    bf16 = lambda x, t: jnp.asarray(x.T if t else x, jnp.bfloat16)
    for i in range(params.num_layers):
        lp = params.layer(i)
        for field in layer_shapes(cfg):
            names, t = LAYER_NAMES[field]
            for name, part in zip(names, unfuse_field(field, getattr(lp, field), cfg)):
                out[f"model.layers.{i}.{name}"] = bf16(part, t)
    out["model.embed_tokens.weight"] = bf16(params.embed, False)
    out["model.norm.weight"] = bf16(params.norm, False)
    if params.lm_head is not None:
        out["lm_head.weight"] = bf16(params.lm_head, True)
    save_file(out, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps(hf_config(cfg), indent=2) + "\n")

