"""The split path of mixed-cache attention: BF16 parts in XLA, the INT2 history in the Pallas kernel.

Same semantics as attention.attend_reference (the rule: a query at t reads key p <= t in BF16 iff
p < S or p > t - R, else the INT2 copy), computed as two softmax partials joined by one LSE merge:
- XLA, BF16: sink positions p < min(S, length); ring slots holding p in [max(S, t-R+1), length);
  the chunk's own rows (causal), fake-quantised where the rule says INT2 (only in long prefills);
- Pallas, INT2: committed history [S, min(t-R+1, length)) — each query row has its own end. On
  Hopper (wgmma) the Mosaic GPU kernel (pallas/int2_mosaic.py), elsewhere the Triton one.

The kernel is a custom call that GSPMD cannot split: per_shard runs the split path under shard_map so
that each device runs it on its own (dp, tp) block of rows and KV heads (jspec.sharding places the
arrays; the Engine lowers its program under the mesh so that per_shard finds it). Where it is not
wrapped, GSPMD gathers the kernel's operands onto every device (correct results, no speed-up).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jspec.config import KVConfig
from jspec.kvcache import LayerKV, fake_quantize_kv
from jspec.numerics import dot_scores
from jspec.pallas import int2_mosaic
from jspec.pallas.int2_attention import int2_attention, merge_lse

# The mesh axes of jspec.sharding: batch rows over "dp", KV heads over "tp". Named here, below the
# model in the imports, so that the model's import chain stops short of sharding.
DP, TP = "dp", "tp"


def attend_split(q, k, v, layer: LayerKV, length, kv: KVConfig, interpret: bool | None = None,
                 kernel: str = "auto", **kernel_options):
    """q: [B, n, Hq, D] rotated queries at positions length + 0..n-1; k, v: [B, n, Hkv, D] new rows.

    Returns [B, n, Hq, D] in q.dtype. kernel: "mosaic", "triton" or "auto" (mosaic where the device
    has wgmma and D is 64 or 128). kernel_options go to the Triton int2_attention (block sizes, splits).
    """
    B, n, Hq, D = q.shape
    H = k.shape[2]
    qg = q.reshape(B, n, H, Hq // H, D)
    t = length[:, None] + jnp.arange(n)  # [B, n] query positions
    with jax.named_scope("bf16_parts"):
        out_x, lse_x = _bf16_part(qg, k, v, layer, length, t, kv)  # [B, n, H, g, D], [B, n, H, g]
    with jax.named_scope("int2_history"):
        out_k, lse_k = _int2_part(qg, layer, length, t, kv, interpret, kernel, kernel_options)  # [B, H, ns, n*g, ...]
    # One merge of the BF16 partial with the kernel's split partials (a merge of the splits first and
    # then of the two parts would be twice the small kernels). Row m of a KV head is query i = m // g.
    g = Hq // H
    # [B, n, H, g, ..] -> [B, H, 1, n*g, ..]
    rows = lambda x: jnp.moveaxis(x, 1, 2).reshape(B, H, 1, n * g, *x.shape[4:])
    out, _ = merge_lse(jnp.concatenate([rows(out_x), out_k], 2), jnp.concatenate([rows(lse_x), lse_k], 2), axis=2)
    return jnp.moveaxis(out.reshape(B, H, n, g, D), 2, 1).reshape(B, n, Hq, D).astype(q.dtype)


def _int2_part(qg, layer: LayerKV, length, t, kv: KVConfig, interpret, kernel, kernel_options):
    """Kernel over the INT2 history; GQA heads x query positions packed into M rows per KV head.

    Returns the kernel's unmerged split partials: out [B, H, splits, n*g, D], lse [B, H, splits, n*g]."""
    B, n, H, g, D = qg.shape
    rows = qg.transpose(0, 2, 1, 3, 4).reshape(B, H, n * g, D)  # row m = i * g + head-in-group
    hi = jnp.repeat(jnp.minimum(t - kv.recent + 1, length[:, None]), g, axis=1)  # [B, n*g]
    lo = jnp.full_like(hi, kv.sink)
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    if kernel == "mosaic" and not int2_mosaic.available():
        raise ValueError("the mosaic INT2 kernel needs a GPU with wgmma (compute capability 9.x)")
    small = n * g <= int2_mosaic.MAX_ROWS  # decode and verify; a long prefill chunk goes to the Triton kernel
    auto = kernel == "auto" and not interpret and D in (64, 128) and int2_mosaic.available()
    if small and (kernel == "mosaic" or auto):
        return int2_mosaic.int2_attention_mosaic(rows, layer.codes, layer.qparams, lo, hi, merge=False)
    return int2_attention(rows, layer.codes, layer.qparams, lo, hi, merge=False, interpret=interpret, **kernel_options)


def _bf16_part(qg, k, v, layer: LayerKV, length, t, kv: KVConfig):
    """Softmax partial over sink + ring + chunk rows: (out [B, n, H, g, D] f32, lse [B, n, H, g])."""
    B, n, H, g, D = qg.shape
    S, W, R = layer.pinned_slots, layer.ring_slots, kv.recent
    dt = k.dtype
    # Key positions and validity per query row: the window's sink and ring slots, then the chunk.
    p_ring = layer.ring_positions(length)  # [B, W]; < S where the slot holds no ring position
    lo_ring = jnp.maximum(kv.sink, t - R + 1)  # [B, n]
    ok_sink = jnp.broadcast_to((jnp.arange(S) < length[:, None])[:, None, :], (B, n, S))
    ok_ring = (p_ring[:, None, :] >= lo_ring[:, :, None]) & (p_ring[:, None, :] >= 0)
    i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    causal = jnp.broadcast_to(j <= i, (B, n, n))

    keys = jnp.concatenate([layer.k.astype(dt), k.transpose(0, 2, 1, 3)], 2)
    vals = jnp.concatenate([layer.v.astype(dt), v.transpose(0, 2, 1, 3)], 2)
    valid = jnp.concatenate([ok_sink, ok_ring, causal], 2)  # [B, n, X]
    s = dot_scores(qg, keys)  # [B, H, g, n, X]
    if n > R:  # a long chunk: its own rows older than t - R are read as INT2
        new_int2 = (i - j >= R) & (t[:, None, :] >= kv.sink)  # [B, n(query), n(key)]
        kq, vq = _fake_quant(k, v, kv)
        s_new = jnp.where(new_int2[:, None, None], dot_scores(qg, kq), s[..., S + W:])
        s = jnp.concatenate([s[..., : S + W], s_new], -1)
    s = jnp.where(valid[:, None, None], s * D**-0.5, -jnp.inf)
    m = s.max(-1, keepdims=True)
    p = jnp.exp(s - m)
    l = p.sum(-1)
    if n > R:
        out = _values(jnp.where(new_int2[:, None, None], 0, p[..., S + W:]), v.transpose(0, 2, 1, 3))
        out += _values(p[..., : S + W], vals[:, :, : S + W]) + _values(jnp.where(new_int2[:, None, None], p[..., S + W:], 0), vq)
    else:
        out = _values(p, vals)
    lse = (m[..., 0] + jnp.log(l)).transpose(0, 3, 1, 2)  # [B, H, g, n] -> [B, n, H, g]
    return out / l.transpose(0, 3, 1, 2)[..., None], lse


def _fake_quant(k, v, kv: KVConfig):
    """Chunk rows as commit will store them in the INT2 history: [B, H, n, D] each."""
    return fake_quantize_kv(k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), kv)


def _values(p, vals):
    # p [B, H, g, n, X] f32, vals [B, H, X, D] -> [B, n, H, g, D] f32. In f32: XLA:CPU has no
    # bf16 x bf16 -> f32 dot for this layout, and these BF16 parts are small (S + W + n keys).
    return jnp.einsum("bhgnx,bhxd->bnhgd", p, vals.astype(jnp.float32), preferred_element_type=jnp.float32)


def per_shard(fn, mesh=None):
    """fn(q, k, v, layer, length, kv) -> [B, n, Hq, D] (attend_split) run per device on its rows and KV
    heads under shard_map; fn itself when there is no ("dp", "tp") mesh (argument or jax.set_mesh)."""
    mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or set(mesh.axis_names) != {DP, TP}:
        return fn
    heads = P(DP, None, TP, None)  # [B, n, H, D]

    def run(q, k, v, layer, length, kv):
        body = lambda q, k, v, layer, length: fn(q, k, v, layer, length, kv)
        # check_vma off: a pallas_call carries no varying-axes annotations for shard_map to check
        return jax.shard_map(body, mesh=mesh, in_specs=(heads, heads, heads, P(DP, TP), P(DP)),
                             out_specs=heads, check_vma=False)(q, k, v, layer, length)

    return run
