"""Clip search: per layer, the key and value clip quantiles that minimise the error of the attention output.

The INT2 codec clips each rotated row at a quantile of |x| before its min-max code (jspec.int2.quant): a lower
clip trades the outliers' error for a finer step on every other coordinate. Which trade pays depends on the
layer's keys, values and queries, so calibration measures it: for every candidate quantile, the layer's
attention output under the INT2 rule (key p read from INT2 for query t iff SINK <= p <= t - RECENT) is compared
with the exact one, projected through W_o into the residual stream (what the next layer reads). Keys are
searched with exact values and values with exact keys (the two errors barely interact: the value error is
linear in the attention weights).

Errors are summed squared residual-stream errors over the searched query rows. Per KV head, the errors of
each head's query group (its own W_o rows, cross terms left out) tell whether a per-head clip would pay.

Each key candidate also has the key noise it leaves measured (noise_variance: the variance per coordinate of
the keys' error as the queries see it); the file keeps the noise at the model-wide key clip (Layer.key_noise),
whose bias in the INT2 scores the run time takes out where asked (JSPEC_KEY_NOISE=on; attention.split.noise_shift).
The candidates are scored without that correction, as the default run time reads them (docs/results.md).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jspec.int2 import quant

OBJECTIVE = "attention output error through W_o, keys and values searched apart"
CANDIDATES = (1.0, 0.96, 0.92, 0.9, 0.88, 0.86, 0.84, 0.82, 0.8, 0.76)
SINK, RECENT = 16, 64  # the rule the errors are measured under: short windows, so most keys are read as INT2
QUERY_STRIDE = 4  # every 4th query of a window's second half is scored (the half with the longest history)


def _rule_mask(n: int, rows):
    """[nq, n] True where query t (of rows) reads key p from INT2 (SINK <= p <= t - RECENT)."""
    p = jnp.arange(n)[None, :]
    return (p >= SINK) & (p <= rows[:, None] - RECENT)


def noise_variance(q, e):
    """The keys' error e [B, n, H, D] as the queries q [B, nq, H, g, D] see it: tr(C_Q C_E) / tr(C_Q) per KV head
    [H], C_Q and C_E the second moments of q and e. For e independent of q, the variance of q.e is ||q||^2 times
    it on average over q (for isotropic e: its variance per coordinate)."""
    cq = jnp.einsum("bthgd,bthgf->hdf", q, q)
    ce = jnp.einsum("bphd,bphf->hdf", e, e) / (e.shape[0] * e.shape[1])
    return jnp.sum(cq * ce, (1, 2)) / jnp.trace(cq, axis1=1, axis2=2)


def _outputs(q, k, v, kq, vq, rows):
    """Attention outputs [B, nq, H, g, D] of the queries q at positions rows, with keys k or kq and values v or vq
    read under the rule (exact elsewhere), causal."""
    n, D = k.shape[1], q.shape[-1]
    int2 = _rule_mask(n, rows)  # [nq, n]
    causal = jnp.arange(n)[None, :] <= rows[:, None]
    s = jnp.einsum("bthgd,bphd->bhgtp", q, k)
    sq = jnp.einsum("bthgd,bphd->bhgtp", q, kq)
    s = jnp.where(causal, jnp.where(int2, sq, s) * D**-0.5, -jnp.inf)
    w = jax.nn.softmax(s, axis=-1)  # [B, H, g, nq, n]
    return jnp.einsum("bhgtp,bphd->bthgd", w, v) + jnp.einsum("bhgtp,bphd->bthgd", jnp.where(int2, w, 0.0), vq - v)


@partial(jax.jit, static_argnames=("ratios", "group"))
def layer_errors(q, k, v, wo, ratios: tuple, group: int):
    """One layer's errors for each candidate quantile: q [B, n, Hq, D], k, v [B, n, Hkv, D] in the rotated basis,
    wo [Hq, D, E] (W_o with R_V folded in), group: the codec's group size -> (key errors [C, Hkv] per KV head
    (cross terms left out), [C] of the layer's residual stream; value errors likewise; the key noise [C, Hkv]
    each key candidate leaves, noise_variance). One program for every layer of a model (the shapes are the
    same)."""
    B, n, Hq, D = q.shape
    H = k.shape[2]
    rows = jnp.arange(n // 2, n, QUERY_STRIDE)
    qg = q[:, rows].astype(jnp.float32).reshape(B, len(rows), H, Hq // H, D)
    wo = wo.astype(jnp.float32).reshape(H, Hq // H, D, -1)
    k, v = k.astype(jnp.float32), v.astype(jnp.float32)
    exact = _outputs(qg, k, v, k, v, rows)

    def errors(o):  # [B, nq, H, g, D] -> ([H], [])
        d = jnp.einsum("bthgd,hgde->bthe", o - exact, wo)  # each KV head's group through its W_o rows
        return jnp.sum(d * d, (0, 1, 3)), jnp.sum(jnp.sum(d, 2) ** 2)

    code = lambda x, r: quant.fake_quantize(x, group, r, jnp.bfloat16)  # as the cache stores it (bf16 scales)
    noise = [noise_variance(qg, code(k, r) - k) for r in ratios]
    ek = [errors(_outputs(qg, k, v, code(k, r), v, rows)) for r in ratios]
    ev = [errors(_outputs(qg, k, v, k, code(v, r), rows)) for r in ratios]
    stack = lambda es: (jnp.stack([e[0] for e in es]), jnp.stack([e[1] for e in es]))
    return (*stack(ek), *stack(ev), jnp.stack(noise))


def search_layer(lp, cfg, qs, ks, vs, rot_k, rot_v, group: int, ratios=CANDIDATES) -> tuple:
    """Sums layer_errors over batches of one layer's un-rotated q [B, n, Hq, D], k, v [B, n, Hkv, D] (lists), rotated
    with rot_k, rot_v [Hkv, D, D] as the run time sees them -> (ek_h [C, Hkv], ek [C], ev_h, ev, key noise
    [C, Hkv]) float64: the errors summed, the noise averaged over the batches' tokens."""
    Hkv, g, D = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    rk, rv = jnp.asarray(rot_k, jnp.float32), jnp.asarray(rot_v, jnp.float32)
    rq = jnp.repeat(rk, g, axis=0)  # [Hq, D, D]: query head i uses its KV head's R_K
    wo = jnp.einsum("hdf,hgde->hgfe", rv, lp.wo.astype(jnp.float32).reshape(Hkv, g, D, -1)).reshape(Hkv * g, D, -1)
    total, tokens = None, 0
    for q, k, v in zip(qs, ks, vs):
        e = layer_errors(jnp.einsum("bnhd,hdf->bnhf", q, rq), jnp.einsum("bnhd,hdf->bnhf", k, rk),
                         jnp.einsum("bnhd,hdf->bnhf", v, rv), wo, tuple(ratios), group)
        e = [np.asarray(x, np.float64) for x in e]
        e[4] *= k.shape[0] * k.shape[1]  # the noise weighed by its batch's tokens
        tokens += k.shape[0] * k.shape[1]
        total = e if total is None else [a + b for a, b in zip(total, e)]
    return (*total[:4], total[4] / tokens)


def choose(errors: list, ratios=CANDIDATES) -> dict:
    """Per-layer search results (search_layer's, one per layer) -> the clips and their provenance:
    clip_k, clip_v: the best candidate per layer; clip_model: the (key, value) pair of least error summed over
    the layers; per_head_gain_k / _v: how much lower the summed per-head error would be with a clip per KV
    head than with the layer's (0.02: 2%), the figure that says whether per-head clips would pay; key_noise [L][Hkv]:
    each layer's key noise at clip_model's key quantile (Layer.key_noise)."""
    r = np.asarray(ratios)
    ek_h, ek, ev_h, ev, noise = (np.stack(x) for x in zip(*errors))  # [L, C, Hkv], [L, C]; noise [L, C, Hkv]
    gain = lambda eh: float(1 - eh.min(1).sum() / d) if (d := eh.sum(2).min(1).sum()) > 0 else 0.0  # no error: no gain
    at = lambda e, c: float(e[:, list(r).index(c)].sum()) if c in r else None
    return {"clip_k": [float(x) for x in r[ek.argmin(1)]], "clip_v": [float(x) for x in r[ev.argmin(1)]],
            "clip_model": [float(r[ek.sum(0).argmin()]), float(r[ev.sum(0).argmin()])],
            "key_noise": [[float(x) for x in layer] for layer in noise[:, ek.sum(0).argmin()]],
            "per_head_gain_k": round(gain(ek_h), 4), "per_head_gain_v": round(gain(ev_h), 4),
            "error_k": {"searched": float(ek.min(1).sum()), "model": float(ek.sum(0).min()), "default": at(ek, 0.96)},
            "error_v": {"searched": float(ev.min(1).sum()), "model": float(ev.sum(0).min()), "default": at(ev, 0.92)}}
