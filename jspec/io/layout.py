"""How a jspec Layer maps to a checkpoint's tensors: their names, shapes and the fused fields (q/k/v, gate/up), shared
by the safetensors reader (checkpoint), the GGUF reader (gguf) and the EAGLE-3 format (eagle3)."""

from __future__ import annotations

import numpy as np

from jspec.config import ModelConfig
from jspec.model.decoder import Layer, fuse_qkv, unfuse_qkv


class CheckpointError(ValueError):
    """A model directory whose weights do not match its config."""


# jspec Layer field -> (its HF tensors under model.layers.{i}., transpose?). Fused fields (fuse_field):
# q/k/v into wqkv and bqkv, gate/up into w_gu.
LAYER_NAMES = {
    "attn_norm": (("input_layernorm.weight",), False),
    "wqkv": (("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), True),
    "wo": (("self_attn.o_proj.weight",), True),
    "mlp_norm": (("post_attention_layernorm.weight",), False),
    "w_gu": (("mlp.gate_proj.weight", "mlp.up_proj.weight"), True),
    "w_down": (("mlp.down_proj.weight",), True),
    "bqkv": (("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"), False),
    "bo": (("self_attn.o_proj.bias",), False),
    "b_gu": (("mlp.gate_proj.bias", "mlp.up_proj.bias"), False),
    "b_down": (("mlp.down_proj.bias",), False),
    "q_norm": (("self_attn.q_norm.weight",), False),
    "k_norm": (("self_attn.k_norm.weight",), False),
}


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Expected shapes of a layer's HF tensors as jspec reads them (transposed), per Layer field
    (only the fields this config has)."""
    E, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    Hq, Hkv = cfg.num_heads * D, cfg.num_kv_heads * D
    shapes = dict(attn_norm=((E,),), wqkv=((E, Hq), (E, Hkv), (E, Hkv)), wo=((Hq, E),), mlp_norm=((E,),),
                  w_gu=((E, F), (E, F)), w_down=((F, E),))
    if cfg.qkv_bias:
        shapes.update(bqkv=((Hq,), (Hkv,), (Hkv,)))
    if cfg.o_bias:
        shapes.update(bo=((E,),))
    if cfg.mlp_bias:
        shapes.update(b_gu=((F,), (F,)), b_down=((E,),))
    if cfg.qk_norm:
        shapes.update(q_norm=((D,),), k_norm=((D,),))
    return shapes


def fuse_field(field: str, parts, cfg: ModelConfig):
    """A Layer field from its HF tensors (transposed, numpy): one, or q/k/v (wqkv, bqkv) or gate/up (w_gu, b_gu)."""
    if field in ("wqkv", "bqkv"):
        return fuse_qkv(*parts, cfg, xp=np)
    return np.stack(parts, axis=-2) if field in ("w_gu", "b_gu") else parts[0]


def unfuse_field(field: str, x, cfg: ModelConfig):
    """fuse_field's inverse: the HF tensors (transposed) of a Layer field."""
    if field in ("wqkv", "bqkv"):
        return unfuse_qkv(x, cfg)
    return (x[..., 0, :], x[..., 1, :]) if field in ("w_gu", "b_gu") else (x,)


def read_layers(read, cfg: ModelConfig, dtype, tensor_name) -> Layer:
    """Every layer's fields read from a checkpoint and stacked on the host, [L, ...] (Params.layers):
    read(name, shape, transpose, dtype) -> a numpy array, and tensor_name(i, hf_name) -> the file's name of
    layer i's HF tensor hf_name (LAYER_NAMES)."""
    stacks = {}  # field -> [L, ...], filled in place: the host holds the weights once
    for i in range(cfg.num_layers):
        for field, shapes in layer_shapes(cfg).items():
            names, t = LAYER_NAMES[field]
            parts = [read(tensor_name(i, name), shape, t, dtype) for name, shape in zip(names, shapes)]
            x = fuse_field(field, parts, cfg)
            stacks.setdefault(field, np.empty((cfg.num_layers, *x.shape), x.dtype))[i] = x
    return Layer(**stacks)
