"""The training corpus of the shipped pair: the standard library plus permissively licensed packages.

Recipe (rebuild with `python -m jspec.data --out data/code`; `--no-packages` gives the stdlib alone):
- every `*.py` under `sysconfig.get_paths()["stdlib"]`, skipping site-packages and test files (any
  directory `test/` or `tests/`, `idlelib/idle_test/`, and `test_*.py`, `*_test.py`, `conftest.py`),
  read with the encoding its PEP 263 cookie declares (empty and undecodable files are skipped);
- the `*.py` files each installed distribution's RECORD lists, for the distributions whose licence
  metadata (License-Expression, else the License classifiers, else the License field) names only
  permissive licences (MIT, BSD, Apache, PSF, ISC, zlib, ...; anything GPL/MPL/EPL/proprietary is
  out); tests excluded likewise, files over MAX_FILE_BYTES (generated tables) skipped, at most
  MAX_PACKAGE_BYTES per distribution (files in path order) so no one package dominates;
- exact duplicates removed: a file whose text hashes (sha1) like an earlier one is dropped (stdlib
  first, then distributions by name), so no text is in both splits;
- validation = files whose sha1(relative posix path) % 100 < 3 (package files: `site-packages/PATH`),
  the rest is train (stable across machines; about 3% of files);
- one byte-level BPE (vocabulary 8192) trained on (an evenly spaced sample of) the train split; each
  document is encoded as `<|bos|> text <|eos|>` and documents are concatenated in order into one
  uint16 stream per split. val_texts.json keeps the validation texts for tokenizer-free metrics.
The corpus depends on the Python version and the installed packages: meta.json records both.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import multiprocessing
import platform
import re
import sysconfig
import time
import tokenize
from pathlib import Path

import numpy as np

BOS, EOS = "<|bos|>", "<|eos|>"
VOCAB_SIZE = 8192
MAX_LENGTH = 4096  # the shipped models' max_position_embeddings
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
MAX_FILE_BYTES = 512 * 1024
MAX_PACKAGE_BYTES = 8 * 2**20
TOKENIZER_BYTES = 24 * 2**20  # train text the BPE is fit on (a sample: the merges settle long before)
# Licence names, matched as whole words of the lower-cased metadata (SPDX ids, classifiers, free text).
PERMISSIVE = re.compile(r"\b(mit|bsd|0bsd|bsd-[0-9]-clause|apache|apache-2\.0|psf|psf-2\.0|python-2\.0|isc|zlib"
                        r"|unlicense|hpnd|cc0-1\.0|python software foundation|permission is hereby granted"
                        r"|redistribution and use)\b")
COPYLEFT = re.compile(r"\b(a?l?gpl[a-z0-9.+-]*|gnu|mpl[a-z0-9.+-]*|mozilla|epl[a-z0-9.+-]*|eclipse|cddl|eupl"
                      r"|osl|proprietary|commercial|non-commercial|nvidia)\b")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_test_path(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    return bool(EXCLUDED_DIRS & set(parts[:-1])) or name.startswith("test_") or name.endswith("_test.py") \
        or name == "conftest.py"


def corpus_files(root: Path) -> list[str]:
    """Relative posix paths of the stdlib's source files, sorted so the stream order is stable."""
    rels = (p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    return sorted(r for r in rels if not is_test_path(r))


def is_validation(rel: str) -> bool:
    # Hash of the path, not of the content: a file keeps its split across edits and machines.
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 100 < 3


def read_source(path: Path) -> str | None:
    """The file's text in its declared encoding; None for the rare undecodable or unreadable file."""
    try:
        with tokenize.open(path) as f:
            return f.read()
    except (SyntaxError, UnicodeDecodeError, OSError):
        return None


def licence_text(meta) -> str:
    """The licence a distribution declares, most precise field first: SPDX expression, classifiers, License."""
    if meta.get("License-Expression"):
        return meta["License-Expression"]
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    classifiers = [c for c in classifiers if c != "OSI Approved"]
    # A License field often holds the whole licence text: its head names it.
    return "; ".join(classifiers) or (meta.get("License") or "")[:300]


def is_permissive(licence: str) -> bool:
    """True when the licence names a permissive licence and nothing copyleft or proprietary."""
    text = licence.lower()
    return bool(PERMISSIVE.search(text)) and not COPYLEFT.search(text)


def package_files(dist, max_file_bytes: int = MAX_FILE_BYTES, max_bytes: int = MAX_PACKAGE_BYTES) -> list[Path]:
    """The distribution's non-test *.py files (RECORD order sorted by path), within the size caps."""
    out, total = [], 0
    for rel in sorted(str(f) for f in dist.files or [] if f.suffix == ".py" and ".." not in f.parts):
        path = Path(dist.locate_file(rel))
        if is_test_path(Path(rel).as_posix()) or not path.is_file():
            continue
        size = path.stat().st_size
        if 0 < size <= max_file_bytes and total + size <= max_bytes:
            out.append(path)
            total += size
    return out


def packages(max_bytes: int = MAX_PACKAGE_BYTES) -> tuple[list[dict], list[dict]]:
    """(kept, rejected) installed distributions, by normalized name; kept ones carry their files."""
    kept, rejected, seen = [], [], set()
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name or name in seen:
            continue
        seen.add(name)
        info = {"name": name, "version": dist.version, "licence": licence_text(dist.metadata)}
        if not is_permissive(info["licence"]):
            rejected.append(info)
            continue
        files = package_files(dist, max_bytes=max_bytes)
        if files:
            kept.append({**info, "files": files})
    return kept, rejected


def _read(path: Path) -> tuple[str | None, str]:
    text = read_source(path)
    return text, hashlib.sha1(text.encode()).hexdigest() if text else ""


def read_all(paths: list[Path], workers: int | None = None) -> list[tuple[str | None, str]]:
    """(text, sha1 of text) per path, read by a process pool (most of the corpus build on many cores)."""
    if workers == 1 or len(paths) < 64:
        return [_read(p) for p in paths]
    with multiprocessing.Pool(workers) as pool:
        return pool.map(_read, paths, chunksize=32)


def dedupe_and_split(entries) -> tuple[dict[str, list[str]], int]:
    """entries: (rel, text, sha1) in corpus order -> ({"train": texts, "val": texts}, duplicates dropped).

    The first file with a given text is kept: the split of a text is decided once, by that file's path."""
    docs, seen, dropped = {"train": [], "val": []}, set(), 0
    for rel, text, digest in entries:
        if not text:
            continue
        if digest in seen:
            dropped += 1
            continue
        seen.add(digest)
        docs["val" if is_validation(rel) else "train"].append(text)
    return docs, dropped


def split_documents(root: Path) -> dict[str, list[str]]:
    """{"train": [...], "val": [...]} texts of the standard library alone, in path order. Read in this
    process: callers (benchmarks, head training) have JAX running, and forking a pool then can deadlock."""
    return corpus_documents(root, with_packages=False, workers=1)[0]


def corpus_documents(root: Path, with_packages: bool = True, max_files: int | None = None,
                    max_package_bytes: int = MAX_PACKAGE_BYTES, workers: int | None = None):
    """-> ({"train": [...], "val": [...]}, meta about sources). max_files: a smoke-test subset per source."""
    rels = corpus_files(root)[:max_files]
    sources = [(rel, root / rel) for rel in rels]
    kept, rejected = packages(max_package_bytes) if with_packages else ([], [])
    site = Path(sysconfig.get_paths()["purelib"])
    for pkg in kept:
        files = pkg.pop("files")[:max_files]
        pkg["files"] = len(files)
        for f in files:
            rel = f.relative_to(site).as_posix() if f.is_relative_to(site) else f.as_posix()
            sources.append((f"site-packages/{rel}", f))
    read = read_all([path for _, path in sources], workers)
    docs, dropped = dedupe_and_split((rel, text, digest) for (rel, _), (text, digest) in zip(sources, read))
    meta = {"stdlib_files": len(rels), "packages": kept, "rejected_packages": rejected, "duplicates_dropped": dropped}
    return docs, meta


def tokenizer_sample(texts: list[str], max_bytes: int) -> list[str]:
    """Every k-th text, k chosen so the sample holds about max_bytes (all of them when they fit)."""
    total = sum(len(t) for t in texts)
    return texts[::max(1, -(-total // max_bytes))]


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
    eos = np.asarray([tok.token_to_id(EOS)], np.uint16)
    if not texts:
        return np.zeros(0, np.uint16)
    return np.concatenate([part for e in tok.encode_batch(texts) for part in (np.asarray(e.ids, np.uint16), eos)])


def build_corpus(out_dir: Path, vocab_size: int = VOCAB_SIZE, with_packages: bool = True,
                 max_files: int | None = None, max_package_bytes: int = MAX_PACKAGE_BYTES,
                 tokenizer_bytes: int = TOKENIZER_BYTES) -> dict:
    """Writes tokenizer/, train.npy, val.npy, val_texts.json and meta.json under out_dir; returns the meta."""
    root = stdlib_root()
    clock = [time.perf_counter()]
    lap = lambda: clock.append(time.perf_counter()) or round(clock[-1] - clock[-2], 1)
    docs, sources = corpus_documents(root, with_packages, max_files, max_package_bytes)
    seconds = {"read": lap()}
    tok = train_tokenizer(tokenizer_sample(docs["train"], tokenizer_bytes), vocab_size)
    seconds["tokenizer"] = lap()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, out_dir / "tokenizer")
    meta = {"python": platform.python_version(), "stdlib": str(root), "vocab_size": vocab_size,
            "max_package_bytes": max_package_bytes, "max_file_bytes": MAX_FILE_BYTES,
            "tokenizer_bytes": tokenizer_bytes, **sources}
    for split, texts in docs.items():
        stream = encode_stream(tok, texts)
        np.save(out_dir / f"{split}.npy", stream)
        meta[split] = {"files": len(texts), "bytes": sum(len(t.encode()) for t in texts), "tokens": len(stream)}
    meta["seconds"] = {**seconds, "encode": lap()}
    (out_dir / "val_texts.json").write_text(json.dumps(docs["val"]))
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
    ap = argparse.ArgumentParser(description="Build the code corpus (stdlib + permissive packages) and its BPE.")
    ap.add_argument("--out", type=Path, default=Path("data/code"))
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    ap.add_argument("--no-packages", action="store_true", help="the standard library alone")
    ap.add_argument("--max-files", type=int, help="at most this many files per source (smoke tests)")
    ap.add_argument("--max-package-bytes", type=int, default=MAX_PACKAGE_BYTES)
    ap.add_argument("--tokenizer-bytes", type=int, default=TOKENIZER_BYTES)
    args = ap.parse_args(argv)
    meta = build_corpus(args.out, args.vocab_size, not args.no_packages, args.max_files, args.max_package_bytes,
                        args.tokenizer_bytes)
    print(json.dumps({k: v for k, v in meta.items() if k not in ("packages", "rejected_packages")}, indent=2))
    print(f"{len(meta['packages'])} packages kept, {len(meta['rejected_packages'])} rejected by licence")


if __name__ == "__main__":
    main()
