"""A faster teacher-forced forward for the KV-quality benchmarks: the attention rule in causal query blocks.

model.forward with an empty int2 cache (kv_quality.window_logp) scores every (query, key) pair twice, once
against the BF16 key and once against the INT2 one, over the full n x n square. Here a block of C queries
[a, a + C) reads keys [0, a + C) only, each key once from a mixed copy (INT2 where every query of the block
reads it from the history, BF16 elsewhere), and only the band of keys whose form changes inside the block,
(a - R, a + C - R), is scored a second time in BF16. Same rule (key p in BF16 iff p < S or p > t - R),
same codec (kvcache.fake_quantize_kv), float32; tests/test_kv_quality.py checks it against window_logp.

Each layer takes its own KV setting (kvs[i]: a KVConfig, or None for BF16), so a per-layer table (only
layer i's history in INT2) and per-layer clips run through the same code.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from jspec.attention.split import noise_shift
from jspec.cache.kvcache import fake_quantize_kv
from jspec.config import KVConfig, ModelConfig
from jspec.model import decoder as model
from jspec.numerics import logits_f32

BLOCK = 256


def block_attention(q, k, v, kv: KVConfig | None, C: int = BLOCK, key_noise=None):
    """q [B, n, Hq, D], k, v [B, n, Hkv, D] (rotated basis) -> [B, n, Hq, D] f32 under kv's rule, causal; key_noise
    [Hkv] (Layer.key_noise): the INT2 scores' bias taken out, as the run time does (attention.split.noise_shift)."""
    B, n, Hq, D = q.shape
    H = k.shape[2]
    qg = q.astype(jnp.float32).reshape(B, n, H, Hq // H, D).transpose(0, 2, 3, 1, 4)  # [B, H, G, n, D]
    no_shift = key_noise is None or kv is None or not kv.int2
    shift = 0.0 if no_shift else noise_shift(qg, key_noise, axis=1)[..., None] * D**0.5  # [B, H, G, n, 1] unscaled
    kb, vb = (x.astype(jnp.float32).transpose(0, 2, 1, 3) for x in (k, v))  # [B, H, n, D]
    kq, vq = fake_quantize_kv(kb, vb, kv) if kv is not None and kv.int2 else (kb, vb)
    S, R = (kv.sink, kv.recent) if kv is not None and kv.int2 else (n, n)
    outs = []
    for a in range(0, n, C):
        e = min(a + C, n)  # queries [a, e), keys [0, e)
        t = jnp.arange(a, e)[:, None]  # [c, 1]
        p = jnp.arange(e)[None, :]  # [1, e]
        int2_all = (p >= S) & (p <= a - R)  # read from INT2 by every query of the block
        lo, hi = max(S, a - R + 1), min(e, e - R)  # the band: INT2 for some queries of the block only
        in_band = (p >= lo) & (p < hi)
        km = jnp.where((int2_all | in_band)[0, :, None], kq[:, :, :e], kb[:, :, :e])
        vm = jnp.where((int2_all | in_band)[0, :, None], vq[:, :, :e], vb[:, :, :e])
        s = jnp.einsum("bhgnd,bhxd->bhgnx", qg[:, :, :, a:e], km)
        if not no_shift:  # the block's INT2 keys, the band's included (its BF16 reads are set below)
            s -= jnp.where((int2_all | in_band)[0], shift[:, :, :, a:e], 0.0)
        bf_band = None
        if hi > lo:
            pb = jnp.arange(lo, hi)[None, :]
            bf_band = pb > t - R  # [c, band]: the band keys these queries read in BF16
            sb = jnp.einsum("bhgnd,bhxd->bhgnx", qg[:, :, :, a:e], kb[:, :, lo:hi])
            s = s.at[..., lo:hi].set(jnp.where(bf_band, sb, s[..., lo:hi]))
        s = jnp.where(p <= t, s * D**-0.5, -jnp.inf)
        w = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhgnx,bhxd->bhgnd", w, vm)
        if bf_band is not None:
            o += jnp.einsum("bhgnx,bhxd->bhgnd", jnp.where(bf_band, w[..., lo:hi], 0.0),
                            vb[:, :, lo:hi] - vq[:, :, lo:hi])
        outs.append(o)
    o = jnp.concatenate(outs, axis=3)  # [B, H, G, n, D]
    return o.transpose(0, 3, 1, 2, 4).reshape(B, n, Hq, D)


@partial(jax.jit, static_argnames=("cfg", "kv", "C"))
def layer(lp, x, y, cfg: ModelConfig, kv: KVConfig | None, C: int = BLOCK):
    """One decoder layer (model.block) over the residual x + y [B, n, E] with blocked attention -> (x, y)."""
    B, n, _ = x.shape
    pos = jnp.broadcast_to(jnp.arange(n), (B, n))
    entering, h = model.add_rms_norm(x, y, lp.attn_norm, cfg.rms_eps)
    q, k, v = model.split_slots(model.qkv_slots(lp, cfg, h, pos, model.rope_tables(cfg, pos)), cfg)
    o = block_attention(q, k, v, kv, C, lp.key_noise).reshape(B, n, -1).astype(x.dtype)
    x, h = model.add_rms_norm(entering, model.attn_out(lp, o), lp.mlp_norm, cfg.rms_eps)
    return x, model.mlp(lp, h)


@partial(jax.jit, static_argnames=("cfg",))
def head_logp(params, x, y, cfg: ModelConfig):
    """The final norm and the vocabulary head -> log-probabilities [n, V] f32 (batch row 0)."""
    _, h = model.add_rms_norm(x, y, params.norm, cfg.rms_eps)
    head = params.embed.T if params.lm_head is None else params.lm_head
    return jax.nn.log_softmax(logits_f32(h, head)[0].astype(jnp.float32), axis=-1)


def residuals(params, cfg: ModelConfig, tokens, kvs) -> list:
    """tokens [1, n] -> the (x, y) entering each layer and after the last: L + 1 pairs (kvs: per layer)."""
    x = params.embed[tokens].astype(jnp.float32)
    out = [(x, jnp.zeros_like(x))]
    for i, kv in enumerate(kvs):
        out.append(layer(params.layer(i), *out[-1], cfg, kv))
    return out


def logp(params, cfg: ModelConfig, tokens, kvs, start=None, C: int = BLOCK):
    """Log-probabilities [n, V] with layer i under kvs[i]; start=(j, (x, y)) resumes at layer j from a stored
    residual (the layers before j are then whatever produced it: a per-layer table reuses BF16's)."""
    j, (x, y) = start if start is not None else (0, (params.embed[tokens].astype(jnp.float32), None))
    y = jnp.zeros_like(x) if y is None else y
    for i, kv in enumerate(kvs[j:], j):
        x, y = layer(params.layer(i), x, y, cfg, kv, C)
    return head_logp(params, x, y, cfg)
