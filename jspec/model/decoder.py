"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3) as pure functions over pytrees.

forward(params, cfg, tokens, cache) -> (logits, new rows). Prefill, decode and K+1 verification are
the same call with a different token count. The forward never writes the cache: it returns the K/V
rows it computed so that the caller commits only what it accepts (kvcache.commit).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jspec import struct
from jspec.attention.rule import attend
from jspec.cache.kvcache import KVCache
from jspec.config import FUSED_NORM_WIDTH, KVConfig, ModelConfig, Options
from jspec.kernels.add_norm import add_norm, supported as add_norm_supported
from jspec.numerics import logits_f32


@struct.dataclass
class Layer:
    """One decoder layer's weights; in Params.layers every field carries a leading layer axis [L, ...]."""

    attn_norm: jax.Array  # [E]
    # q, k and v in one matmul. Slots per KV head h: 0..g-1 its query heads h*g.., g its k, g+1 its
    # v (R_V folded in when rotated); grouped by KV head so that a tp shard of axis 1 holds all three.
    wqkv: jax.Array  # [E, Hkv, g + 2, D]
    wo: jax.Array  # [Hq*D, E]; R_V^T folded in per head when rotated
    mlp_norm: jax.Array  # [E]
    w_gu: jax.Array  # [E, 2, F]: gate, up in one matmul
    w_down: jax.Array  # [F, E]
    bqkv: jax.Array | None = None  # [Hkv, g + 2, D] Qwen2, slots as in wqkv
    bo: jax.Array | None = None  # [E] o_proj's bias (attention_bias)
    b_gu: jax.Array | None = None  # [2, F] gate's and up's biases (mlp_bias)
    b_down: jax.Array | None = None  # [E]
    q_norm: jax.Array | None = None  # [D] Qwen3
    k_norm: jax.Array | None = None  # [D]
    rot_k: jax.Array | None = None  # [Hkv, D, D] f32, R_K transposed: q and k after RoPE times R_K (rotate)
    # [Hkv] f32: the INT2 keys' noise variance per coordinate, seen by the queries (jspec calibrate measures it with
    # the clip it searched; attention.split.noise_shift takes the bias it puts in the INT2 scores out); None: no shift
    key_noise: jax.Array | None = None


@struct.dataclass
class Params:
    embed: jax.Array  # [V, E]
    layers: Layer  # every layer's weights stacked: [L, ...] leaves (stack_layers), the forward's scan slices them
    norm: jax.Array  # [E]
    lm_head: jax.Array | None = None  # [E, V]; None when tied to embed

    @property
    def num_layers(self) -> int:
        return self.layers.attn_norm.shape[0]

    def layer(self, i) -> Layer:
        """Layer i's weights (slices of the stacks)."""
        return jax.tree.map(lambda x: x[i], self.layers)


def stack_layers(layers) -> Layer:
    """A sequence of per-layer pytrees (Layers, or a cache's LayerKVs) as one of [L, ...] stacks (numpy stays
    numpy)."""
    xp = np if all(isinstance(x, np.ndarray) for x in jax.tree.leaves(layers)) else jnp
    return jax.tree.map(lambda *xs: xp.stack(xs), *layers)


def rms_norm(x, w, eps):
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * w.astype(jnp.float32)).astype(x.dtype)


def rope_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [D/2] in float64, with linear or llama3 scaling when the config asks for it."""
    D = cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    if cfg.rope_linear is not None:  # angles at positions / factor
        inv = inv / cfg.rope_linear
    if cfg.rope_llama3 is None:
        return inv
    factor, low, high, orig = cfg.rope_llama3
    wavelen = 2 * math.pi / inv
    smooth = (orig / wavelen - low) / (high - low)
    scaled = np.where(wavelen > orig / low, inv / factor, inv)
    mid = (wavelen <= orig / low) & (wavelen >= orig / high)
    return np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)


def rope_tables(cfg: ModelConfig, pos):
    """(cos, sin) [B, n, D] f32 at positions pos [B, n] for apply_rope; sin carries rotate-half's sign."""
    inv_freq = rope_frequencies(cfg)
    D = cfg.head_dim
    freq = np.concatenate([inv_freq, inv_freq])  # [D]: both halves turn at the same frequencies
    ang = pos[..., None].astype(jnp.float32) * jnp.asarray(freq, jnp.float32)  # [B, n, D]
    sign = np.where(np.arange(D) < D // 2, -1.0, 1.0)
    return jnp.cos(ang), jnp.sin(ang) * jnp.asarray(sign, jnp.float32)


def apply_rope(x, cos, sin):
    """x [B, n, ..., D] with rope_tables' cos, sin [B, n, D] (or tables already of x's rank, broadcast over it);
    HF's rotate-half convention.

    As x * cos + swap(x) * sin over the whole row (swap exchanges the halves): the same products and sums
    as [x1 cos - x2 sin, x2 cos + x1 sin], without a concatenation, so it fuses with what reads it.
    """
    D = x.shape[-1]
    if cos.ndim < x.ndim:
        cos, sin = (t.reshape(*t.shape[:2], *(1,) * (x.ndim - 3), D) for t in (cos, sin))  # over the head axes
    xf = x.astype(jnp.float32)
    swapped = jnp.flip(xf.reshape(*x.shape[:-1], 2, D // 2), axis=-2).reshape(x.shape)
    return (xf * cos + swapped * sin).astype(x.dtype)


def qkv_slots(lp: Layer, cfg: ModelConfig, h, pos, rope=None):
    """[B, n, Hkv, g + 2, D], wqkv's layout: each KV head's g query rows (slots 0..g-1), its k row (slot g) and
    its v row (slot g + 1); q and k after the norms, RoPE and R_K when the layer has one (x_rot = x @ R_K per KV
    head; q.k is unchanged since R_K is orthogonal). rope: rope_tables(cfg, pos) when the caller has them (one
    pair for all layers). split_slots gives q, k and v.

    All slots go through each op together, v's as an identity (RoPE at angle 0, R_K = I: exact), so that a decode
    or verification step makes the whole array at once (two small kernels at batch 1: RoPE, then R_K) and the
    Pallas window kernel reads it whole: q, k and v as arrays of their own took two more copies per layer for the
    call (H200: 632 -> 568 kernels per 8B step). A prefill's chunk joins v to them in one copy.
    """
    B, n, _ = h.shape
    g, D = cfg.q_per_kv, cfg.head_dim
    y = jnp.einsum("bne,ehjd->bnhjd", h, lp.wqkv)  # [B, n, Hkv, g + 2, D]
    if lp.bqkv is not None:
        y = y + lp.bqkv
    is_v = np.arange(g + 2)[:, None] == g + 1  # [g + 2, 1]
    if lp.q_norm is not None:
        w = jnp.where(np.arange(g + 2)[:, None] < g, lp.q_norm, lp.k_norm)  # [g + 2, D], not a concatenation
        y = jnp.where(is_v, y, rms_norm(y, w, cfg.rms_eps))
    cos, sin = rope if rope is not None else rope_tables(cfg, pos)
    y = apply_rope(y, *slot_tables(cos, sin, is_v))
    if lp.rot_k is None:
        return y
    if B * n > SMALL_ROTATE:  # a GEMM over the q and k slots
        return jnp.concatenate([rotate(y[..., : g + 1, :], lp.rot_k), y[..., g + 1:, :]], axis=-2)
    eye = np.eye(D, dtype=np.float32)
    return rotate(y, jnp.where(is_v[:, :, None], eye, lp.rot_k.astype(jnp.float32)[:, None]))  # [Hkv, g + 2, D, D]


def slot_tables(cos, sin, is_v):
    """rope_tables' cos, sin [B, n, D] for each slot of qkv_slots' array: [B, n, 1, g + 2, D], (1, 0) (RoPE at angle
    0) where is_v [g + 2, 1] marks v's slot."""
    return tuple(jnp.where(is_v, fill, t[:, :, None, None, :]) for t, fill in ((cos, 1.0), (sin, 0.0)))


def split_slots(y, cfg: ModelConfig):
    """qkv_slots' array -> q [B, n, Hq, D], k [B, n, Hkv, D] and v [B, n, Hkv, D] (query head h*g + j is slot j of
    KV head h)."""
    B, n, _, _, D = y.shape
    g = cfg.q_per_kv
    return y[..., :g, :].reshape(B, n, cfg.num_heads, D), y[..., g, :], y[..., g + 1, :]


def qkv(lp: Layer, cfg: ModelConfig, h, pos, rope=None):
    """q [B, n, Hq, D], k [B, n, Hkv, D] and v [B, n, Hkv, D]: qkv_slots, split."""
    return split_slots(qkv_slots(lp, cfg, h, pos, rope), cfg)


# Up to this many tokens per forward (B x n: decode, verification) R_K is applied as a broadcast product
# and a sum, which XLA fuses with RoPE before it into one small kernel; more tokens (prefill) take a GEMM.
SMALL_ROTATE = 32


def rotate(x, rot_t):
    """x [B, n, Hkv, j, D] @ R per KV head for rot_t [Hkv, D, D] = R transposed in f32 (Layer.rot_k), or
    [Hkv, j, D, D] one per slot (small products only), in x.dtype (f32 accumulation either way). Transposed, the
    small product reduces over rot_t's minor axis and reads it as it lies: kept as R, XLA converted and
    transposed it in a kernel of its own every step (docs/kernels.md)."""
    B, n = x.shape[:2]
    if B * n > SMALL_ROTATE:
        return jnp.einsum("bnhjd,hed->bnhje", x, rot_t.astype(x.dtype))
    per_slot = rot_t if rot_t.ndim == 4 else rot_t[:, None]
    prod = x.astype(jnp.float32)[..., None, :] * per_slot.astype(jnp.float32)  # [B, n, Hkv, j, D, D]
    return prod.sum(-1).astype(x.dtype)


def _biased(y, b):
    return y if b is None else y + b


def attn_out(lp: Layer, o):
    """The attention output o [B, n, Hq*D] projected back to the residual: [B, n, E]."""
    return _biased(o @ lp.wo, lp.bo)


def mlp(lp: Layer, x):
    y = _biased(jnp.einsum("bne,ejf->bnjf", x, lp.w_gu), lp.b_gu)  # [B, n, 2, F]
    return _biased((jax.nn.silu(y[..., 0, :]) * y[..., 1, :]) @ lp.w_down, lp.b_down)


def forward(params: Params, cfg: ModelConfig, tokens, cache: KVCache | None = None, *,
            attn_impl: str = "reference", options: Options = Options()):
    """tokens [B, n] at positions cache.length + 0..n-1 (0..n-1 without a cache).

    Returns logits [B, n, V] in float32 and the new rows (k, v), each [L, B, n, Hkv, D] in the cache's rotated
    basis, for kvcache.commit (or, over a cache.scratch view, scratch.write).
    """
    logits, kv, _ = forward_taps(params, cfg, tokens, cache, (), attn_impl=attn_impl, options=options)
    return logits, kv


# XLA's options for every program (each layer's weights are slices of the stacks), on a GPU: cuBLAS GEMMs (not
# XLA's Triton ones) that the dynamic-slice fusion hands an address inside the stacked weights. Without them a
# rolled loop copied each layer's weights out of the stacks first: 32 layers of the 8B MLP at one token took
# 8.42 ms, 2.92 ms with them, 2.80 ms as separate per-layer arrays (H200, an earlier measurement). The unrolled
# loop's static slices under them: the 8B INT2 step at batch 1 / 32K 6.368 ms against 6.353 ms with per-layer
# arrays (H100, 2026-12-07, docs/kernels.md "Int32 offsets"). XLA on the CPU ignores them.
SCAN_OPTIONS = {"xla_gpu_enable_dynamic_slice_fusion": True, "xla_gpu_enable_triton_gemm": False}


def compile_options() -> dict:
    """XLA's compiler options of a program over stacked weights (all of jspec's): SCAN_OPTIONS."""
    return dict(SCAN_OPTIONS)


def forward_taps(params: Params, cfg: ModelConfig, tokens, cache: KVCache | None, taps: tuple[int, ...], *,
                 attn_impl: str = "reference", options: Options = Options()):
    """forward, and the residual stream entering each layer j of taps (j = L: after the last layer, before
    the final norm), concatenated in taps' order: [B, n, len(taps) * E] (an EAGLE-3 head's input).

    cache: a KVCache, or anything with its reading side (length, kv, scanned, in_scan): a cache.scratch view.
    The layers run as one lax.scan over their stacks, unrolled Options.unroll layers per trip."""
    B, n = tokens.shape
    length = cache.length if cache is not None else jnp.zeros((B,), jnp.int32)
    pos = length[:, None] + jnp.arange(n)  # [B, n]
    kv = cache.kv if cache is not None else None
    x = params.embed[tokens]
    # One pair of tables for all layers, kept apart by the barrier: each layer's RoPE is then a few
    # multiplies that fuse into what reads them (R_K), not sines and cosines of its own.
    rope = jax.lax.optimization_barrier(rope_tables(cfg, pos))
    L = params.num_layers
    spec = BlockSpec(cfg, kv, attn_impl, fused_norms(cfg.hidden_size, options), options.fused_window,
                     interpret=not options.gpu)
    y = jnp.zeros_like(x)  # the last layer's MLP output, added to the residual x by the next norm (x + 0 is x)

    def layer(carry, xs):
        x, y, i = carry
        lp, layer_cache = xs
        if layer_cache is not None:
            layer_cache = cache.in_scan(layer_cache, i)
        norms = (params.layers.attn_norm, params.layers.mlp_norm, i)  # read in place by the fused norms
        entering, x, y, _, k, v = _block(lp, x, y, rope, layer_cache, length, norms, spec=spec)
        return (x, y, i + 1), (k, v, entering if taps else None)

    # new_k, new_v: [L, B, n, Hkv, D]; entering: the residual entering each layer, [L, B, n, E] (taps only)
    xs = (params.layers, None if cache is None else cache.scanned())
    with jax.named_scope("layers"):
        (x, y, _), (new_k, new_v, entering) = jax.lax.scan(layer, (x, y, jnp.int32(0)), xs,
                                                           unroll=options.unroll)
    tapped = {j: entering[j] for j in taps if j < L}
    tapped[L], x = add_rms_norm(x, y, params.norm, cfg.rms_eps, spec.fused, interpret=spec.interpret)
    head = params.embed.T if params.lm_head is None else params.lm_head
    logits = logits_f32(x, head)
    features = jnp.concatenate([tapped[j] for j in taps], -1) if taps else None
    return logits, (new_k, new_v), features


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """How a forward runs its layers (static: part of the nested jit's key)."""

    cfg: ModelConfig
    kv: KVConfig | None  # the cache's layout (None: no cache)
    attn_impl: str = "reference"
    fused: bool = False  # each residual add and the norm after it in one kernel (add_rms_norm)
    fused_window: bool | None = None  # Options.fused_window, for the split attention path
    interpret: bool = False  # the Pallas kernels in interpret mode (off a GPU: not Options.gpu)


def block(lp: Layer, x, y, rope, layer_cache, length, norm_stacks=None, *, spec: BlockSpec):
    """One decoder layer over the residual x + y [B, n, E] at positions length + 0..n-1 (rope: their rope_tables).
    y is the last layer's MLP output, added here by the first norm. Returns the residual entering the
    layer, the residual after its attention, its MLP's output (the next layer's y), and its q (calibration reads
    it; a forward drops it) and new k and v rows.
    norm_stacks (the scan's body): the [L, E] stacks of both norms' weights and this layer's index, for the fused
    norms' kernel to read in place; None: lp's own norms (a single layer, as calibration runs it).
    """
    B, n, _ = x.shape
    cfg, fused, interpret = spec.cfg, spec.fused, spec.interpret
    attn_norm, mlp_norm, index = norm_stacks or (lp.attn_norm, lp.mlp_norm, None)
    entering, h = add_rms_norm(x, y, attn_norm, cfg.rms_eps, fused, index, interpret=interpret)
    # One bf16 array that attention and the commit both read (behind the barrier: else XLA kept the f32 sums for the
    # commit's copy and rounded them again in a kernel of its own, H200)
    slots = jax.lax.optimization_barrier(qkv_slots(lp, cfg, h, None, rope))
    q, k, v = split_slots(slots, cfg)
    o = attend(q, k, v, layer_cache, length, spec.kv, spec.attn_impl, qkv=slots, fused_window=spec.fused_window,
               interpret=interpret, key_noise=lp.key_noise).reshape(B, n, -1)
    x, h = add_rms_norm(entering, attn_out(lp, o), mlp_norm, cfg.rms_eps, fused, index, interpret=interpret)
    return entering, x, mlp(lp, h), q, k, v


def fused_norms(width: int, options: Options = Options()) -> bool:
    """Whether forwards of a model this wide take add_rms_norm's kernel (Options.fused_norms). Auto: on a
    GPU (Options.platform), without a mesh (a Pallas call takes whole arrays: under GSPMD it would gather the sharded rows onto every
    device), from FUSED_NORM_WIDTH: narrower models stay in XLA, whose fusions the shipped autotuning results
    cover; each kernel shape would add a Triton compile to their cold start, for a gain not measured."""
    if options.fused_norms is not None:
        return options.fused_norms
    return width >= FUSED_NORM_WIDTH and options.gpu and jax.sharding.get_abstract_mesh().empty


def add_rms_norm(x, y, w, eps, fused: bool = False, layer=None, interpret: bool = False):
    """(s, rms_norm(s, w)) for s = x + y, the residual x and a layer's output y; w [E], or with layer (an index) a
    [L, E] stack. fused: in one Pallas kernel where it takes the rows (pallas/add_norm.py; interpret: in its
    interpret mode, off a GPU), else in XLA."""
    if fused and add_norm_supported(x.size // x.shape[-1], x.shape[-1]):
        return _fused_add_norm(x, y, w, layer, eps, interpret)
    return _xla_add_norm(x, y, w, layer, eps)


def _xla_add_norm(x, y, w, layer, eps):
    s = x + y
    return s, rms_norm(s, w if layer is None else w[layer], eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused_add_norm(x, y, w, layer, eps, interpret):
    """The kernel, differentiated as XLA's path (a Pallas call has no derivative of its own: training takes it)."""
    return add_norm(x, y, w, layer, eps=eps, interpret=interpret)


def _fused_add_norm_fwd(x, y, w, layer, eps, interpret):
    return _fused_add_norm(x, y, w, layer, eps, interpret), (x, y, w, layer)


def _fused_add_norm_bwd(eps, interpret, saved, cotangents):
    x, y, w, layer = saved
    _, vjp = jax.vjp(lambda x, y, w: _xla_add_norm(x, y, w, layer, eps), x, y, w)
    return (*vjp(cotangents), None)  # the layer index: an integer, no cotangent


_fused_add_norm.defvjp(_fused_add_norm_fwd, _fused_add_norm_bwd)


# A nested jit: the layers of a forward share one traced and lowered body (XLA inlines the calls, so the
# compiled program is unchanged), also where the scan unrolls them.
_block = jax.jit(block, static_argnames=("spec",))


def fuse_qkv(q, k, v, cfg: ModelConfig, xp=jnp):
    """q [..., Hq*D], k and v [..., Hkv*D] (HF's output order) -> [..., Hkv, g + 2, D], wqkv's layout.
    xp: jnp, or np to lay weights out on the host (checkpoint loading)."""
    heads = lambda x: x.reshape(*x.shape[:-1], cfg.num_kv_heads, -1, cfg.head_dim)  # [..., Hkv, n, D]
    return xp.concatenate([heads(q), heads(k), heads(v)], axis=-2)


def unfuse_qkv(x, cfg: ModelConfig):
    """fuse_qkv's inverse: x [..., Hkv, g + 2, D] -> q [..., Hq*D], k and v [..., Hkv*D]."""
    g = cfg.q_per_kv
    flat = lambda y: y.reshape(*y.shape[:-3], -1)
    return flat(x[..., :g, :]), flat(x[..., g, None, :]), flat(x[..., g + 1, None, :])


def init_params(cfg: ModelConfig, key, dtype=jnp.float32, std: float = 0.02) -> Params:
    """Random weights (normal(0, std), norms at 1) for tests, benchmarks and training from scratch."""
    E, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    Hq, Hkv = cfg.num_heads * D, cfg.num_kv_heads * D
    keys = iter(jax.random.split(key, 11 * cfg.num_layers + 2))
    w = lambda *shape: (std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)
    extra = iter(jax.random.split(jax.random.fold_in(key, 1), 3 * cfg.num_layers))
    w_extra = lambda *shape: (std * jax.random.normal(next(extra), shape, jnp.float32)).astype(dtype)
    ones = lambda n: jnp.ones((n,), dtype)

    def layer():
        # Each HF projection is drawn on its own key, then fused: a seed gives the same model whether
        # the projections are stored apart or fused (tests and training runs are pinned to seeds).
        bias = dict(bqkv=fuse_qkv(w(Hq), w(Hkv), w(Hkv), cfg)) if cfg.qkv_bias else {}
        # drawn from keys of their own: a seed keeps giving the same weights to the models without them
        if cfg.o_bias:
            bias.update(bo=w_extra(E))
        if cfg.mlp_bias:
            bias.update(b_gu=w_extra(2, F), b_down=w_extra(E))
        norms = dict(q_norm=ones(D), k_norm=ones(D)) if cfg.qk_norm else {}
        wqkv, wo = fuse_qkv(w(E, Hq), w(E, Hkv), w(E, Hkv), cfg), w(Hq, E)
        w_gu = jnp.stack([w(E, F), w(E, F)], axis=1)  # [E, 2, F]
        return Layer(attn_norm=ones(E), wqkv=wqkv, wo=wo, mlp_norm=ones(E), w_gu=w_gu, w_down=w(F, E),
                     **bias, **norms)

    layers = stack_layers([layer() for _ in range(cfg.num_layers)])
    lm_head = None if cfg.tie_embeddings else w(E, cfg.vocab_size)
    return Params(w(cfg.vocab_size, E), layers, ones(E), lm_head)
