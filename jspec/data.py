"""The training corpus of the shipped pair: the running interpreter's standard library, tokenized.

Recipe (rebuild with `python -m jspec.data --out data/stdlib`):
- every `*.py` under `sysconfig.get_paths()["stdlib"]`, skipping site-packages and test directories
  (`test/`, `tests/`, `idlelib/idle_test/`), read with the encoding its PEP 263 cookie declares
  (empty files are skipped);
- validation = files whose sha1(relative posix path) % 100 < 3, the rest is train (stable across
  machines; about 3% of files);
- one byte-level BPE (vocabulary 8192) trained on the train split; each document is encoded as
  `<|bos|> text <|eos|>` and documents are concatenated in path order into one uint16 stream.
The corpus depends on the Python version: meta.json records it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sysconfig
import tokenize
from pathlib import Path

import numpy as np

BOS, EOS = "<|bos|>", "<|eos|>"
VOCAB_SIZE = 8192
MAX_LENGTH = 4096  # the shipped models' max_position_embeddings
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[str]:
    """Relative posix paths of the corpus' source files, sorted so the stream order is stable."""
    rels = (p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    return sorted(r for r in rels if not EXCLUDED_DIRS & set(r.split("/")[:-1]))


def is_validation(rel: str) -> bool:
    # Hash of the path, not of the content: a file keeps its split across edits and machines.
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 100 < 3


def read_source(path: Path) -> str | None:
    """The file's text in its declared encoding; None for the rare undecodable file."""
    try:
        with tokenize.open(path) as f:
            return f.read()
    except (SyntaxError, UnicodeDecodeError):
        return None


def split_documents(root: Path) -> dict[str, list[str]]:
    """{"train": [...], "val": [...]} document texts, in path order."""
    docs = {"train": [], "val": []}
    for rel in corpus_files(root):
        text = read_source(root / rel)
        if text:
            docs["val" if is_validation(rel) else "train"].append(text)
    return docs


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE (GPT-2 pre-tokenization, so any byte string round-trips) that prepends BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    # Training documents start with BOS, so prompts must too: the post-processor adds it.
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos)])
    return tok


def save_tokenizer(tok, out_dir: Path, max_length: int = MAX_LENGTH) -> None:
    """Writes a Hugging Face tokenizer directory that AutoTokenizer.from_pretrained loads."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, model_max_length=max_length)
    hf.save_pretrained(str(out_dir))
    # transformers 5 records its own class name, which 4.x cannot resolve; this name loads in both.
    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")


def encode_stream(tok, texts: list[str]) -> np.ndarray:
    """`<|bos|> doc <|eos|>` for every document, concatenated: uint16 [N]."""
    eos = tok.token_to_id(EOS)
    ids = [e.ids + [eos] for e in tok.encode_batch(texts)]
    return np.fromiter((i for doc in ids for i in doc), np.uint16)


def build_corpus(out_dir: Path, vocab_size: int = VOCAB_SIZE) -> dict:
    """Writes tokenizer/, train.npy, val.npy and meta.json under out_dir; returns the meta."""
    root = stdlib_root()
    docs = split_documents(root)
    tok = train_tokenizer(docs["train"], vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, out_dir / "tokenizer")
    meta = {"python": platform.python_version(), "stdlib": str(root), "vocab_size": vocab_size}
    for split, texts in docs.items():
        stream = encode_stream(tok, texts)
        np.save(out_dir / f"{split}.npy", stream)
        meta[split] = {"files": len(texts), "bytes": sum(len(t.encode()) for t in texts), "tokens": len(stream)}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def load_split(data_dir: Path, split: str) -> np.ndarray:
    return np.load(Path(data_dir) / f"{split}.npy")


def sample_batch(stream: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator) -> np.ndarray:
    """Random windows of seq_len + 1 tokens (inputs + shifted targets): int32 [batch, seq_len + 1]."""
    starts = rng.integers(0, len(stream) - seq_len - 1, size=batch)
    return np.stack([stream[s:s + seq_len + 1] for s in starts]).astype(np.int32)


def eval_windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """The stream cut into consecutive non-overlapping windows: int32 [n, seq_len + 1]."""
    n = (len(stream) - 1) // seq_len
    return np.stack([stream[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)]).astype(np.int32)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Build the stdlib corpus and its BPE tokenizer.")
    ap.add_argument("--out", type=Path, default=Path("data/stdlib"))
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args(argv)
    print(json.dumps(build_corpus(args.out, args.vocab_size), indent=2))


if __name__ == "__main__":
    main()
