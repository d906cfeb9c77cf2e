"""The tokenizer of a GGUF file's `tokenizer.ggml.*` metadata, built with `tokenizers` as transformers 5
builds it (integrations/gguf/gguf_tokenizer_mapping.py, then the TokenizersBackend it is handed to):

1. the vocabulary and merges in a BPE model: "gpt2" files as GPT2Tokenizer lays them out (byte-level,
   tokens outside the byte alphabet respelled in it), "llama" files as LlamaTokenizer (Metaspace,
   byte fallback); merges missing from the file are derived from the vocabulary and its scores;
2. the class's default special tokens added (GPT2Tokenizer: <|endoftext|>; LlamaTokenizer: <s>, </s>,
   <unk>), then the CONTROL tokens as special tokens and the USER_DEFINED ones as plain added tokens;
3. the split regex of the file's pre-tokenizer name, where transformers knows it;
4. the named special tokens (bos, eos, unk, pad from their ids) added where missing, and a BOS / EOS
   post-processor from add_bos_token / add_eos_token (llama files add BOS unless they say otherwise).
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from jspec.config import ConfigError
from jspec.io.tokenizer import QWEN2_SPLIT, Tokenizer

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
# The split regexes transformers' GGUF converter uses per `tokenizer.ggml.pre` (for jspec's architectures).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "midm-2.0", "dbrx", "smaug-bpe"),
                    LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), QWEN2_SPLIT),
    "tekken": TEKKEN_SPLIT,
}
CLASS_SPECIALS = {"gpt2": ("<|endoftext|>",), "llama": ("<s>", "</s>", "<unk>")}
NAMED_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
             "pad_token": "padding_token_id"}


def build(meta: dict, model_type: str) -> Tokenizer:
    """meta: the `tokenizer.ggml.<key>` values (None where absent) -> a jspec Tokenizer."""
    kind, tokens = meta.get("model"), meta.get("tokens")
    if kind not in CLASS_SPECIALS:
        raise ConfigError(f"tokenizer model {kind!r} is not one jspec builds (gpt2 or llama)")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ConfigError("tokenizer.ggml.tokens must be a non-empty list of strings")
    named = _named(meta, tokens)
    try:
        backend = _gpt2(meta, tokens) if kind == "gpt2" else _llama(meta, tokens)
    except ConfigError:
        raise
    except Exception as e:  # tokenizers raises bare Exceptions (a merge of tokens not in the vocabulary)
        raise ConfigError(f"the tokenizer's vocabulary and merges do not build a BPE model ({e})") from None
    backend.add_tokens([AddedToken(t, special=True) for t in CLASS_SPECIALS[kind]])
    _add_marked(backend, meta, tokens, byte_level=kind == "gpt2")
    if meta.get("pre") in SPLITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLITS[meta["pre"]]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    present = {t.content for t in backend.get_added_tokens_decoder().values()}
    backend.add_tokens([AddedToken(t, special=True) for t in named.values() if t is not None and t not in present])
    if model_type in ("qwen2", "qwen3"):  # Qwen2Tokenizer's __init__ adds its special tokens once more
        backend.add_tokens([AddedToken(t, special=True) for t in dict.fromkeys(named.values()) if t is not None])
    add_bos = meta.get("add_bos_token")
    add_bos = (kind == "llama") if add_bos is None else bool(add_bos)  # llama.cpp's default for llama files
    backend.post_processor = _bos_eos(backend, named, add_bos, bool(meta.get("add_eos_token")))
    backend.no_padding()
    backend.no_truncation()
    return Tokenizer(backend, named)


def _named(meta: dict, tokens: list[str]) -> dict[str, str | None]:
    named = {}
    for name, key in NAMED_IDS.items():
        i = meta.get(key)
        if i is not None and (isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(tokens)):
            raise ConfigError(f"tokenizer.ggml.{key} {i!r} is not a token id of the {len(tokens)}-token vocabulary")
        named[name] = None if i is None else tokens[i]
    return named


def _gpt2(meta: dict, tokens: list[str]) -> Backend:
    """GPT2Tokenizer's pipeline: byte-level BPE, no byte fallback, no unknown token."""
    alphabet = byte_alphabet()
    spelled = set(alphabet.values())
    respell = lambda t: t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode("utf-8"))
    vocab = {respell(t): i for i, t in enumerate(tokens)}
    backend = Backend(BPE(vocab=vocab, merges=_merges(meta, tokens), dropout=None, continuing_subword_prefix="",
                          end_of_word_suffix="", fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def _llama(meta: dict, tokens: list[str]) -> Backend:
    """LlamaTokenizer's pipeline (add_prefix_space, not legacy): Metaspace on the first word, byte fallback."""
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Backend(BPE(vocab=vocab, merges=_merges(meta, tokens), fuse_unk=True, byte_fallback=True, dropout=None))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    return backend


def _merges(meta: dict, tokens: list[str]) -> list[tuple[str, ...]]:
    merges = meta.get("merges")
    if merges is not None:
        if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
            raise ConfigError("tokenizer.ggml.merges must be a list of strings")
        pairs = [tuple(m.split(" ")) for m in merges]
        bad = next((m for m, p in zip(merges, pairs) if len(p) != 2 or not all(p)), None)
        if bad is not None:
            raise ConfigError(f"each of tokenizer.ggml.merges must be two tokens and one space, got {bad!r}")
        return pairs
    scores = meta.get("scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise ConfigError("a tokenizer without merges needs one score per token (tokenizer.ggml.scores)")
    return derived_merges({t: i for i, t in enumerate(tokens)}, dict(zip(tokens, scores)))


def derived_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a sentencepiece vocabulary implies (transformers' generate_merges): every split of a
    token into two tokens, best score first, ties broken by the shorter left then right piece."""
    found = []
    for token, score in scores.items():
        pairs = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        found += sorted(pairs, key=lambda p: (vocab[p[0]], vocab[p[1]]))
    found.sort(key=lambda p: (p[2], len(p[0]), len(p[1])), reverse=True)
    return [(a, b) for a, b, _ in found]


def _add_marked(backend: Backend, meta: dict, tokens: list[str], byte_level: bool) -> None:
    """CONTROL tokens as special tokens (in a byte-level vocabulary only those spelled in its alphabet:
    the others are llama.cpp mislabels), then USER_DEFINED ones already in the vocabulary as plain ones."""
    types = meta.get("token_type") or ()
    spelled = set(byte_alphabet().values()) if byte_level else None
    control = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
               if k == CONTROL and (spelled is None or set(t) <= spelled)]
    if control:
        backend.add_special_tokens(control)
    vocab = backend.get_vocab(with_added_tokens=True)
    user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types)
            if k == USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens(user)


def _bos_eos(backend: Backend, named: dict, add_bos: bool, add_eos: bool):
    """transformers' update_post_processor: BOS before and / or EOS after each sequence."""
    bos, eos = named["bos_token"] if add_bos else None, named["eos_token"] if add_eos else None
    single = f"{bos + ':0 ' if bos else ''}$A:0{' ' + eos + ':0' if eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if bos else ''} $B:1{' ' + eos + ':1' if eos else ''}"
    special = [(t, backend.token_to_id(t)) for t in (bos, eos) if t]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def byte_alphabet() -> dict[int, str]:
    """Byte-level BPE's printable spelling of the 256 bytes: printable Latin-1 bytes stand for
    themselves, the rest map in order to the characters from U+0100 on."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    out, extra = {}, 0
    for b in range(256):
        out[b] = chr(b) if b in keep else chr(256 + extra)
        extra += b not in keep
    return out
