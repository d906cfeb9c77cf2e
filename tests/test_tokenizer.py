"""jspec.io.tokenizer == transformers' AutoTokenizer (ids, text, vocabulary, special tokens) without torch.

Directories: every family fixture, the shipped pair, and tokenizer-only directories that cover the
class AutoTokenizer picks (model type x declared tokenizer_class x byte-level or Metaspace file) and
the ways special tokens are declared (added_tokens_decoder, special_tokens_map.json, extras, tokens
missing from tokenizer.json, split_special_tokens).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jspec.config import ConfigError
from jspec.io import checkpoint, tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "", "hello world", " leading space", "trailing space ", "  \t\n\n   runs   of\t\twhitespace\r\n\r\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "x = {'a': [1, 2.5e-3], \"b\": None}  # comment", "I'm sure they'll say we've done it, didn't they?",
    "numbers 1234567890 3.14159", "caf\u00e9 cafe\u0301 na\u00efve \u00c5ngstr\u00f6m",
    "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e", "emoji \U0001f916\U0001f680 and \u200b zero width",
    "<s>special</s> text <pad><unk>", "<|bos|>x<|eos|> <|im_start|>",
    "<|im_end|>\n<think>hm</think>", "\u2581metaspace\u2581char", "ALLCAPS MixedCase snake_case kebab-case",
]


def _compare(path: Path):
    """Asserts that jspec's tokenizer of `path` matches AutoTokenizer's; returns jspec's."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(path))
    ours = tokenizer.load_tokenizer(path)
    assert isinstance(ours, tokenizer.Tokenizer), "fell back to transformers"
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert ours.encode(text) == ids, text
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
    vocab = hf.get_vocab()
    assert ours.get_vocab() == vocab
    every = sorted(vocab.values())
    for i in range(0, len(every), 97):  # every id, in runs that mix specials with ordinary tokens
        run = every[i : i + 97]
        for skip in (False, True):
            assert ours.decode(run, skip_special_tokens=skip) == hf.decode(run, skip_special_tokens=skip)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(ours, name) == getattr(hf, name), name
    return ours


@pytest.mark.parametrize("family", ["llama", "llama3", "mistral", "qwen2", "qwen3"])
def test_family_fixtures_match_auto_tokenizer(hf_model_dir, family):
    _compare(hf_model_dir(family))


@pytest.mark.parametrize("name", ["code-target", "code-draft"])
def test_shipped_tokenizer_matches_auto_tokenizer(name):
    tok = _compare(ROOT / "checkpoints" / name)
    assert tok.encode("def f")[0] == tok.bos_token_id  # the post-processor's BOS


# ------------------------------------------------------------------------------------------------
# tokenizer-only directories: the class AutoTokenizer picks, and special tokens


@functools.cache
def _metaspace_json() -> str:
    """A Llama-2-style tokenizer.json: Metaspace BPE with byte fallback and a BOS post-processor."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
                                  show_progress=False)
    tok.train_from_iterator(TEXTS * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if not t["content"].startswith("<0x")]
    return json.dumps(spec)


def _byte_level_json() -> str:
    from conftest import tiny_tokenizer

    return tiny_tokenizer().backend_tokenizer.to_str()


def _with_added(spec_text: str) -> str:
    """Chat-style added tokens missing from the vocabulary: two special, one not."""
    spec = json.loads(spec_text)
    n = len(spec["model"]["vocab"])
    for i, (content, special) in enumerate([("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False)]):
        spec["added_tokens"].append(dict(id=n + i, content=content, single_word=False, lstrip=False, rstrip=False,
                                         normalized=not special, special=special))
    return json.dumps(spec)


def _write(path: Path, tokenizer_json: str, model_type: str | None, tok_config: dict, extra_files=None) -> Path:
    path.mkdir(parents=True)
    (path / "tokenizer.json").write_text(tokenizer_json)
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    if model_type is not None:
        (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    for name, content in (extra_files or {}).items():
        (path / name).write_text(json.dumps(content))
    return path


DECLARED = [None, "TokenizersBackend", "PreTrainedTokenizerFast", "LlamaTokenizer", "LlamaTokenizerFast",
            "Qwen2Tokenizer", "Qwen2TokenizerFast", "GPT2Tokenizer"]


@pytest.mark.parametrize("style", ["byte_level", "metaspace"])
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", None])
def test_class_choice_and_parity(tmp_path, style, model_type):
    from transformers import AutoTokenizer

    text = _byte_level_json() if style == "byte_level" else _metaspace_json()
    specials = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    checked = 0
    for n, declared in enumerate(DECLARED):
        config = dict(specials, **({"tokenizer_class": declared} if declared else {}))
        path = _write(tmp_path / str(n), text, model_type, config)
        hf_class = type(AutoTokenizer.from_pretrained(str(path))).__name__
        ours = tokenizer.tokenizer_class(model_type, declared, style == "byte_level")
        assert ours == {"PreTrainedTokenizerFast": "TokenizersBackend"}.get(hf_class, hf_class), declared
        if ours in tokenizer.CLASS_DEFAULTS:
            _compare(path)
            checked += 1
        else:
            assert not isinstance(tokenizer.load_tokenizer(path), tokenizer.Tokenizer)  # AutoTokenizer's
    assert checked >= 5


QWEN_CONFIG = dict(tokenizer_class="Qwen2Tokenizer", bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                   unk_token=None, additional_special_tokens=["<|im_start|>", "<|im_end|>"])


@pytest.mark.parametrize("case", ["qwen2_chat", "qwen3_chat", "added_tokens_decoder", "special_tokens_map",
                                  "split_special_tokens", "llama2_legacy", "llama2_no_prefix"])
def test_special_token_declarations(tmp_path, case):
    chat = _with_added(_byte_level_json())
    decoder = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in json.loads(chat)["added_tokens"]}
    dirs = {
        "qwen2_chat": (chat, "qwen2", QWEN_CONFIG, None),
        "qwen3_chat": (chat, "qwen3", QWEN_CONFIG, None),
        "added_tokens_decoder": (chat, "qwen3", dict(QWEN_CONFIG, added_tokens_decoder=decoder), None),
        "special_tokens_map": (chat, "llama", {"tokenizer_class": "PreTrainedTokenizerFast"},
                               {"special_tokens_map.json": {"bos_token": "<|im_start|>", "eos_token": {
                                   "content": "<|im_end|>", "lstrip": False, "rstrip": False, "normalized": False,
                                   "single_word": False}, "pad_token": "<pad>"}}),
        "split_special_tokens": (chat, "qwen2", dict(QWEN_CONFIG, split_special_tokens=True), None),
        "llama2_legacy": (_metaspace_json(), "llama", dict(tokenizer_class="LlamaTokenizer", legacy=True), None),
        "llama2_no_prefix": (_metaspace_json(), "llama", dict(tokenizer_class="LlamaTokenizer",
                                                              add_prefix_space=False), None),
    }
    text, model_type, config, files = dirs[case]
    _compare(_write(tmp_path / case, text, model_type, config, files))


def test_missing_tokenizer_falls_back_to_transformers(tmp_path, hf_model_dir):
    """Without tokenizer.json (vocab.json + merges.txt only), transformers builds it."""
    from conftest import tiny_tokenizer

    path = tmp_path / "slow"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tiny_tokenizer().save_pretrained(path)
    spec = json.loads((path / "tokenizer.json").read_text())
    (path / "vocab.json").write_text(json.dumps(spec["model"]["vocab"]))
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    (path / "merges.txt").write_text("\n".join(merges))
    (path / "tokenizer.json").unlink()
    tok = tokenizer.load_tokenizer(path)
    assert not isinstance(tok, tokenizer.Tokenizer) and tok.encode("hello") == tok("hello")["input_ids"]


def test_loading_never_imports_transformers_or_torch():
    code = ("import sys; from jspec.io import tokenizer; t = tokenizer.load_tokenizer('checkpoints/code-target'); "
            "t.decode(t.encode('x = 1')); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("config,problem", [
    ({"extra_special_tokens": "return"}, "extra_special_tokens must be a list or an object, got a str"),
    ({"additional_special_tokens": [5]}, "each of additional_special_tokens must be a string"),
    ({"eos_token": 7}, "eos_token must be a string"),
    ({"added_tokens_decoder": {"x": {"content": "a"}}}, "added_tokens_decoder must map token ids"),
    ({"tokenizer_class": 3}, "tokenizer_class must be a string, got 3"),
    ([1, 2], "must hold a JSON object, got a list"),
])
def test_a_malformed_tokenizer_config_is_refused_naming_it(tmp_path, config, problem):
    """Classes 6, 9 and 10: tokenizer_config.json fields of shapes transformers refuses (an extra_special_tokens
    string would make each of its characters special), a config that is not an object and an integer
    tokenizer_class are one error naming tokenizer_config.json, never a traceback nor blamed on tokenizer.json."""
    path = _write(tmp_path / "tok", _byte_level_json(), "llama", {})
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises((ValueError, OSError), match=re.escape(problem)) as e:  # the CLI: one error line
        checkpoint.load_tokenizer(path)
    assert "tokenizer_config.json" in str(e.value) or "tokenizer_class" in str(e.value)
    assert "unreadable tokenizer.json" not in str(e.value)


def test_malformed_gguf_merges_are_one_config_error():
    """Class 9: a GGUF merge that is not two tokens, or joins tokens not in the vocabulary, is a ConfigError."""
    from jspec.io import gguf_tokenizer

    meta = dict(model="gpt2", tokens=["a", "b", "ab"])
    for merges, problem in ((["a b c"], "two tokens and one space"), (["a"], "two tokens"),
                            (["x y"], "do not build a BPE model")):
        with pytest.raises(ConfigError, match=problem):
            gguf_tokenizer.build(meta | {"merges": merges}, "llama")
