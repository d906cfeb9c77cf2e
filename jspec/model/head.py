"""An EAGLE-3 draft head (arXiv 2503.01840): one decoder layer on the target's own hidden states.

The target forward taps its residual stream at three layers (low, middle, high: `taps`), and one linear
layer `fc` [3E -> E] fuses them into a feature per position. The head reads the pair (feature at position
t, token at t + 1) at position t: the token is embedded with the target's embedding, both halves are
RMS-normed on their own and concatenated [2E] into q/k/v; attention over the head's own KV cache, the
residual stream starting from the feature, one MLP, a final norm and an LM head. Its next input feature is
its own pre-norm output (training-time test: it is trained to read its own features too), so K drafts
take the resync forward plus K - 1 single-token steps, as a draft model's do.

The LM head covers either the target's vocabulary or a reduced draft vocabulary of Vd tokens, whose
token i is the target's token i + d2t[i] (EAGLE-3's map). `forward` returns logits over the target's
vocabulary (-inf off the draft vocabulary), so sampling and acceptance see one vocabulary; the decode loop
calls its parts (`hidden`, `draft_logits`) so that a greedy draft is an argmax over the draft vocabulary and
one lookup of the map (`target_ids`), with no V-wide work.

Tap j is the residual stream entering target layer j (j = L: after the last layer, before the final
norm), the convention of vLLM's `eagle_aux_hidden_state_layer_ids`; its default is (2, L // 2, L - 3).
The layer names and the checkpoint format are jspec.io.eagle3's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec import struct
from jspec.attention.rule import attend
from jspec.cache.kvcache import KVCache
from jspec.config import ConfigError, ModelConfig
from jspec.model.decoder import Layer, fuse_qkv, mlp, qkv, rms_norm
from jspec.numerics import logits_f32


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    layer: ModelConfig  # the head's decoder layer: hidden_size = the target's, its own heads, MLP and rope
    draft_vocab: int  # rows of the LM head: the target's vocabulary size, or a reduced one (with d2t)
    taps: tuple[int, ...]  # target residual-stream indices fused by fc, ascending (see the module doc)


@struct.dataclass
class HeadParams:
    fc: jax.Array  # [len(taps) * E, E]
    # the midlayer: attn_norm is EAGLE-3's input_layernorm (on the token embedding), wqkv reads [2E]
    # (embedding half first, then the feature half), mlp_norm is post_attention_layernorm
    layer: Layer
    hidden_norm: jax.Array  # [E] on the feature half
    norm: jax.Array  # [E] final norm before the LM head
    lm_head: jax.Array  # [E, Vd]
    d2t: jax.Array | None = None  # [Vd] int32: draft token i is target token i + d2t[i]; None when Vd = V
    embed: jax.Array | None = None  # [V, E] the head's own embedding, when its checkpoint has one


def default_taps(num_layers: int) -> tuple[int, ...]:
    """vLLM's default aux layers for a target of num_layers layers: (2, L // 2, L - 3)."""
    return (2, num_layers // 2, num_layers - 3)


def check_taps(taps, num_layers: int) -> tuple[int, ...]:
    """taps as an ascending tuple of three distinct residual-stream indices in [0, L]; ConfigError otherwise."""
    taps = tuple(taps)
    ints = all(isinstance(t, int) and not isinstance(t, bool) for t in taps)
    if len(taps) != 3 or not ints or len(set(taps)) != 3 or not all(0 <= t <= num_layers for t in taps):
        raise ConfigError(f"the head's target layers {list(taps)} must be 3 distinct indices in [0, {num_layers}] "
                          f"for a target of {num_layers} layers (set eagle_aux_hidden_state_layer_ids)")
    return tuple(sorted(taps))


def check_fits(hcfg: HeadConfig, target: ModelConfig) -> None:
    """ConfigError naming the mismatch when a head cannot draft for this target."""
    layer = hcfg.layer
    if layer.hidden_size != target.hidden_size:
        raise ConfigError(f"the head's hidden_size {layer.hidden_size} does not fit the target's hidden_size "
                          f"{target.hidden_size}")
    if layer.vocab_size != target.vocab_size:
        raise ConfigError(f"the head's vocab_size {layer.vocab_size} does not fit the target's vocab_size "
                          f"{target.vocab_size}")
    if hcfg.draft_vocab > target.vocab_size:
        raise ConfigError(f"the head's draft_vocab_size {hcfg.draft_vocab} exceeds the target's vocab_size "
                          f"{target.vocab_size}")
    check_taps(hcfg.taps, target.num_layers)


def fuse(hp: HeadParams, tapped):
    """tapped [B, n, 3E] (the target's taps, concatenated) -> features [B, n, E]."""
    return (tapped @ hp.fc.astype(tapped.dtype)).astype(tapped.dtype)


def to_target_vocab(logits, d2t, vocab: int):
    """Logits [..., Vd] over the draft vocabulary -> [..., V] over the target's (-inf off the draft's)."""
    if d2t is None:
        return logits
    ids = jnp.arange(d2t.shape[0]) + d2t
    return jnp.full((*logits.shape[:-1], vocab), -jnp.inf, logits.dtype).at[..., ids].set(logits)


def target_ids(hp: HeadParams, ids):
    """Draft-vocabulary token ids (any shape) -> the target's: a gather of d2t, not a V-wide scatter."""
    return ids if hp.d2t is None else ids + hp.d2t[ids]


def qkv_input(hp: HeadParams, hcfg: HeadConfig, embed, tokens, feats):
    """[B, n, 2E]: the normed token embedding, then the normed feature (the order of EAGLE-3's concat)."""
    eps = hcfg.layer.rms_eps
    e = (embed if hp.embed is None else hp.embed)[tokens]
    return jnp.concatenate([rms_norm(e, hp.layer.attn_norm, eps), rms_norm(feats, hp.hidden_norm, eps)], -1)


def draft_logits(hp: HeadParams, hcfg: HeadConfig, h):
    """The LM head on pre-norm outputs h [..., E] -> logits [..., Vd] f32 over the draft vocabulary."""
    return logits_f32(rms_norm(h, hp.norm, hcfg.layer.rms_eps), hp.lm_head)


def _residual(hp: HeadParams, hcfg: HeadConfig, feats, o):
    """The residual stream after attention o [B, n, Hq*D] and the MLP: the pre-norm output [B, n, E]."""
    lp = hp.layer
    h = feats + o @ lp.wo
    return h + mlp(lp, rms_norm(h, lp.mlp_norm, hcfg.layer.rms_eps))


def finish(hp: HeadParams, hcfg: HeadConfig, feats, o):
    """The rest of the layer after attention o [B, n, Hq*D] -> (logits [B, n, Vd] f32, pre-norm output)."""
    h = _residual(hp, hcfg, feats, o)
    return draft_logits(hp, hcfg, h), h


def hidden(hp: HeadParams, hcfg: HeadConfig, embed, tokens, feats, cache: KVCache | None = None,
           attn_impl: str = "reference"):
    """forward without the LM head: (the pre-norm outputs [B, n, E], the new rows (k, v))."""
    B, n = tokens.shape
    length = cache.length if cache is not None else jnp.zeros((B,), jnp.int32)
    pos = length[:, None] + jnp.arange(n)  # [B, n]
    q, k, v = qkv(hp.layer, hcfg.layer, qkv_input(hp, hcfg, embed, tokens, feats), pos)
    o = attend(q, k, v, None if cache is None else cache.layer(0), length, None if cache is None else cache.kv,
               attn_impl)
    return _residual(hp, hcfg, feats, o.reshape(B, n, -1)), (k[None], v[None])


def forward(hp: HeadParams, hcfg: HeadConfig, embed, tokens, feats, cache: KVCache | None = None,
            attn_impl: str = "reference"):
    """tokens [B, n] and features [B, n, E] at positions cache.length + 0..n-1 (token i follows the position
    of feature i) -> (logits [B, n, V] f32 over the target's vocabulary, the next features [B, n, E] (the
    pre-norm output), the new rows (k, v) as one-layer stacks [1, B, n, Hkv, D] for kvcache.commit). No cache:
    plain causal attention over the n rows from position 0."""
    h, kv = hidden(hp, hcfg, embed, tokens, feats, cache, attn_impl)
    return to_target_vocab(draft_logits(hp, hcfg, h), hp.d2t, hcfg.layer.vocab_size), h, kv


def layer_config(target: ModelConfig, num_heads: int, num_kv_heads: int, intermediate_size: int) -> ModelConfig:
    """A head layer's config for a target: its hidden size, vocabulary, head_dim, rope and context."""
    return dataclasses.replace(target, model_type="llama", intermediate_size=intermediate_size, num_layers=1,
                               num_heads=num_heads, num_kv_heads=num_kv_heads, qkv_bias=False, qk_norm=False,
                               tie_embeddings=False, sliding_window=None)


def init_head(hcfg: HeadConfig, key, dtype=jnp.float32, std: float = 0.02, d2t=None) -> HeadParams:
    """Random weights (normal(0, std), norms at 1); d2t [Vd] when the draft vocabulary is reduced."""
    cfg = hcfg.layer
    E, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    Hq, Hkv = cfg.num_heads * D, cfg.num_kv_heads * D
    keys = iter(jax.random.split(key, 9))
    w = lambda *shape: (std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)
    ones = jnp.ones((E,), dtype)
    layer = Layer(attn_norm=ones, wqkv=fuse_qkv(w(2 * E, Hq), w(2 * E, Hkv), w(2 * E, Hkv), cfg), wo=w(Hq, E),
                  mlp_norm=ones, w_gu=jnp.stack([w(E, F), w(E, F)], axis=1), w_down=w(F, E))
    return HeadParams(fc=w(len(hcfg.taps) * E, E), layer=layer, hidden_norm=ones, norm=ones,
                      lm_head=w(E, hcfg.draft_vocab), d2t=None if d2t is None else jnp.asarray(d2t, jnp.int32))
