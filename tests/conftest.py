"""Shared fixtures: tiny random Hugging Face checkpoints of each supported family, built offline.

`hf_model_dir(family)` saves a tiny random transformers model plus a byte-level BPE tokenizer to a
session temp directory and returns it; directories are cached per (family, sharded), so every test
file that asks for the same model reuses one save.
"""

from __future__ import annotations

import functools
import os
from importlib import metadata


def _cpu_only() -> bool:
    """No GPU plugin of jaxlib installed: every program of this run compiles for the CPU."""
    names = ((d.metadata["Name"] or "").lower().replace("_", "-") for d in metadata.distributions())
    return not any(n.startswith(("jax-cuda", "jax-rocm")) for n in names)


# On the CPU, compile every program without LLVM optimization (XLA's HLO passes still run; the semantics and
# the float32 arithmetic are the same, no fast math): the tests' programs are tiny and compiling dominates
# them, so this saves a quarter to two thirds of a test's time (test_sharding's 8-device programs most).
# Set before jax starts its backend; it reaches the tests' subprocesses through the environment, so that
# they share the persistent compilation cache with this process (XLA_FLAGS is part of its key).
if _cpu_only() and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

# Draft "auto" keeps what its calls learn in memory only (runtime.learned): a learned file under the shared cache
# would let one test's calls move another's first choice (an order-dependent suite). The tests of the file set
# learn="disk" with a cache directory of their own; subprocesses inherit this through the environment.
os.environ["JSPEC_LEARN"] = "memory"

import jax  # noqa: E402 -- after XLA_FLAGS
import pytest  # noqa: E402

VOCAB = 300  # 256 byte symbols + 4 specials + 40 merges
EOS_ID = 2  # a special token: the random models rarely pick it, but when they do both sides stop
_SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
_TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world, this is a tiny tokenizer",
          "speculative decoding over a two bit cache"] * 3
_BASE = dict(vocab_size=VOCAB, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256,
             bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=3, rms_norm_eps=1e-6)

# family -> (transformers config class name, config kwargs); between them they cover GQA and MHA,
# tied and untied embeddings, head_dim != hidden/heads, q/k/v biases, q/k norms and llama3 rope.
FAMILIES = {
    "llama": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_key_value_heads=2,
                                  tie_word_embeddings=False)),
    "llama3": ("LlamaConfig", dict(hidden_size=48, intermediate_size=96, num_key_value_heads=2, head_dim=16,
                                   tie_word_embeddings=True, rope_scaling={
                                       "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", dict(hidden_size=64, intermediate_size=128, num_key_value_heads=4,
                                      tie_word_embeddings=False, sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(hidden_size=64, intermediate_size=128, num_key_value_heads=2,
                                  tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(hidden_size=32, intermediate_size=64, num_key_value_heads=2, head_dim=16,
                                  tie_word_embeddings=False)),
}


def layers_of(tree) -> list:
    """Params' or a KVCache's layers one by one (slices of the stacks: Params.layer, KVCache.layer)."""
    return [tree.layer(i) for i in range(tree.num_layers)]


@functools.cache
def tiny_tokenizer():
    """A byte-level BPE (VOCAB entries) trained offline on a few strings, wrapped for transformers.

    Byte-level, so every string encodes; and the same vocab/merges give the same ids when
    AutoTokenizer swaps in a family's own class (transformers 5 maps qwen2 to Qwen2Tokenizer).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_TEXTS, trainer)
    assert tok.get_vocab_size() == VOCAB
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")


def _randomize(model, seed: int) -> None:
    """Weights large enough that greedy argmaxes are far from ties; norm weights around 1."""
    torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.15 * noise if p.ndim == 1 else noise / p.shape[-1] ** 0.5)


def build_hf_model(family: str, seed: int = 0):
    """A tiny random transformers CausalLM (float32, eval mode) of one family."""
    torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")
    import transformers

    cls_name, kwargs = FAMILIES[family]
    cfg = getattr(transformers, cls_name)(**_BASE, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _randomize(model, seed)
    return model


_CACHE_FLAGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
                "jax_compilation_cache_max_size")
# Recorded at import, not in the module fixture below: a session-scoped fixture (test_cli's `reference`) is set
# up before the module-scoped one, so a value read there could already be the cache turned on, never undone.
_CACHE_DEFAULTS = {name: getattr(jax.config, name) for name in _CACHE_FLAGS}


@pytest.fixture(scope="module", autouse=True)
def _persistent_cache_ends_with_its_module():
    """A module that turns on JAX's persistent compilation cache (test_cli, test_jobs: their programs are
    shared with subprocesses) turns it off when it ends. Left on, every later compile of the worker, each
    eager op of the tests that follow, is written to it, and each write scans the whole directory for
    eviction: minutes over a suite."""
    from jax.experimental.compilation_cache import compilation_cache

    yield
    if any(getattr(jax.config, name) != value for name, value in _CACHE_DEFAULTS.items()):
        for name, value in _CACHE_DEFAULTS.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One persistent compilation cache for the session, shared by xdist workers and subprocesses."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    return root / "jspec-xla"


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory):
    """hf_model_dir(family, sharded=False) -> Path of a saved tiny model + tokenizer (cached)."""
    made = {}

    def make(family: str, sharded: bool = False):
        key = (family, sharded)
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}{'_sharded' if sharded else ''}")
            model = build_hf_model(family)
            kw = dict(max_shard_size="40KB") if sharded else {}
            model.save_pretrained(path, safe_serialization=True, **kw)
            tiny_tokenizer().save_pretrained(path)
            made[key] = path
        return made[key]

    return make


@pytest.fixture(scope="session")
def hf_torch_model():
    """hf_torch_model(path) -> the transformers float32 model saved there (cached)."""
    loaded = {}

    def load(path):
        torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")
        from transformers import AutoModelForCausalLM

        if path not in loaded:
            loaded[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return loaded[path]

    return load


@pytest.fixture
def f32_matmul():
    """Full float32 matmuls (XLA CPU may otherwise pick faster, less exact dots)."""
    with jax.default_matmul_precision("highest"):
        yield
