"""The tokenizer of a local model directory, read with the `tokenizers` library: no transformers, no torch.

Importing transformers imports PyTorch wherever it is installed (seconds before the first token), so
jspec builds from the same files what transformers 5's AutoTokenizer builds:
- the class AutoTokenizer picks (tokenizer_class below): the class named by tokenizer_config.json or
  config.json, overridden for some model types (qwen2 always gets Qwen2Tokenizer), and a generic
  TokenizersBackend for byte-level files declared as LlamaTokenizer (Llama 3);
- TokenizersBackend (alias PreTrainedTokenizerFast): tokenizer.json as it is;
- Qwen2Tokenizer and LlamaTokenizer: only the vocabulary, merges, added tokens and post-processor come
  from tokenizer.json; normalizer, pre-tokenizer, decoder and BPE options are those the class hard-codes
  (the Qwen2 split regex with NFC; Metaspace with byte fallback);
- the named special tokens (bos, eos, unk, pad, ...; the class's defaults where the config is silent)
  and the extra ones, added as special tokens where tokenizer.json lacks them, in transformers' order.
Any other case (no tokenizer.json, a non-BPE model in a rebuilt class, another tokenizer class)
is handed to AutoTokenizer itself, which has the same methods; it then imports transformers.
tests/test_tokenizer.py compares ids and text with AutoTokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from jspec.config import ConfigError

# transformers' SPECIAL_TOKENS_ATTRIBUTES, in its order
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
GENERIC = ("TokenizersBackend", "PreTrainedTokenizer", "PythonBackend")  # after removesuffix("Fast")
# transformers 5 TOKENIZER_MAPPING_NAMES for jspec's model types (llama has none; mistral's is
# MistralCommonBackend only where mistral-common is installed: then AutoTokenizer decides)
REGISTERED = {"qwen2": "Qwen2Tokenizer", "qwen3": "Qwen2Tokenizer", "mistral": "TokenizersBackend"}
HUB_CLASS_IGNORED = ("qwen2",)  # in transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
# The Qwen2Tokenizer split (transformers models/qwen2/tokenization_qwen2.py, Apache-2.0).
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
# Named tokens a class's __init__ defaults to when tokenizer_config.json does not name them.
CLASS_DEFAULTS = {
    "TokenizersBackend": {},
    "Qwen2Tokenizer": {"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    "LlamaTokenizer": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
}


class Tokenizer:
    """What jspec uses of a Hugging Face tokenizer: encode (with the special tokens the post-processor
    adds, like `tokenizer(text)`), decode, get_vocab and the named special tokens."""

    chat_template: str | None = None  # set by loaders that find one beside the vocabulary (jspec.io.gguf)

    def __init__(self, backend: Backend, named: dict[str, str | None], cleanup: bool = False):
        self.backend = backend
        self.named = named  # "bos_token" -> "<s>" (None where the tokenizer has none)
        self.cleanup = cleanup  # transformers' clean_up_tokenization on decode (never for BPE)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str) -> dict:
        return {"input_ids": self.encode(text)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self.cleanup else text

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def token_id(self, name: str) -> int | None:
        """The id of a named special token ("bos_token"), None when there is none."""
        token = self.named.get(name)
        if token is None:
            return None
        found = self.backend.token_to_id(token)
        return found if found is not None or name == "unk_token" else self.token_id("unk_token")

    bos_token_id = property(lambda self: self.token_id("bos_token"))
    eos_token_id = property(lambda self: self.token_id("eos_token"))
    pad_token_id = property(lambda self: self.token_id("pad_token"))
    unk_token_id = property(lambda self: self.token_id("unk_token"))


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a local directory, as AutoTokenizer.from_pretrained builds it (module docstring)."""
    model_dir = Path(model_dir)
    path = model_dir / "tokenizer.json"
    config = _read_json(model_dir / "tokenizer_config.json")
    _check_config(config, model_dir / "tokenizer_config.json")
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        model_cfg = _read_json(model_dir / "config.json")
        declared = config.get("tokenizer_class") or model_cfg.get("tokenizer_class")
        if declared is not None and not isinstance(declared, str):
            raise ConfigError(f"{model_dir}: tokenizer_class must be a string, got {declared!r}")
        cls = tokenizer_class(model_cfg.get("model_type"), declared, '"ByteLevel"' in text)
        try:
            spec = json.loads(text)
            if cls in CLASS_DEFAULTS and (cls == "TokenizersBackend" or spec["model"].get("type") == "BPE"):
                return _build(cls, path, spec, config)
        except ConfigError:
            raise
        except Exception as e:  # tokenizers raises bare Exceptions for a malformed file
            raise ValueError(f"unreadable tokenizer.json ({e})") from None
    return _auto_tokenizer(model_dir)


def tokenizer_class(model_type: str | None, declared: str | None, byte_level: bool) -> str:
    """The class transformers 5's AutoTokenizer picks for a model type and the class a directory
    declares (TokenizersBackend for every generic name); mirrors AutoTokenizer.from_pretrained."""
    declared = declared.removesuffix("Fast") if declared else None
    generic = lambda name: "TokenizersBackend" if name in GENERIC else name
    registered = REGISTERED.get(model_type)
    if declared == "LlamaTokenizer" and byte_level and model_type not in HUB_CLASS_IGNORED:
        return "TokenizersBackend"  # Llama 3 style: LlamaTokenizer would force Metaspace on byte-level BPE
    if declared and registered and registered != declared:
        if registered not in GENERIC and model_type in HUB_CLASS_IGNORED:
            return registered
        return "TokenizersBackend" if registered in GENERIC else generic(declared)
    if declared:
        return generic(declared)
    return registered or "TokenizersBackend"


def _build(cls: str, path: Path, spec: dict, config: dict) -> Tokenizer:
    """transformers' TokenizersBackend.__init__ (after the class's own __init__) for one class."""
    backend = Backend.from_file(str(path)) if cls == "TokenizersBackend" else _rebuild(cls, spec, config)
    backend.no_padding()  # tokenizer(text) neither pads nor truncates
    backend.no_truncation()
    backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
    named, extra = _special_tokens(cls, config, path.parent)
    existing = {repr(t) for t in backend.get_added_tokens_decoder().values()}
    present = {t.content for t in backend.get_added_tokens_decoder().values()}
    added = [t for _, t in sorted(_added_tokens(spec, config).items()) if repr(t) not in existing]
    present |= {t.content for t in added}
    for token in [*named.values(), *extra]:
        if token is not None and str(token) not in present:
            added.append(token)
            present.add(str(token))
    added = [_as_special(t, named) for t in added]
    if added:
        backend.add_tokens(added)
    names = {k: (None if v is None else str(v)) for k, v in named.items()}
    if cls == "Qwen2Tokenizer":  # its __init__ adds every special token once more, as special
        backend.add_tokens([AddedToken(t, special=True) for t in _all_special(names, extra)])
    return Tokenizer(backend, names, _wants_cleanup(config, spec))


def _rebuild(cls: str, spec: dict, config: dict) -> Backend:
    """Qwen2Tokenizer / LlamaTokenizer: vocabulary, merges and post-processor from tokenizer.json, the
    rest of the pipeline as the class builds it (transformers 5 convert_to_native_format + __init__)."""
    model = spec["model"]
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    if cls == "Qwen2Tokenizer":
        backend = Backend(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                              end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space") or False), use_regex=False),
        ])
        backend.decoder = decoders.ByteLevel()
    else:  # LlamaTokenizer
        prefix = config.get("add_prefix_space")
        prefix = True if prefix is None else bool(prefix)
        scheme = ("always" if config.get("legacy", False) else "first") if prefix else "never"
        backend = Backend(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        backend.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if prefix else []))
    if spec.get("post_processor") is not None:  # read alone: the vocabulary is not parsed twice
        bare = dict(spec, model=dict(model, vocab={}, merges=[]), added_tokens=[])
        backend.post_processor = Backend.from_str(json.dumps(bare)).post_processor
    return backend


def _added_tokens(spec: dict, config: dict) -> dict[int, AddedToken]:
    """id -> AddedToken: tokenizer_config.json's added_tokens_decoder, else tokenizer.json's added_tokens."""
    if "added_tokens_decoder" in config:
        return {int(i): _added(t) for i, t in config["added_tokens_decoder"].items()}
    return {t["id"]: _added(t) for t in spec.get("added_tokens", [])}


def _added(t: dict) -> AddedToken:
    keys = ("single_word", "lstrip", "rstrip", "normalized", "special")
    return AddedToken(t["content"], **{k: t[k] for k in keys if k in t})


def _special_tokens(cls: str, config: dict, model_dir: Path):
    """(named: attribute -> str or AddedToken or None, extra: list) as transformers resolves them."""
    config = dict(config)
    if "added_tokens_decoder" not in config:  # legacy: special_tokens_map.json overrides the config
        for key, value in _read_json(model_dir / "special_tokens_map.json").items():
            if isinstance(value, dict) and key not in ("extra_special_tokens", "additional_special_tokens"):
                value = AddedToken(**{k: v for k, v in value.items() if k not in ("special", "__type")}, special=True)
            config[key] = value
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    named = dict(CLASS_DEFAULTS[cls])
    named.update({k: config[k] for k in NAMED if k in config})
    custom = {k: v for k, v in config.items() if k not in NAMED and k.endswith("_token") and isinstance(v, str)}
    if isinstance(extra, dict):  # named extras ("image_token": ...)
        custom.update(extra)
        extra = []
    named.update(custom)
    to_token = lambda v: _added(v) if isinstance(v, dict) else v
    return {k: to_token(v) for k, v in named.items()}, [to_token(v) for v in extra]


def _as_special(token, named: dict) -> AddedToken:
    if isinstance(token, AddedToken):
        names = {str(v) for v in named.values() if v is not None}
        if not token.special and token.content in names:
            token.special = True
        return token
    return AddedToken(token, special=True)


def _all_special(named: dict[str, str | None], extra: list) -> list[str]:
    seen = dict.fromkeys([v for v in named.values() if v is not None] + [str(t) for t in extra])
    return list(seen)


def _wants_cleanup(config: dict, spec: dict) -> bool:
    """transformers skips clean_up_tokenization_spaces for BPE models (it would eat real spaces)."""
    if not config.get("clean_up_tokenization_spaces", False):
        return False
    forced = config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    return spec["model"].get("type") != "BPE" or bool(forced)


def _clean_up(text: str) -> str:
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def _read_json(path: Path) -> dict:
    """A JSON object file's content ({} where there is none); ConfigError naming the file otherwise."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not UTF-8 or not JSON
        raise ConfigError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: must hold a JSON object, got a {type(value).__name__}")
    return value


def _check_config(config: dict, path: Path) -> None:
    """The shapes of tokenizer_config.json that transformers refuses as well: ConfigError naming the field."""
    for key in ("extra_special_tokens", "additional_special_tokens"):
        value = config.get(key)
        if value is not None and not isinstance(value, (list, dict)):
            raise ConfigError(f"{path}: {key} must be a list or an object, got a {type(value).__name__}")
        items = value.values() if isinstance(value, dict) else value or ()
        if not all(isinstance(t, str) or isinstance(t, dict) and isinstance(t.get("content"), str) for t in items):
            raise ConfigError(f"{path}: each of {key} must be a string or an object with a string content")
    decoder = config.get("added_tokens_decoder", {})
    if not isinstance(decoder, dict) or not all(
            isinstance(i, str) and i.isdigit() and isinstance(t, dict) and isinstance(t.get("content"), str)
            for i, t in decoder.items()):
        raise ConfigError(f"{path}: added_tokens_decoder must map token ids to objects with a string content")
    for key in NAMED:
        value = config.get(key)
        if value is not None and not isinstance(value, str) and not (
                isinstance(value, dict) and isinstance(value.get("content"), str)):
            raise ConfigError(f"{path}: {key} must be a string or an object with a string content")


def _auto_tokenizer(model_dir: Path):
    try:
        from transformers import AutoTokenizer  # imports torch where it is installed: only this case
    except ImportError:
        raise ConfigError(f"{model_dir}: its tokenizer has no tokenizer.json that jspec rebuilds, and reading it "
                          "needs transformers: pip install -e '.[hf]' in the clone") from None
    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
