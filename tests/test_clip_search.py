"""The clip search of calibration (jspec/model/clip_search.py): written to the rotation file, read back, used."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.config import DEFAULT_CLIPS, ConfigError, KVConfig, ModelConfig
from jspec.int2 import quant
from jspec.model import clip_search, rotation
from jspec.model.decoder import init_params
from jspec.runtime import engine
from jspec.model import calibrate as cal

# head_dim 32 and windows past clip_search's rule (sink 16, recent 64), so the searched rows read INT2 keys
CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=32)


def _tokens(seed, shape):
    return np.random.default_rng(seed).integers(0, CFG.vocab_size, shape).astype(np.int32)


def _layer0(params, tokens, rot_k, rot_v):
    """Layer 0's rotated q [B, n, Hq, D], k, v and W_o with R_V folded in, on tokens (f32)."""
    lp, qs, ks, vs = next(cal.layer_inputs(params, CFG, [tokens]))
    g, D = CFG.q_per_kv, CFG.head_dim
    rk, rv = jnp.asarray(rot_k[0]), jnp.asarray(rot_v[0])
    q = jnp.einsum("bnhd,hdf->bnhf", qs[0], jnp.repeat(rk, g, 0))
    k, v = jnp.einsum("bnhd,hdf->bnhf", ks[0], rk), jnp.einsum("bnhd,hdf->bnhf", vs[0], rv)
    wo = jnp.einsum("hdf,hgde->hgfe", rv, lp.wo.reshape(CFG.num_kv_heads, g, D, -1)).reshape(g * 2, D, -1)
    return q, k, v, wo


def _calibrated(tmp_path):
    """A tiny model calibrated with the clip search, its file written and read back: (params, rot_k, rot_v, the
    metadata written, the metadata read back, the file)."""
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.2)
    rot_k, rot_v, meta = cal.calibrate(params, CFG, [_tokens(1, (4, 160))], clip_tokens=640)
    path = tmp_path / "rot.safetensors"
    rotation.save_rotations(path, rot_k, rot_v, meta)
    return params, rot_k, rot_v, meta, rotation.load_rotations(path, CFG)[2], path


def test_searched_clip_is_written_read_back_and_used(tmp_path):
    params, rot_k, rot_v, meta, meta2, path = _calibrated(tmp_path)
    found = rotation.searched_clips(meta2, CFG)
    assert len(found["clip_k"]) == len(found["clip_v"]) == CFG.num_layers
    assert set(found["clip_k"] + found["clip_v"] + list(found["clip_model"])) <= set(clip_search.CANDIDATES)
    assert "per_head_gain_k" in meta2["clip_search"]

    # the loader takes the file's model-wide pair where the caller sets no clip, and keeps a clip it sets
    kv = engine._with_searched_clips(KVConfig("int2"), found)
    assert kv.clips == found["clip_model"] != DEFAULT_CLIPS
    assert engine._with_searched_clips(KVConfig("int2", clip_k=0.5), found).clips == (0.5, found["clip_model"][1])
    assert engine._with_searched_clips(KVConfig("int2"), None).clips == DEFAULT_CLIPS

    # held-out rows: the searched key clip gives a different attention output, with a lower error than the default's
    q, k, v, wo = _layer0(params, _tokens(2, (2, 160)), rot_k, rot_v)
    ck = found["clip_k"][0]
    ek_h, ek, _, _, _ = clip_search.layer_errors(q, k, v, wo, (ck, DEFAULT_CLIPS[0]), CFG.head_dim)
    assert ck != DEFAULT_CLIPS[0] and float(ek[0]) < float(ek[1])


def test_key_noise_is_written_read_back_and_used(tmp_path, monkeypatch):
    """The file keeps each layer's key noise at its model-wide key clip; the loader sets Layer.key_noise where the
    cache codes keys at that clip and not at another, and only where JSPEC_KEY_NOISE=on; on held-out rows the measured
    noise is the keys' own."""
    params, rot_k, rot_v, meta, meta2, path = _calibrated(tmp_path)
    noise = rotation.key_noise(meta2, CFG)
    assert noise.shape == (CFG.num_layers, CFG.num_kv_heads) and (noise > 0).all()
    found = rotation.searched_clips(meta2, CFG)
    kv = engine._with_searched_clips(KVConfig("int2"), found)
    monkeypatch.delenv("JSPEC_KEY_NOISE", raising=False)
    assert engine._key_noise(meta2, CFG, kv) is None  # off by default
    monkeypatch.setenv("JSPEC_KEY_NOISE", "on")
    np.testing.assert_array_equal(engine._key_noise(meta2, CFG, kv), noise)
    assert engine._key_noise(meta2, CFG, dataclasses.replace(kv, clip_k=0.5)) is None
    assert engine._key_noise(meta2, CFG, dataclasses.replace(kv, group_size=8)) is None
    assert rotation.key_noise(cal.calibrate(params, CFG, [_tokens(1, (2, 96))], clip_tokens=0)[2], CFG) is None

    # held-out rows, layer 0 at the file's key clip: the measured noise is the keys' own (its shift: test_int2_kernel)
    q, k, v, _ = _layer0(params, _tokens(2, (2, 160)), rot_k, rot_v)
    kq = quant.fake_quantize(k, CFG.head_dim, found["clip_model"][0], jnp.bfloat16)
    rows = jnp.arange(80, 160, 4)
    qg = q[:, rows].reshape(2, len(rows), CFG.num_kv_heads, CFG.q_per_kv, CFG.head_dim)
    np.testing.assert_allclose(clip_search.noise_variance(qg, kq - k), noise[0], rtol=0.5)
    save = lambda m: rotation.save_rotations(path, rot_k, rot_v, meta | m)
    for bad in ('[[0.1, 0.2]]', '"x"', '[[0.1, -1.0], [0.1, 0.2]]'):
        save({"key_noise": bad})
        with pytest.raises(ConfigError, match="key_noise"):
            rotation.load_rotations(path, CFG)


def test_files_without_a_searched_clip_keep_the_defaults(tmp_path):
    params = init_params(CFG, jax.random.PRNGKey(0), std=0.2)
    rot_k, rot_v, meta = cal.calibrate(params, CFG, [_tokens(1, (2, 96))], clip_tokens=0)
    assert rotation.searched_clips(meta, CFG) is None
    path = tmp_path / "rot.safetensors"
    rotation.save_rotations(path, rot_k, rot_v, meta | {"clip_k": "[0.9]"})
    with pytest.raises(ConfigError, match="searched clip entries incomplete"):
        rotation.load_rotations(path, CFG)
    bad = {"clip_k": "[0.9, 2.0]", "clip_v": "[0.9, 0.9]", "clip_model": "[0.9, 0.9]"}
    rotation.save_rotations(path, rot_k, rot_v, meta | bad)
    with pytest.raises(ConfigError, match="clip_k must be a list of 2 quantiles"):
        rotation.load_rotations(path, dataclasses.replace(CFG))
