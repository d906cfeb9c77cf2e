"""EAGLE-3 head checkpoints in the format SGLang and vLLM load (`LlamaForCausalLMEagle3`), in and out.

A head directory holds a config.json whose `architectures` names LlamaForCausalLMEagle3 and safetensors:
  fc.weight                                       [E, 3E]   fuses the target's three tapped hidden states
  midlayer.input_layernorm.weight                 [E]       on the token embedding
  midlayer.hidden_norm.weight                     [E]       on the feature
  midlayer.self_attn.{q,k,v}_proj.weight          [Hq*D or Hkv*D, 2E]  (embedding half, then feature half)
  midlayer.self_attn.o_proj.weight                [E, Hq*D]
  midlayer.post_attention_layernorm.weight        [E]
  midlayer.mlp.{gate,up}_proj.weight              [F, E];  midlayer.mlp.down_proj.weight [E, F]
  norm.weight                                     [E]
  lm_head.weight                                  [Vd, E]   Vd = draft_vocab_size (default vocab_size)
  d2t                                             [Vd] int64: draft token i is target token i + d2t[i]
  t2d                                             [V] bool: which target tokens the draft vocabulary has
  embed_tokens.weight (optional)                  [V, E]    else the target's embedding is used
(PyTorch's [out, in] layout, as vLLM's llama_eagle3.py and SpecForge's llama3_eagle.py read them.)
The target layers come from `eagle_config.eagle_aux_hidden_state_layer_ids` (or the top-level key of the
same name), in vLLM's convention (id j: the hidden state entering layer j), else vLLM's default.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jspec.config import ConfigError, ModelConfig, model_config_from_hf
from jspec.io.checkpoint import open_tensors, tensor_reader
from jspec.io.layout import LAYER_NAMES, CheckpointError, fuse_field, unfuse_field
from jspec.model.decoder import Layer
from jspec.model.head import HeadConfig, HeadParams, check_fits, check_taps, default_taps

ARCHITECTURE = "LlamaForCausalLMEagle3"
# Layer field -> its tensors under midlayer.: the names of an HF decoder layer (PyTorch [out, in]: transposed
# on reading); the head has no biases or q/k norms.
_MIDLAYER = {f: LAYER_NAMES[f] for f in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gu", "w_down")}


def read_config(head_dir: str | Path) -> dict | None:
    """The directory's config.json as a dict, or None when there is none or it is not a JSON object."""
    try:
        hf = json.loads((Path(head_dir) / "config.json").read_bytes())
    except (OSError, ValueError):
        return None
    return hf if isinstance(hf, dict) else None


def is_head_dir(path: str | Path) -> bool:
    """Whether a directory holds an EAGLE-3 head (its config's architectures name LlamaForCausalLMEagle3)."""
    hf = read_config(path) if Path(path).is_dir() else None
    archs = hf.get("architectures") if hf else None
    return isinstance(archs, list) and ARCHITECTURE in archs


def head_config_from_hf(hf: dict, target: ModelConfig) -> HeadConfig:
    """The HeadConfig of a head's config.json for this target; ConfigError names what does not fit, or what the
    config asks for that jspec's head does not compute."""
    layers = hf.get("num_hidden_layers", 1)
    if layers != 1 or isinstance(layers, bool):
        raise ConfigError(f"field 'num_hidden_layers' is {layers!r}: jspec's EAGLE-3 head has exactly one layer")
    hf = dict(hf, model_type="llama", num_hidden_layers=1)
    layer = model_config_from_hf(hf)
    if layer.qkv_bias or layer.o_bias or layer.mlp_bias:
        name = "attention_bias" if layer.qkv_bias else "mlp_bias"
        raise ConfigError(f"field {name!r} is true: jspec's EAGLE-3 head reads no biases")
    # the head attends over the target's whole context (vLLM ignores the head's own max_position too)
    # and its special tokens are the target's business
    layer = dataclasses.replace(layer, max_position=target.max_position, sliding_window=None, bos_token_id=None,
                                eos_token_ids=())
    target_hidden = hf.get("target_hidden_size", target.hidden_size)
    if target_hidden != target.hidden_size:
        raise ConfigError(f"the head's target_hidden_size {target_hidden} does not fit the target's hidden_size "
                          f"{target.hidden_size}")
    taps = _taps(hf) or default_taps(target.num_layers)
    draft_vocab = hf.get("draft_vocab_size") or layer.vocab_size
    if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or draft_vocab < 1:
        raise ConfigError(f"field 'draft_vocab_size' must be a positive integer, got {draft_vocab!r}")
    hcfg = HeadConfig(layer, draft_vocab, taps)
    check_fits(hcfg, target)  # sizes first, then the taps
    return dataclasses.replace(hcfg, taps=check_taps(taps, target.num_layers))


def _taps(hf: dict) -> tuple | None:
    """eagle_aux_hidden_state_layer_ids from eagle_config (or the top level), None when neither sets them; a value
    of another type, or an EAGLE-3 head without the aux hidden states (use_aux_hidden_state false: EAGLE-1/2's
    input), is a ConfigError naming the field."""
    eagle = hf.get("eagle_config")
    eagle = {} if eagle is None else eagle
    if not isinstance(eagle, dict):
        raise ConfigError(f"field 'eagle_config' must be an object, got {eagle!r}")
    if eagle.get("use_aux_hidden_state", True) is not True:
        raise ConfigError(f"field 'eagle_config.use_aux_hidden_state' is {eagle['use_aux_hidden_state']!r}: jspec's "
                          "EAGLE-3 head fuses the target's aux hidden states")
    key = "eagle_aux_hidden_state_layer_ids"
    where, taps = (f"eagle_config.{key}", eagle[key]) if eagle.get(key) is not None else (key, hf.get(key))
    if taps is not None and not (isinstance(taps, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                                                 for t in taps)):
        raise ConfigError(f"field {where!r} must be a list of layer indices, got {taps!r}")
    return tuple(taps) if taps else None


def host_head(head_dir: Path, hcfg: HeadConfig, dtype) -> HeadParams:
    """The head's tensors read into HeadParams of numpy arrays (CheckpointError names a bad tensor)."""
    cfg = hcfg.layer
    E, F, D, V, Vd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.vocab_size, hcfg.draft_vocab
    Hq, Hkv = cfg.num_heads * D, cfg.num_kv_heads * D
    tensors = open_tensors(head_dir)
    read = tensor_reader(tensors)
    dtype = np.dtype(dtype)
    shapes = dict(attn_norm=((E,),), wqkv=((2 * E, Hq), (2 * E, Hkv), (2 * E, Hkv)), wo=((Hq, E),),
                  mlp_norm=((E,),), w_gu=((E, F), (E, F)), w_down=((F, E),))
    fields = {}
    for field, (names, t) in _MIDLAYER.items():
        parts = [read(f"midlayer.{name}", shape, t, dtype) for name, shape in zip(names, shapes[field])]
        fields[field] = fuse_field(field, parts, cfg)
    d2t = None
    if Vd != V or "d2t" in tensors:
        d2t = read("d2t", (Vd,), False, np.int64)
        ids = np.arange(Vd) + d2t
        if ids.min() < 0 or ids.max() >= V or len(np.unique(ids)) != Vd:
            raise CheckpointError(f"tensor 'd2t' maps the draft vocabulary outside the target's {V} tokens or "
                                  "onto one token twice")
        d2t = d2t.astype(np.int32)
    embed = read("embed_tokens.weight", (V, E), False, dtype) if "embed_tokens.weight" in tensors else None
    return HeadParams(fc=read("fc.weight", (len(hcfg.taps) * E, E), True, dtype), layer=Layer(**fields),
                      hidden_norm=read("midlayer.hidden_norm.weight", (E,), False, dtype),
                      norm=read("norm.weight", (E,), False, dtype),
                      lm_head=read("lm_head.weight", (E, Vd), True, dtype),
                      d2t=d2t, embed=embed)


def load_head(head_dir: str | Path, target: ModelConfig, dtype=jnp.bfloat16) -> tuple[HeadConfig, HeadParams]:
    """(HeadConfig, HeadParams on the device) of an EAGLE-3 head directory, checked against the target."""
    head_dir = Path(head_dir)
    hf = read_config(head_dir)
    if hf is None:
        raise FileNotFoundError(f"no readable config.json (a JSON object) in {str(head_dir)!r}")
    try:
        hcfg = head_config_from_hf(hf, target)
    except ConfigError as e:
        raise ConfigError(f"{head_dir / 'config.json'}: {e}") from None
    return hcfg, jax.device_put(host_head(head_dir, hcfg, dtype))


def hf_head_config(hcfg: HeadConfig, target: ModelConfig) -> dict:
    """The config.json of a head: a Llama config naming the EAGLE-3 architecture, as SGLang and vLLM read it."""
    cfg = hcfg.layer
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": target.max_position,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": hcfg.draft_vocab,
        "target_hidden_size": target.hidden_size,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(hcfg.taps), "use_aux_hidden_state": True},
        "bos_token_id": target.bos_token_id,
        "eos_token_id": list(target.eos_token_ids)[0] if target.eos_token_ids else None,
        "torch_dtype": "bfloat16",
    }


def save_head(head_dir: str | Path, hcfg: HeadConfig, hp: HeadParams, target: ModelConfig) -> None:
    """Writes config.json + model.safetensors (bf16 weights, int64 d2t, bool t2d) in the published format."""
    from safetensors.numpy import save_file

    head_dir = Path(head_dir)
    head_dir.mkdir(parents=True, exist_ok=True)
    bf16 = lambda x, t: np.asarray(jnp.asarray(x.T if t else x, jnp.bfloat16))
    out = {}
    for field, (names, t) in _MIDLAYER.items():
        for name, part in zip(names, unfuse_field(field, getattr(hp.layer, field), hcfg.layer)):
            out[f"midlayer.{name}"] = bf16(part, t)
    out.update({"fc.weight": bf16(hp.fc, True), "midlayer.hidden_norm.weight": bf16(hp.hidden_norm, False),
                "norm.weight": bf16(hp.norm, False), "lm_head.weight": bf16(hp.lm_head, True)})
    V, Vd = hcfg.layer.vocab_size, hcfg.draft_vocab
    d2t = np.zeros(Vd, np.int64) if hp.d2t is None else np.asarray(hp.d2t, np.int64)
    t2d = np.zeros(V, bool)
    t2d[np.arange(Vd) + d2t] = True
    out.update(d2t=d2t, t2d=t2d)
    save_file(out, str(head_dir / "model.safetensors"), metadata={"format": "pt"})
    (head_dir / "config.json").write_text(json.dumps(hf_head_config(hcfg, target), indent=2) + "\n")
