"""OSCAR calibration: run the model over text, accumulate the covariance targets, fit rotations.

Per (layer, KV head h), in float64 on the host (oscar.md 2.2, 2.3, the released code's qqt / sst):
- C_Q[h] = sum of q q^T over the post-RoPE queries of h's g query heads and all T tokens, / (T g).
- e_t = k_t^T C_Q[h] k_t, the expected squared logit of key t under h's query distribution, and
  C_S[h] = sum_t e_t v_t v_t^T / sum_t e_t (the score-weighted value covariance).
The model runs layer by layer over all batches, so the weights e_t can use the finished C_Q of the
layer while the keys and values of that one layer are still at hand.

Rotations R = U . H . P_br with U's columns in descending eigenvalue order by default (--order desc):
the top eigen-direction lands on H's constant row, which the asymmetric INT2 code absorbs in its zero
point (jspec/rotation.py); --order asc is the released code's order and jspec's before issue 18.

The command line over it is jspec.cli.calibrate (`jspec calibrate`).

With the rotations of a layer fitted, the clip search (jspec.model.clip_search) scores candidate clip quantiles
for its keys and values on the first --clip-tokens tokens, by the error of the attention output; the rotation
file keeps the best per layer, the model-wide pair the run time uses, the key noise that pair's key clip leaves
(Layer.key_noise: the bias it puts in the INT2 scores, taken out at run time under JSPEC_KEY_NOISE=on), and how
they were found.
"""

from __future__ import annotations

import glob
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jspec.config import INT32_MAX, ConfigError, ModelConfig, check_int
from jspec.model import clip_search, rotation
from jspec.model.decoder import BlockSpec, Layer, Params, block, rope_tables


@partial(jax.jit, static_argnums=1)
def _layer_step(lp: Layer, cfg: ModelConfig, x, y):
    """One decoder layer (model.block), plain causal in float32, over the residual x + y [B, n, E] (y: the last
    layer's MLP output) -> (x, y for the next layer, post-RoPE q, k, v)."""
    B, n, _ = x.shape
    pos = jnp.broadcast_to(jnp.arange(n), (B, n))
    _, x, y, q, k, v = block(lp, x, y, rope_tables(cfg, pos), None, jnp.zeros((B,), jnp.int32),
                             spec=BlockSpec(cfg, None))
    return x, y, q, k, v


CLIP_TOKENS = 4096  # tokens the clip search reads by default (the first calibration batches)


def query_second_moment(q, Hkv: int) -> np.ndarray:
    """q [..., Hq, D] -> sum of q q^T per KV head [Hkv, D, D] float64 (consecutive GQA groups)."""
    Hq, D = q.shape[-2:]
    q = np.asarray(q, np.float64).reshape(-1, Hkv, Hq // Hkv, D)  # [N, Hkv, g, D]
    qh = q.transpose(1, 0, 2, 3).reshape(Hkv, -1, D)  # [Hkv, N*g, D]
    return qh.transpose(0, 2, 1) @ qh


def score_weighted_moment(k, v, cq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """k, v [..., Hkv, D], C_Q [Hkv, D, D] -> (sum_t e_t v v^T [Hkv, D, D], sum_t e_t [Hkv])."""
    Hkv, D = k.shape[-2:]
    k = np.asarray(k, np.float64).reshape(-1, Hkv, D).transpose(1, 0, 2)  # [Hkv, N, D]
    v = np.asarray(v, np.float64).reshape(-1, Hkv, D).transpose(1, 0, 2)
    e = np.sum((k @ cq) * k, -1)  # [Hkv, N]: expected squared logit of each key
    return (v * e[..., None]).transpose(0, 2, 1) @ v, e.sum(1)


def layer_targets(qs, ks, vs, Hkv: int) -> tuple[np.ndarray, np.ndarray]:
    """Lists of one layer's q [B, n, Hq, D], k, v [B, n, Hkv, D] -> (C_Q, C_S), each [Hkv, D, D]."""
    rows = sum(q.size // q.shape[-1] for q in qs) // Hkv  # T * g query rows per KV head
    cq = sum(query_second_moment(q, Hkv) for q in qs) / rows
    num, den = 0.0, 0.0
    for k, v in zip(ks, vs):
        n_, d_ = score_weighted_moment(k, v, cq)
        num, den = num + n_, den + d_
    return cq, num / np.maximum(den, np.finfo(np.float64).tiny)[:, None, None]


def layer_inputs(params: Params, cfg: ModelConfig, batches):
    """Runs the model layer by layer over token batches [B, n] -> per layer (its f32 params, and its lists of
    post-RoPE q [B, n, Hq, D], k, v [B, n, Hkv, D], one per batch): one layer's activations in memory at a time."""
    f32 = lambda t: jax.tree.map(lambda a: a.astype(jnp.float32), t)
    xs = [params.embed[jnp.asarray(t)].astype(jnp.float32) for t in batches]  # [B, n, E] each
    ys = [jnp.zeros_like(x) for x in xs]
    for i in range(params.num_layers):
        lp = f32(params.layer(i))
        qs, ks, vs = [], [], []
        for b, (x, y) in enumerate(zip(xs, ys)):
            xs[b], ys[b], q, k, v = _layer_step(lp, cfg, x, y)
            qs.append(q)
            ks.append(k)
            vs.append(v)
        yield lp, qs, ks, vs


def collect_targets(params: Params, cfg: ModelConfig, batches) -> tuple[np.ndarray, np.ndarray]:
    """C_Q, C_S [L, Hkv, D, D] float64 of the token batches [B, n]."""
    layers = layer_inputs(params, cfg, batches)
    cqs, css = zip(*(layer_targets(qs, ks, vs, cfg.num_kv_heads) for _, qs, ks, vs in layers))
    return np.stack(cqs), np.stack(css)


def search_batches(batches, tokens: int) -> int:
    """How many of the batches the clip search reads: the first ones holding about `tokens` tokens (at least one)."""
    sizes = np.cumsum([t.size for t in batches])
    return max(1, int(np.searchsorted(sizes, tokens, side="left")) + 1) if tokens < sizes[-1] else len(batches)


def calibrate(params: Params, cfg: ModelConfig, token_batches, mode: str = "oscar", per_head: bool = True,
              order: str = "desc", clip_tokens: int = CLIP_TOKENS, group_size: int | None = None):
    """Fits rotations for params (un-rotated weights) -> (rot_k, rot_v lists of [Hkv, D, D] f32, meta).

    token_batches: an iterable of int token arrays [B, n] (read more than once; only "oscar" uses it).
    order: U's column order (rotation.ORDERS).
    clip_tokens: tokens of the first batches the clip search (model.clip_search) reads; 0: no search (the file
    then carries no clip, and the run time uses config.DEFAULT_CLIPS). group_size: the codec's (None: head_dim).
    """
    meta = rotation.make_meta(cfg, mode, per_head, 0, order)
    if mode != "oscar":
        return (*rotation.data_free_rotations(cfg, mode), meta)
    rotation.check_head_dim(cfg.head_dim)
    if params.layers.rot_k is not None:
        raise ConfigError("calibrate needs the original weights, not params with rotations applied")
    batches = [np.asarray(t) for t in token_batches]
    tokens = sum(t.size for t in batches)
    if tokens == 0:
        raise ConfigError("oscar calibration needs at least one token of calibration data")
    m = search_batches(batches, clip_tokens) if clip_tokens > 0 else 0
    rot_k, rot_v, errors = [], [], []
    layers = tqdm(layer_inputs(params, cfg, batches), total=cfg.num_layers, desc="calibrate", unit="layer",
                  disable=None)
    for lp, qs, ks, vs in layers:
        cq, cs = layer_targets(qs, ks, vs, cfg.num_kv_heads)
        (rk,), (rv,) = rotation.rotations_from_covariances(cq[None], cs[None], per_head, order)
        rot_k.append(rk)
        rot_v.append(rv)
        if m:
            errors.append(clip_search.search_layer(lp, cfg, qs[:m], ks[:m], vs[:m], rk, rv,
                                                   group_size or cfg.head_dim))
    meta = rotation.make_meta(cfg, mode, per_head, tokens, order)
    if m:
        provenance = {"objective": clip_search.OBJECTIVE, "candidates": list(clip_search.CANDIDATES),
                      "rule": [clip_search.SINK, clip_search.RECENT], "tokens": int(sum(t.size for t in batches[:m])),
                      "group_size": group_size or cfg.head_dim,
                      "key_noise": "clip_search.noise_variance at clip_model's key quantile, on the searched queries"}
        meta |= rotation.clip_meta(clip_search.choose(errors), provenance)
    return rot_k, rot_v, meta


def data_files(model_dir: Path, data: list[str] | None) -> list[Path]:
    """The calibration text files: --data paths/globs, else DIR/calibration.txt."""
    if not data:
        default = model_dir / "calibration.txt"
        if not default.is_file():
            raise FileNotFoundError(
                f"no calibration data: pass --data PATH_OR_GLOB (text files) or put {default} in place"
            )
        return [default]
    files = []
    for pattern in data:
        found = sorted(glob.glob(pattern)) or ([pattern] if Path(pattern).is_file() else [])
        if not found:
            raise FileNotFoundError(f"--data {pattern!r} matches no file")
        not_files = [f for f in found if not Path(f).is_file()]
        if not_files:
            raise ConfigError(f"--data {pattern!r} matches {not_files[0]!r}, which is not a file: give text files")
        files += [Path(f) for f in found]
    return files


def read_text(path: Path) -> str:
    """A calibration file's text; ConfigError naming the file when it cannot be read or is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"calibration file {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"calibration file {str(path)!r} cannot be read ({e.strerror or e})") from None


def token_windows(tokenizer, files: list[Path], tokens: int, seq_len: int, batch_size: int) -> list[np.ndarray]:
    """Tokenizes each file, concatenates, cuts windows of seq_len (at most `tokens` in all) into batches."""
    for name, value in (("tokens", tokens), ("seq_len", seq_len), ("batch_size", batch_size)):
        check_int(name, value, 1, INT32_MAX)
    ids: list[int] = []
    for f in files:
        enc = tokenizer.encode(read_text(f))
        ids += list(getattr(enc, "ids", enc))  # tokenizers.Encoding or a plain list from transformers
        if len(ids) >= tokens:
            break
    ids = ids[:tokens]
    L = min(seq_len, len(ids))
    if L == 0:
        raise ConfigError(f"calibration files {[str(f) for f in files]} contain no tokens")
    windows = np.asarray(ids[: len(ids) // L * L], np.int32).reshape(-1, L)  # [N, L]
    return [windows[i : i + batch_size] for i in range(0, len(windows), batch_size)]
