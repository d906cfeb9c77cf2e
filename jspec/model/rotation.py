"""OSCAR rotations: construction from covariances, the rotation file, and folding into the params.

Convention (oscar.md section 2.5): rows are rotated on the right, x_rot = x @ R with R [in, out].
- R_K = U_Q . H . P_br rotates post-RoPE q and k at run time (q.k unchanged, R_K orthogonal).
- R_V = U_S . H . P_br is folded into W_v (the v slot of wqkv: v comes out rotated) and R_V^T into
  W_o (the attention output is un-rotated for free), so values cost nothing at run time.
U: eigenvectors of the target covariance; H: normalized Walsh-Hadamard; P_br: eigenvalue-sorted
bit-reversal permutation. All math in float64 numpy; rotations are stored as float32.

The order of U's columns matters for the codec although the design's formula leaves it open. Column j
of U is spread along row j of H, and row 0 of H is the constant vector 1/sqrt(D): a row's component
along U's first column becomes the same offset on every coordinate, which the asymmetric min-max code
absorbs in its zero point for free (it does not widen the range). ORDERS: "desc" (the default; the
OSCAR website's convention) puts the largest eigen-direction there, so the most energetic direction of
the target costs nothing; "asc" (the released code's `eigh` order, and jspec's before issue 18) puts
the smallest there. P_br is the same partition either way (oscar.md 2.4), and a no-op when G = D.

A rotation file is safetensors with `rot_k.{layer}` and `rot_v.{layer}` of shape [Hkv, D, D] (a
per-layer rotation is stored replicated over heads) plus string metadata (see save_rotations).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jspec.config import ConfigError, ModelConfig
from jspec.model.decoder import Params, stack_layers

FORMAT_VERSION = "1"
MODES = ("none", "hadamard", "oscar")
ORDERS = ("desc", "asc")  # U's column order: which eigen-direction lands on H's constant row 0
# what each mode fits keys / values from (oscar.md 2.2, 2.3: the released code's qqt and sst)
OBJECTIVES = {"none": "identity", "hadamard": "hadamard", "oscar": "qqt_r_h_pbr/sst_r_h_pbr"}


def check_head_dim(D: int) -> None:
    if D < 1 or D & (D - 1):
        raise ConfigError(f"head_dim {D} is not a power of two: the Walsh-Hadamard rotation needs one")


def hadamard(D: int) -> np.ndarray:
    """Sylvester Walsh-Hadamard / sqrt(D): H[i, j] = (-1)^popcount(i & j) / sqrt(D); symmetric, H H = I."""
    check_head_dim(D)
    H = np.ones((1, 1))
    while H.shape[0] < D:
        H = np.block([[H, H], [H, -H]])
    return H / np.sqrt(D)


def bit_reversal(D: int) -> np.ndarray:
    """br[i] = i with its log2(D) bits reversed."""
    check_head_dim(D)
    bits = D.bit_length() - 1
    return np.array([int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(D)])


def permutation_br(eigvals: np.ndarray) -> np.ndarray:
    """P_br [D, D] with (x P)[br(i)] = x[sigma_i], sigma = indices by descending eigenvalue.

    So output coordinate 0 takes the largest, D/2 the 2nd, D/4 the 3rd, 3D/4 the 4th: important
    directions land in different power-of-two groups. A no-op for quantization when G = D.
    """
    D = len(eigvals)
    sigma = np.argsort(-np.asarray(eigvals), kind="stable")
    pi = np.empty(D, np.int64)
    pi[bit_reversal(D)] = sigma
    return np.eye(D)[:, pi]


def eigen(C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors (columns) of a symmetric matrix, in float64.

    Each eigenvector's sign is fixed (largest-magnitude entry positive) so that refits are
    reproducible across LAPACK builds.
    """
    C = np.asarray(C, np.float64)
    lam, U = np.linalg.eigh((C + C.T) / 2)
    top = np.abs(U).argmax(0)
    return lam, U * np.sign(U[top, np.arange(len(lam))])


def oscar_rotation(C: np.ndarray, order: str = "desc") -> np.ndarray:
    """R = U . H . P_br for the covariance C [D, D] (float64), U's columns in `order` of eigenvalue."""
    if order not in ORDERS:
        raise ConfigError(f"unknown eigenvector order {order!r}; use one of {', '.join(ORDERS)}")
    lam, U = eigen(C)
    if order == "desc":
        lam, U = lam[::-1], U[:, ::-1]
    return U @ hadamard(len(lam)) @ permutation_br(lam)


def rotations_from_covariances(cq: np.ndarray, cs: np.ndarray, per_head: bool = True, order: str = "desc"):
    """cq, cs [L, Hkv, D, D] (query / score-weighted value targets) -> rot_k, rot_v lists of [Hkv, D, D].

    per_head=False pools the heads of a layer (oscar.md format v1: mean over KV heads) and
    replicates the one rotation, so the file and run-time shapes stay the same.
    """
    def fit(c):  # [Hkv, D, D] -> [Hkv, D, D] float32
        if not per_head:
            c = np.broadcast_to(c.mean(0), c.shape)
        return np.stack([oscar_rotation(ch, order) for ch in c]).astype(np.float32)

    return [fit(c) for c in cq], [fit(c) for c in cs]


def data_free_rotations(cfg: ModelConfig, mode: str):
    """rot_k, rot_v for the modes that need no data: "none" (identity) or "hadamard" (H only)."""
    D, Hkv = cfg.head_dim, cfg.num_kv_heads
    if mode == "none":
        R = np.eye(D)
    elif mode == "hadamard":
        R = hadamard(D)
    else:
        raise ConfigError(f"rotation mode {mode!r} needs calibration data; data-free modes: none, hadamard")
    R = np.broadcast_to(R.astype(np.float32), (Hkv, D, D))
    return [R.copy() for _ in range(cfg.num_layers)], [R.copy() for _ in range(cfg.num_layers)]


def hadamard_rotations(cfg: ModelConfig):
    """The data-free ablation: R_K = R_V = H for every layer and head."""
    return data_free_rotations(cfg, "hadamard")


# The fields that shape a model's attention; run-time settings (context length, EOS ids, sliding
# window) may change without invalidating a rotation file.
HASHED_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "rms_eps", "rope_theta", "rope_llama3", "tie_embeddings",
                 "qkv_bias", "qk_norm")
# Fields added since: hashed only when set, so that the files of models without them keep their hash.
HASHED_WHEN_SET = ("o_bias", "mlp_bias", "rope_linear")


def config_hash(cfg: ModelConfig) -> str:
    """A short stable hash of the architecture fields of a ModelConfig: ties a rotation file to its model."""
    fields = dataclasses.asdict(cfg)
    hashed = {k: fields[k] for k in HASHED_FIELDS} | {k: fields[k] for k in HASHED_WHEN_SET if fields[k]}
    text = json.dumps(hashed, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_meta(cfg: ModelConfig, mode: str, per_head: bool, tokens: int, order: str = "desc") -> dict:
    """The rotation file's metadata; eigen_order (U's column order, ORDERS) only for OSCAR."""
    if mode not in MODES:
        raise ConfigError(f"unknown rotation mode {mode!r}; use one of {', '.join(MODES)}")
    return {
        **({"eigen_order": order} if mode == "oscar" else {}),
        "format_version": FORMAT_VERSION,
        "mode": mode,
        "objective": OBJECTIVES[mode],
        "grouping": "per_head" if per_head else "per_layer",
        "calibration_tokens": str(tokens),
        "config_hash": config_hash(cfg),
        "num_layers": str(cfg.num_layers),
        "num_kv_heads": str(cfg.num_kv_heads),
        "head_dim": str(cfg.head_dim),
    }


CLIP_KEYS = ("clip_k", "clip_v", "clip_model")  # a searched clip's metadata (JSON lists), with its clip_search


def clip_meta(found: dict, provenance: dict) -> dict:
    """The metadata of a searched clip (clip_search.choose's result): per-layer key and value quantiles, the
    model-wide pair the run time uses, the key noise at its key clip (key_noise), and clip_search: how they were
    found and what they gain."""
    kept = (*CLIP_KEYS, KEY_NOISE)
    return {k: json.dumps(found[k]) for k in kept} | {
        "clip_search": json.dumps(provenance | {k: v for k, v in found.items() if k not in kept})}


KEY_NOISE = "key_noise"  # [L][Hkv] JSON: Layer.key_noise, measured by the clip search at clip_model's key clip


def key_noise(meta: dict, cfg: ModelConfig) -> np.ndarray | None:
    """Layer.key_noise [L, Hkv] float32 of a rotation file's metadata; None for a file without it (a file written
    before the key-noise correction, or with --clip-tokens 0); ConfigError when it is malformed."""
    if KEY_NOISE not in meta:
        return None
    try:
        x = np.asarray(json.loads(meta[KEY_NOISE]), np.float64)
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ConfigError(f"rotation metadata: {KEY_NOISE} is not a JSON list of numbers ({e})") from None
    if x.shape != (cfg.num_layers, cfg.num_kv_heads) or not (np.isfinite(x).all() and (x >= 0).all()):
        raise ConfigError(f"rotation metadata: {KEY_NOISE} must be {cfg.num_layers} lists of {cfg.num_kv_heads} "
                          f"variances >= 0, got {meta[KEY_NOISE][:80]!r}")
    return x.astype(np.float32)


def searched_clips(meta: dict, cfg: ModelConfig) -> dict | None:
    """{clip_k: [L], clip_v: [L], clip_model: (k, v)} of a rotation file's metadata; None for a file without a
    searched clip (then the defaults apply); ConfigError when the entries are malformed."""
    if not any(k in meta for k in CLIP_KEYS):
        return None
    try:
        out = {k: json.loads(meta[k]) for k in CLIP_KEYS}
    except (KeyError, json.JSONDecodeError, TypeError) as e:
        raise ConfigError(f"rotation metadata: searched clip entries incomplete or not JSON ({e})") from None
    sizes = {"clip_k": cfg.num_layers, "clip_v": cfg.num_layers, "clip_model": 2}
    for k, n in sizes.items():
        x = out[k]
        if not (isinstance(x, list) and len(x) == n and all(isinstance(c, (int, float)) and c <= 1 for c in x)):
            raise ConfigError(f"rotation metadata: {k} must be a list of {n} quantiles <= 1, got {meta[k][:80]!r}")
    out["clip_model"] = tuple(float(c) for c in out["clip_model"])
    return out


def save_rotations(path, rot_k: Sequence, rot_v: Sequence, meta: dict) -> None:
    """Writes rot_k.{l} / rot_v.{l} [Hkv, D, D] float32 and meta (values stored as strings)."""
    from safetensors.numpy import save_file

    tensors = {}
    for i, (rk, rv) in enumerate(zip(rot_k, rot_v, strict=True)):
        tensors[f"rot_k.{i}"] = np.ascontiguousarray(rk, np.float32)
        tensors[f"rot_v.{i}"] = np.ascontiguousarray(rv, np.float32)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={k: str(v) for k, v in meta.items()})


# Largest |R R^T - I| of a rotation read back: jspec writes them in float32 (errors about 1e-6).
ORTHOGONAL_TOL = 1e-3


# Metadata keys every rotation file jspec writes carries (make_meta): what tells one from other safetensors.
META_KEYS = ("format_version", "mode", "objective", "grouping", "config_hash")


def is_rotation_file(path) -> bool:
    """Whether path is a safetensors file with jspec's rotation metadata (only the header is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError, TypeError):
        return False
    return all(k in meta for k in META_KEYS) and meta["mode"] in MODES


def read_rotation_file(path) -> tuple[dict, dict]:
    """(metadata, tensors) of a safetensors file; ConfigError naming the file when it is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return dict(f.metadata() or {}), {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{path}: not a readable rotation file ({first})") from None


def check_rotation(name: str, r: np.ndarray) -> np.ndarray:
    """r [Hkv, D, D] as float32 when every matrix is finite and orthogonal (to ORTHOGONAL_TOL); else ConfigError
    naming the tensor: a NaN, zero or skewed rotation would run and print broken text."""
    r = np.asarray(r, np.float32)
    if not np.isfinite(r).all():
        raise ConfigError(f"{name} holds NaN or infinite values")
    r64 = r.astype(np.float64)
    err = float(np.abs(r64 @ np.swapaxes(r64, 1, 2) - np.eye(r.shape[-1])).max(initial=0.0))
    if err > ORTHOGONAL_TOL:
        raise ConfigError(f"{name} is not orthogonal (max |R R^T - I| = {err:.3g} > {ORTHOGONAL_TOL:g})")
    return r


def load_rotations(path, cfg: ModelConfig):
    """Reads a rotation file for cfg -> (rot_k, rot_v lists of [Hkv, D, D] float32, meta).

    Raises ConfigError naming the file when it is not a rotation file, was made for another model, or holds
    tensors of the wrong shape or not finite and orthogonal.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no rotation file at {str(path)!r}")
    meta, tensors = read_rotation_file(path)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"{path}: rotation format {meta.get('format_version')!r}, expected {FORMAT_VERSION}")
    if meta.get("config_hash") != config_hash(cfg):
        raise ConfigError(
            f"{path} was calibrated for another model config (hash {meta.get('config_hash')}, this model"
            f" {config_hash(cfg)}); recalibrate with python -m jspec.calibrate"
        )
    want = (cfg.num_kv_heads, cfg.head_dim, cfg.head_dim)
    rot = {}
    for kind in ("rot_k", "rot_v"):
        rot[kind] = [tensors.get(f"{kind}.{i}") for i in range(cfg.num_layers)]
        bad = [i for i, r in enumerate(rot[kind]) if r is None or r.shape != want]
        if bad:
            raise ConfigError(f"{path}: {kind} of layers {bad} missing or not of shape {want}")
        try:
            rot[kind] = [check_rotation(f"{kind}.{i}", r) for i, r in enumerate(rot[kind])]
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    try:
        searched_clips(meta, cfg)
        key_noise(meta, cfg)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return rot["rot_k"], rot["rot_v"], meta


def with_key_noise(params: Params, noise) -> Params:
    """params with Layer.key_noise [L, Hkv] set (key_noise's), whose bias the attention paths take out."""
    return params.replace(layers=params.layers.replace(key_noise=jnp.asarray(noise, jnp.float32)))


def apply_rotations(params: Params, cfg: ModelConfig, rot_k: Sequence, rot_v: Sequence) -> Params:
    """Sets Layer.rot_k, folds R_V into the v slot of wqkv/bqkv and R_V^T into W_o; the model is unchanged.

    v_rot = v @ R_V[h] for KV head h, and o_rot @ R_V[h]^T = o for every query head i using h
    (i // q_per_kv == h), so W_o's row block of head i becomes R_V[h]^T @ W_o[i*D:(i+1)*D].
    """
    if len(rot_k) != cfg.num_layers or len(rot_v) != cfg.num_layers:
        raise ConfigError(f"need {cfg.num_layers} layers of rotations, got {len(rot_k)} / {len(rot_v)}")
    if params.layers.rot_k is not None:
        raise ConfigError("params are already rotated; apply rotations to the original weights")
    new = stack_layers([_rotated_fields(params.layer(i), cfg, rk, rv) for i, (rk, rv) in enumerate(zip(rot_k, rot_v))])
    return params.replace(layers=params.layers.replace(**new))


def _rotated_fields(lp, cfg: ModelConfig, rk, rv) -> dict:
    """One layer's fields that the rotations change, rotated."""
    Hkv, g, D = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    rk, rv = jnp.asarray(rk, jnp.float32), jnp.asarray(rv, jnp.float32)  # [Hkv, D, D]
    dtype = lp.wqkv.dtype
    wv = jnp.einsum("ehd,hdf->ehf", lp.wqkv[:, :, g + 1, :].astype(jnp.float32), rv)  # v slot [E, Hkv, D]
    wo = lp.wo.astype(jnp.float32).reshape(Hkv, g, D, -1)  # [Hkv, g, D, E]
    wo = jnp.einsum("hdf,hgde->hgfe", rv, wo).reshape(lp.wo.shape)  # R_V^T @ block
    # R_K transposed in f32 (model.rotate), its values rounded to the weights' dtype as the prefill's GEMM reads
    rot_t = jnp.swapaxes(rk.astype(dtype).astype(jnp.float32), 1, 2)
    new = dict(rot_k=rot_t, wqkv=lp.wqkv.at[:, :, g + 1, :].set(wv.astype(dtype)),
               wo=wo.astype(lp.wo.dtype))
    if lp.bqkv is not None:
        bv = jnp.einsum("hd,hdf->hf", lp.bqkv[:, g + 1, :].astype(jnp.float32), rv)  # [Hkv, D]
        new["bqkv"] = lp.bqkv.at[:, g + 1, :].set(bv.astype(lp.bqkv.dtype))
    return new
