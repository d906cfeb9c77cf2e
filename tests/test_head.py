"""EAGLE-3 heads (jspec/head.py, jspec/eagle3.py): the published checkpoint format and the head draft mode
through jspec.load.

A synthetic head is written tensor by tensor in the published names, shapes and dtypes (SGLang/vLLM's
LlamaForCausalLMEagle3: fc, midlayer.*, norm, lm_head, int64 d2t, bool t2d), loaded, and its logits compared
with a direct PyTorch reading of the same tensors; heads that do not fit the target are clear errors; a
head directory given as the draft runs the head mode, lossless against plain decoding.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import jspec
from jspec.config import ConfigError, GenerateConfig, SamplingConfig, load_model_config
from jspec.decode import drafters
from jspec.decode.state import Drafter, DraftMode, Models
from jspec.io import eagle3
from jspec.model import head, decoder as model
from jspec.model.sampling import Sampler

E, HQ, HKV, D, F, VD = 32, 2, 1, 16, 48, 200  # the qwen3 fixture: hidden 32, head_dim 16, vocab 300, 2 layers


def _write_head(path, target, seed=0, **overrides):
    """A random head in the published format: config.json + model.safetensors (PyTorch [out, in] layout)."""
    rng = np.random.default_rng(seed)
    V = target.vocab_size
    w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    norm = lambda: (1 + 0.2 * rng.standard_normal(E)).astype(np.float32)
    d2t = np.sort(rng.choice(V, VD, replace=False)) - np.arange(VD)  # draft token i -> target i + d2t[i]
    t2d = np.zeros(V, bool)
    t2d[np.arange(VD) + d2t] = True
    tensors = {
        "fc.weight": w(E, 3 * E), "midlayer.input_layernorm.weight": norm(), "midlayer.hidden_norm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": w(HQ * D, 2 * E), "midlayer.self_attn.k_proj.weight": w(HKV * D, 2 * E),
        "midlayer.self_attn.v_proj.weight": w(HKV * D, 2 * E), "midlayer.self_attn.o_proj.weight": w(E, HQ * D),
        "midlayer.post_attention_layernorm.weight": norm(), "midlayer.mlp.gate_proj.weight": w(F, E),
        "midlayer.mlp.up_proj.weight": w(F, E), "midlayer.mlp.down_proj.weight": w(E, F), "norm.weight": norm(),
        "lm_head.weight": w(VD, E), "d2t": d2t.astype(np.int64), "t2d": t2d,
    }
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": E,
              "intermediate_size": F, "num_hidden_layers": 1, "num_attention_heads": HQ, "num_key_value_heads": HKV,
              "head_dim": D, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
              "vocab_size": V, "draft_vocab_size": VD, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
              **overrides}
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config))
    return tensors


def _torch_head(t, embed, tokens, tapped, eps=1e-6):
    """The head read directly from its tensors t (PyTorch, float64): logits [n, V] for one sequence."""
    torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")

    t = {k: torch.as_tensor(np.asarray(v, np.float64) if v.dtype.kind == "f" else v) for k, v in t.items()}
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    feat = torch.as_tensor(np.array(tapped, np.float64)) @ t["fc.weight"].T
    emb = torch.as_tensor(np.array(embed, np.float64))[torch.as_tensor(np.array(tokens))]
    x = torch.cat([rms(emb, t["midlayer.input_layernorm.weight"]), rms(feat, t["midlayer.hidden_norm.weight"])], -1)
    n = x.shape[0]
    proj = lambda name, h: (x @ t[f"midlayer.self_attn.{name}_proj.weight"].T).reshape(n, h, D)
    q, k, v = proj("q", HQ), proj("k", HKV), proj("v", HKV)
    ang = torch.arange(n, dtype=torch.float64)[:, None] / 10000.0 ** (torch.arange(0, D, 2) / D)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    half = lambda y: torch.cat([-y[..., D // 2:], y[..., : D // 2]], -1)
    q, k = q * cos + half(q) * sin, k * cos + half(k) * sin
    k, v = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / D**0.5
    s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(n, HQ * D)
    r = feat + o @ t["midlayer.self_attn.o_proj.weight"].T
    m = rms(r, t["midlayer.post_attention_layernorm.weight"])
    act = torch.nn.functional.silu(m @ t["midlayer.mlp.gate_proj.weight"].T) * (m @ t["midlayer.mlp.up_proj.weight"].T)
    r = r + act @ t["midlayer.mlp.down_proj.weight"].T
    draft_logits = rms(r, t["norm.weight"]) @ t["lm_head.weight"].T
    logits = torch.full((n, len(t["t2d"])), float("-inf"), dtype=torch.float64)
    logits[:, torch.arange(VD) + t["d2t"]] = draft_logits
    return logits.numpy()


def test_published_format_loads_and_matches_a_direct_reading(hf_model_dir, tmp_path, f32_matmul):
    target_dir = hf_model_dir("qwen3")
    tcfg = load_model_config(target_dir)
    tensors = _write_head(tmp_path / "head", tcfg)
    assert eagle3.is_head_dir(tmp_path / "head") and not eagle3.is_head_dir(target_dir)
    hcfg, hp = eagle3.load_head(tmp_path / "head", tcfg, jnp.float32)
    assert hcfg.taps == (0, 1, 2) and hcfg.draft_vocab == VD and hp.d2t.dtype == jnp.int32
    tparams = jspec.io.checkpoint.load_params(target_dir, tcfg, jnp.float32)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, tcfg.vocab_size, (1, 9)), jnp.int32)
    _, _, tapped = model.forward_taps(tparams, tcfg, tokens, None, hcfg.taps)
    nxt = jnp.roll(tokens, -1, axis=1)
    got, _, _ = head.forward(hp, hcfg, tparams.embed, nxt, head.fuse(hp, tapped))
    want = _torch_head(tensors, tparams.embed, np.asarray(nxt[0]), np.asarray(tapped[0]))
    got = np.asarray(got[0])
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))  # -inf exactly off the draft vocabulary
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-4, atol=1e-4)
    # the exporter writes what the loader reads, in the same names
    eagle3.save_head(tmp_path / "again", hcfg, hp, tcfg)
    hcfg2, hp2 = eagle3.load_head(tmp_path / "again", tcfg, jnp.float32)
    assert hcfg2 == hcfg
    np.testing.assert_array_equal(np.asarray(hp2.d2t), np.asarray(hp.d2t))
    np.testing.assert_allclose(np.asarray(hp2.layer.wqkv), np.asarray(hp.layer.wqkv), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("override,message", [
    (dict(hidden_size=48), "hidden_size 48 does not fit the target's hidden_size 32"),
    (dict(vocab_size=512), "vocab_size 512 does not fit the target's vocab_size 300"),
    (dict(target_hidden_size=64), "target_hidden_size 64 does not fit"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 5]}), "must be 3 distinct indices in [0, 2]"),
])
def test_head_that_does_not_fit_is_a_clear_error(hf_model_dir, tmp_path, override, message):
    tcfg = load_model_config(hf_model_dir("qwen3"))
    _write_head(tmp_path / "head", tcfg, **override)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        eagle3.load_head(tmp_path / "head", tcfg, jnp.float32)


def test_wrong_tensor_shape_names_the_tensor(hf_model_dir, tmp_path):
    tcfg = load_model_config(hf_model_dir("qwen3"))
    _write_head(tmp_path / "head", tcfg, draft_vocab_size=VD - 1)
    with pytest.raises(ValueError, match=r"tensor 'd2t' has shape \(200,\), expected \(199,\)"):
        eagle3.load_head(tmp_path / "head", tcfg, jnp.float32)


def test_load_with_a_head_directory_drafts_with_the_head(hf_model_dir, tmp_path):
    """jspec.load(draft=HEAD_DIR): the head mode; greedy output equals plain decoding's (float32), and
    lookahead "auto" measures the head's step and picks K from it."""
    target_dir = hf_model_dir("qwen3")
    _write_head(tmp_path / "head", load_model_config(target_dir))
    eng = jspec.load(target_dir, draft=tmp_path / "head", kv=jspec.KVConfig("bf16"), dtype="float32", mesh=None)
    assert eng.draft_mode == "head" and eng.drafter.model is None
    prompts = ["the quick brown fox", "hello world"]
    run = lambda K: eng.generate(prompts, GenerateConfig(max_new_tokens=12, lookahead=K), SamplingConfig())
    plain, spec = run(0), run(3)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert spec[0].stats.draft_mode == "head" and spec[0].stats.lookahead == 3
    auto = run("auto")
    assert [r.token_ids for r in auto] == [r.token_ids for r in plain]
    costs = auto[0].stats.lookahead_auto["costs_ms"]
    assert costs["head_step"] > 0 and auto[0].stats.lookahead_auto["mode"] == "head"
    with pytest.raises(ConfigError, match="does not combine with ngram"):
        jspec.load(target_dir, draft=f"ngram+{tmp_path / 'head'}", kv=jspec.KVConfig("bf16"), mesh=None)


def test_greedy_head_draw_is_the_argmax_over_the_target_vocabulary(hf_model_dir, tmp_path):
    """drafters.draw_head's greedy token (an argmax over the draft vocabulary, mapped by d2t: no V-wide work) is
    the argmax of head.forward's logits over the target's vocabulary; sampled, its q is 0 off the draft's."""
    tcfg = load_model_config(hf_model_dir("qwen3"))
    _write_head(tmp_path / "head", tcfg)
    hcfg, hp = eagle3.load_head(tmp_path / "head", tcfg, jnp.float32)
    embed = jnp.asarray(np.random.default_rng(2).standard_normal((tcfg.vocab_size, E)), jnp.float32)
    m = Models(model.Params(embed, (), jnp.ones(E)), Drafter(head=hp, mode=DraftMode.HEAD, head_cfg=hcfg), tcfg, 2)
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(0, tcfg.vocab_size, (6, 1)), jnp.int32)
    feats = jnp.asarray(rng.standard_normal((6, 1, E)), jnp.float32)
    logits, h, _ = head.forward(hp, hcfg, embed, tokens, feats)
    d, q = drafters.draw_head(m, None, h[:, 0], Sampler.make(6))
    assert q is None
    np.testing.assert_array_equal(np.asarray(d), np.asarray(jnp.argmax(logits[:, 0], -1)))
    _, q = drafters.draw_head(m, jax.random.split(jax.random.key(0), 6), h[:, 0], Sampler.make(6, temperature=1.0))
    np.testing.assert_array_equal(np.asarray(q) > 0, np.isfinite(np.asarray(logits[:, 0])))
