"""Hugging Face checkpoints <-> jspec params: local directories only, never the hub."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jspec import tokenizer
from jspec.config import ModelConfig, load_model_config
from jspec.model import Layer, Params, fuse_qkv, unfuse_qkv


class CheckpointError(ValueError):
    """A model directory whose weights do not match its config."""


# jspec Layer field -> (its HF tensors under model.layers.{i}., transpose?). Fused fields (_fuse):
# q/k/v into wqkv and bqkv, gate/up into w_gu.
LAYER_NAMES = {
    "attn_norm": (("input_layernorm.weight",), False),
    "wqkv": (("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), True),
    "wo": (("self_attn.o_proj.weight",), True),
    "mlp_norm": (("post_attention_layernorm.weight",), False),
    "w_gu": (("mlp.gate_proj.weight", "mlp.up_proj.weight"), True),
    "w_down": (("mlp.down_proj.weight",), True),
    "bqkv": (("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"), False),
    "q_norm": (("self_attn.q_norm.weight",), False),
    "k_norm": (("self_attn.k_norm.weight",), False),
}


def _layer_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Expected shapes of a layer's HF tensors as jspec reads them (transposed), per Layer field
    (only the fields this config has)."""
    E, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    Hq, Hkv = cfg.num_heads * D, cfg.num_kv_heads * D
    shapes = dict(attn_norm=((E,),), wqkv=((E, Hq), (E, Hkv), (E, Hkv)), wo=((Hq, E),), mlp_norm=((E,),),
                  w_gu=((E, F), (E, F)), w_down=((F, E),))
    if cfg.qkv_bias:
        shapes.update(bqkv=((Hq,), (Hkv,), (Hkv,)))
    if cfg.qk_norm:
        shapes.update(q_norm=((D,),), k_norm=((D,),))
    return shapes


def _fuse(field: str, parts, cfg: ModelConfig):
    """A Layer field from its HF tensors (transposed, numpy): one, or q/k/v (wqkv, bqkv) or gate/up (w_gu)."""
    if field in ("wqkv", "bqkv"):
        return fuse_qkv(*parts, cfg, xp=np)
    return np.stack(parts, axis=-2) if field == "w_gu" else parts[0]


def _unfuse(field: str, x, cfg: ModelConfig):
    """_fuse's inverse: the HF tensors (transposed) of a Layer field."""
    if field in ("wqkv", "bqkv"):
        return unfuse_qkv(x, cfg)
    return (x[..., 0, :], x[..., 1, :]) if field == "w_gu" else (x,)


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map")
    except (ValueError, AttributeError):  # not JSON (JSONDecodeError, UnicodeDecodeError), not an object
        weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: not a safetensors index (no 'weight_map' of tensor names to files)")
    return weight_map


def _open_tensors(model_dir: Path) -> dict[str, tuple[Path, str]]:
    """Maps every tensor name to its shard, from the index when there is one."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return {name: (model_dir / shard, name) for name, shard in _weight_map(index).items()}
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
    if info["dtype"] not in _DTYPES:
        raise ValueError(f"tensor {name!r}: dtype {info['dtype']!r} is not one jspec reads")
    dtype, shape, (lo, hi) = np.dtype(_DTYPES[info["dtype"]]), tuple(info["shape"]), info["data_offsets"]
    if hi - lo != dtype.itemsize * int(np.prod(shape)) or not 0 <= lo <= hi <= size:
        raise ValueError(f"tensor {name!r}: bytes {lo}..{hi} do not hold {shape} {info['dtype']} in {size} bytes")
    return dtype, shape, lo, hi


def _reader(tensors: dict):
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
    read = _reader(_open_tensors(Path(model_dir)))
    dtype = np.dtype(dtype)  # jnp.bfloat16 is ml_dtypes' bfloat16
    layers = []
    for i in range(cfg.num_layers):
        fields = {}
        for field, shapes in _layer_shapes(cfg).items():
            names, t = LAYER_NAMES[field]
            parts = [read(f"model.layers.{i}.{name}", shape, t, dtype) for name, shape in zip(names, shapes)]
            fields[field] = _fuse(field, parts, cfg)
        layers.append(Layer(**fields))
    E, V = cfg.hidden_size, cfg.vocab_size
    embed = read("model.embed_tokens.weight", (V, E), False, dtype)
    lm_head = None if cfg.tie_embeddings else read("lm_head.weight", (E, V), True, dtype)
    return Params(embed, tuple(layers), read("model.norm.weight", (E,), False, dtype), lm_head)


def load_params(model_dir: str | Path, cfg: ModelConfig, dtype=jnp.bfloat16) -> Params:
    """Reads HF safetensors into jspec Params in `dtype`, laid out on the host, then put on the device
    in one transfer."""
    return jax.device_put(host_params(model_dir, cfg, dtype))


# ------------------------------------------------------------------------------------------------


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def load_tokenizer(model_dir: str | Path):
    """The directory's tokenizer as transformers would build it, without importing it (jspec.tokenizer)."""
    if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {str(model_dir)!r}")
    try:
        return tokenizer.load_tokenizer(model_dir)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(f"no usable tokenizer in {str(model_dir)!r}: {first}") from None


def load_model(model_dir: str | Path, dtype=jnp.bfloat16, tokenizer: bool = True):
    """Loads (ModelConfig, Params, tokenizer or None) from a local Hugging Face directory or a GGUF file."""
    model_dir = Path(model_dir)
    if is_gguf(model_dir):
        from jspec.io import gguf

        return gguf.load_model(model_dir, dtype, tokenizer)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist")
    cfg = load_model_config(model_dir)
    params = load_params(model_dir, cfg, dtype)
    return cfg, params, load_tokenizer(model_dir) if tokenizer else None


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
    rope = {}
    if cfg.rope_llama3 is not None:
        # the 4.x spelling, which transformers 5 still reads (and so does config._rope_params)
        factor, low, high, orig = cfg.rope_llama3
        rope = {"rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                 "high_freq_factor": high, "original_max_position_embeddings": orig}}
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
        "attention_bias": cfg.qkv_bias,
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
    for i, lp in enumerate(params.layers):
        for field in _layer_shapes(cfg):
            names, t = LAYER_NAMES[field]
            for name, part in zip(names, _unfuse(field, getattr(lp, field), cfg)):
                out[f"model.layers.{i}.{name}"] = bf16(part, t)
    out["model.embed_tokens.weight"] = bf16(params.embed, False)
    out["model.norm.weight"] = bf16(params.norm, False)
    if params.lm_head is not None:
        out["lm_head.weight"] = bf16(params.lm_head, True)
    save_file(out, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps(hf_config(cfg), indent=2) + "\n")

