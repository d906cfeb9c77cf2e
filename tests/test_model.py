"""The model against Hugging Face transformers: logits, greedy generation, checkpoints.

Every family is a tiny random transformers model saved to disk (conftest.hf_model_dir) and loaded
back through jspec.io.checkpoint, so loading, the config mapping and the forward are tested together.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import EOS_ID, FAMILIES, VOCAB
from safetensors.numpy import load_file, save_file

from jspec.cache import kvcache
from jspec.config import ConfigError, KVConfig, ModelConfig
from jspec.decode import loop as decode
from jspec.decode.state import Drafter, Models, ProgramArgs
from jspec.io import checkpoint
from jspec.io.checkpoint import CheckpointError
from jspec.model import decoder as model
from jspec.model.sampling import Sampler

torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")

pytestmark = pytest.mark.usefixtures("f32_matmul")

PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog", "speculative decoding"]
NEW = 32


@pytest.fixture(scope="module")
def jspec_model(hf_model_dir):
    """jspec_model(family, dtype) -> (cfg, params, tokenizer), loaded once per (family, dtype)."""
    loaded = {}

    def load(family, dtype=jnp.float32):
        if (family, dtype) not in loaded:
            loaded[family, dtype] = checkpoint.load_model(hf_model_dir(family), dtype)
        return loaded[family, dtype]

    return load


def _random_ids(B, n, seed=0):
    return np.random.default_rng(seed).integers(4, VOCAB, (B, n))


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids)).logits.numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family, hf_model_dir, hf_torch_model, jspec_model):
    cfg, params, _ = jspec_model(family)
    assert (params.lm_head is None) == cfg.tie_embeddings
    ids = _random_ids(3, 24)
    ref = _hf_logits(hf_torch_model(hf_model_dir(family)), ids)
    got, (k, v) = model.forward(params, cfg, jnp.asarray(ids))
    assert got.dtype == jnp.float32 and got.shape == ref.shape
    assert len(k) == cfg.num_layers and k[0].shape == (3, 24, cfg.num_kv_heads, cfg.head_dim)
    np.testing.assert_allclose(np.asarray(got), ref, atol=1e-4, rtol=0)


def test_families_cover_the_variants(jspec_model):
    """The parity tests above mean something only if the tiny configs exercise each feature."""
    cfgs = {f: jspec_model(f)[0] for f in FAMILIES}
    assert cfgs["llama3"].rope_llama3 == (8.0, 1.0, 4.0, 64)
    assert cfgs["qwen2"].qkv_bias and cfgs["qwen3"].qk_norm
    assert cfgs["mistral"].num_kv_heads == cfgs["mistral"].num_heads  # MHA
    assert cfgs["llama"].num_kv_heads < cfgs["llama"].num_heads  # GQA
    assert cfgs["qwen3"].head_dim * cfgs["qwen3"].num_heads != cfgs["qwen3"].hidden_size
    assert {c.tie_embeddings for c in cfgs.values()} == {True, False}
    assert all(c.eos_token_ids == (EOS_ID,) for c in cfgs.values())


def _jspec_greedy(cfg, params, prompts, max_new):
    """Greedy tokens per row from the jitted generate program, no draft, f32 BF16-layout cache."""
    B, P = len(prompts), max(map(len, prompts))
    padded = np.full((B, P), 3, np.int32)  # right-padded with <pad>
    for b, p in enumerate(prompts):
        padded[b, : len(p)] = p
    m = Models(params, Drafter(), cfg, 0)
    cache = kvcache.init_cache(cfg, KVConfig("bf16"), B, P + max_new + 1, jnp.float32)
    s = decode.generate_program(*ProgramArgs(
        m, jnp.asarray(padded), jnp.array([len(p) for p in prompts]), jnp.full((B,), max_new), Sampler.make(B),
        jnp.arange(B), cache, None, jnp.asarray(cfg.eos_token_ids)))
    tokens, count = np.asarray(s.tokens), np.asarray(s.count)
    return [tokens[b, : count[b]].tolist() for b in range(B)]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers_generate(family, hf_model_dir, hf_torch_model, jspec_model):
    cfg, params, tok = jspec_model(family)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3
    got = _jspec_greedy(cfg, params, prompts, NEW)
    hf = hf_torch_model(hf_model_dir(family))
    for p, row in zip(prompts, got):
        # One prompt at a time, unpadded; both stop at EOS (kept in the output) or after NEW tokens.
        out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                          do_sample=False, max_new_tokens=NEW, eos_token_id=EOS_ID, pad_token_id=3)
        assert row == out[0, len(p):].tolist()
    assert sum(map(len, got)) > NEW  # at least one row ran well past its first few tokens


def test_sharded_checkpoint_loads_equal(hf_model_dir, jspec_model):
    path = hf_model_dir("llama", sharded=True)
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("*.safetensors"))) > 2
    cfg, params, _ = checkpoint.load_model(path, jnp.float32, tokenizer=False)
    ref_cfg, ref, _ = jspec_model("llama")
    assert cfg == ref_cfg
    assert jax.tree.structure(params) == jax.tree.structure(ref)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_compute_close_to_f32(family, hf_model_dir, hf_torch_model, jspec_model):
    cfg, params, _ = jspec_model(family, jnp.bfloat16)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
    ids = _random_ids(2, 16, seed=1)
    ref = _hf_logits(hf_torch_model(hf_model_dir(family)), ids)
    got, _ = model.forward(params, cfg, jnp.asarray(ids))
    got = np.asarray(got)
    assert got.dtype == np.float32
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


# ----------------------------------------------------------------------------------------- save_hf


@pytest.mark.parametrize("cfg", [
    ModelConfig("llama", VOCAB, 32, 64, 2, 4, 2, 16, rope_llama3=(8.0, 1.0, 4.0, 32), eos_token_ids=(2,)),
    ModelConfig("qwen3", VOCAB, 32, 64, 2, 4, 4, 16, tie_embeddings=True, qk_norm=True),
    ModelConfig("qwen2", VOCAB, 32, 64, 1, 4, 2, 8, qkv_bias=True),
], ids=["llama3", "qwen3", "qwen2"])
def test_save_hf_round_trip(cfg, tmp_path):
    """jspec params -> save_hf -> transformers and jspec both load it and agree."""
    from transformers import AutoModelForCausalLM

    params = model.init_params(cfg, jax.random.key(3), std=0.2)
    checkpoint.save_hf(tmp_path, params, cfg)
    got_cfg, got, _ = checkpoint.load_model(tmp_path, jnp.float32, tokenizer=False)
    assert got_cfg == cfg
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)  # saved as bf16
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(bf16)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = _random_ids(2, 12, seed=4)
    ours, _ = model.forward(got, cfg, jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(ours), _hf_logits(hf, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_hf_writes_back_the_loaded_tensors(family, hf_model_dir, jspec_model, tmp_path):
    """HF -> load (fused wqkv, w_gu) -> save_hf gives back every HF tensor, exactly as bf16."""
    from safetensors.flax import load_file as load_jax

    cfg, params, _ = jspec_model(family, jnp.bfloat16)
    checkpoint.save_hf(tmp_path, params, cfg)
    want = load_file(hf_model_dir(family) / "model.safetensors")
    got = load_jax(tmp_path / "model.safetensors")
    assert got.keys() == want.keys()
    for name, x in want.items():
        assert got[name].dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got[name], np.float32),
                                      np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32), err_msg=name)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])  # GQA, MHA, biases (no q/k norm)
def test_fused_projections_equal_hf_ones(family, hf_model_dir, jspec_model):
    """q/k/v from wqkv and the MLP from w_gu are HF's separate q/k/v_proj and gate/up_proj."""
    cfg, params, _ = jspec_model(family)
    prefix = "model.layers.1."
    w = {k[len(prefix):]: x for k, x in load_file(hf_model_dir(family) / "model.safetensors").items()
         if k.startswith(prefix)}
    h = np.random.default_rng(5).standard_normal((2, 3, cfg.hidden_size)).astype(np.float32)
    proj = lambda name: h @ w[f"{name}.weight"].T + w.get(f"{name}.bias", 0)
    heads = lambda x: x.reshape(2, 3, -1, cfg.head_dim)
    # at position 0 RoPE is the identity, so qkv returns the projections themselves
    q, k, v = model.qkv(params.layer(1), cfg, jnp.asarray(h), jnp.zeros((2, 3), jnp.int32))
    for got, name in ((q, "q_proj"), (k, "k_proj"), (v, "v_proj")):
        np.testing.assert_allclose(np.asarray(got), heads(proj(f"self_attn.{name}")), atol=1e-5, rtol=0)
    silu = lambda x: x / (1 + np.exp(-x))
    want = (silu(proj("mlp.gate_proj")) * proj("mlp.up_proj")) @ w["mlp.down_proj.weight"].T
    np.testing.assert_allclose(np.asarray(model.mlp(params.layer(1), jnp.asarray(h))), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n", [1, 40])  # R_K as the small product, and as the prefill's GEMM (model.SMALL_ROTATE)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_qkv_slots_pass_v_through_rope_and_r_k_unchanged(dtype, n):
    """qkv_slots runs all of a KV head's slots through RoPE and R_K together, v's as an identity: its v slot is the
    projection's bit for bit, and its q and k slots are RoPE, then R_K, applied to them alone."""
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=64, num_layers=1,
                      num_heads=8, num_kv_heads=2, head_dim=16)
    g = cfg.q_per_kv
    rot = jnp.linalg.qr(jax.random.normal(jax.random.key(2), (2, 16, 16)))[0]  # an orthogonal R per KV head
    lp = model.init_params(cfg, jax.random.key(1), dtype, std=0.3).layer(0).replace(rot_k=rot)
    h = jax.random.normal(jax.random.key(3), (2, n, cfg.hidden_size), dtype)
    pos = jnp.arange(n)[None] + jnp.asarray([[100], [7]])
    got = jax.jit(lambda h, pos: model.qkv_slots(lp, cfg, h, pos))(h, pos)
    y = jnp.einsum("bne,ehjd->bnhjd", h, lp.wqkv)
    qk = model.rotate(model.apply_rope(y[..., : g + 1, :], *model.rope_tables(cfg, pos)), rot)
    np.testing.assert_array_equal(np.asarray(got[..., g + 1, :], np.float32), np.asarray(y[..., g + 1, :], np.float32))
    np.testing.assert_allclose(np.asarray(got[..., : g + 1, :], np.float32), np.asarray(qk, np.float32),
                               rtol=0, atol=1e-6 if dtype == jnp.float32 else 0.02)


# ------------------------------------------------------------------------------------ load errors


@pytest.fixture
def llama_copy(hf_model_dir, tmp_path):
    """A writable copy of the tiny llama checkpoint."""
    path = tmp_path / "m"
    shutil.copytree(hf_model_dir("llama"), path)
    return path


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_weights(path, fn):
    weights = load_file(path / "model.safetensors")
    fn(weights)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as e:
        checkpoint.load_model(tmp_path / "nowhere")
    assert "nowhere" in str(e.value)


def test_missing_config_json(llama_copy):
    (llama_copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        checkpoint.load_model(llama_copy)


def test_missing_weights(llama_copy):
    (llama_copy / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        checkpoint.load_model(llama_copy)


def test_unsupported_model_type(llama_copy):
    _edit_config(llama_copy, model_type="gpt2")
    with pytest.raises(ConfigError, match="unsupported model_type 'gpt2'"):
        checkpoint.load_model(llama_copy)


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])  # transformers 5 and 4.x spellings
def test_unsupported_rope_type(llama_copy, key):
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1e4}
    _edit_config(llama_copy, **{"rope_parameters": None, key: yarn})
    with pytest.raises(ConfigError, match="yarn"):
        checkpoint.load_model(llama_copy)


def test_missing_tensor(llama_copy):
    name = "model.layers.1.mlp.up_proj.weight"
    _edit_weights(llama_copy, lambda w: w.pop(name))
    with pytest.raises(CheckpointError, match=f"missing tensor '{name}'"):
        checkpoint.load_model(llama_copy)


def test_missing_lm_head_when_untied(llama_copy):
    _edit_weights(llama_copy, lambda w: w.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        checkpoint.load_model(llama_copy)


def test_misshaped_tensor(llama_copy):
    name = "model.layers.0.self_attn.k_proj.weight"  # HF [Hkv*D, E] = [32, 64]

    def shrink(w):
        w[name] = w[name][:16]

    _edit_weights(llama_copy, shrink)
    with pytest.raises(CheckpointError, match=rf"'{name}' has shape \(16, 64\), expected \(32, 64\)"):
        checkpoint.load_model(llama_copy)


def test_missing_tensor_in_sharded_index(hf_model_dir, tmp_path):
    path = tmp_path / "m"
    shutil.copytree(hf_model_dir("llama", sharded=True), path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.norm.weight"]
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        checkpoint.load_model(path)
