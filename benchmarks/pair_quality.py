"""Quality of a target/draft pair on the corpus' validation split and on code outside the corpus.

    PYTHONPATH=. python benchmarks/pair_quality.py --target checkpoints/code-target \
        --draft checkpoints/code-draft --data data/code --out pair.json [--only bpb repetition tau agree] \
        [--outside PACKAGE_OR_DIR --sample-bytes 131072 --seed 0 --dtype float32]

Splits (one row per split, model and metric in the report's "rows"):
- validation: the corpus' val_texts.json under --data; without it, the split rebuilt on this machine by
  the corpus rule (jspec.train.data: same path hash, same dedupe) from the stdlib here and those of the
  corpus' packages (--corpus-meta) installed here, at their local versions (corpus_here).
- outside (--outside): an installed distribution the corpus never read (refused when --corpus-meta
  lists it), or a directory: its non-test *.py files, less any whose text is a corpus text here
  (outside_texts). With --sample-bytes, each split is a seeded sample of whole files (sample_texts).

- bpb: bits per byte of the target and the draft, tokenizer-independent: each text is encoded by the
  model's own tokenizer as `<|bos|> text <|eos|>`, the documents are concatenated and cut into
  consecutive windows of 2048 predicted tokens (the context restarts at each window), and the NLL of
  every token after the first (EOS included) is summed in nats, / ln 2, / the UTF-8 bytes of the texts.
  Exported bf16 weights, --dtype forward (bf16 by default; float32 upcasts the weights), f32 loss.
- repetition: greedy 128-token continuations (BF16 KV, no draft, one batch) of held-out prompts; the
  share of their non-blank lines (stripped) that equal an earlier line of the same continuation.
- tau: draft tokens per round at lookahead 4, batch 1, greedy, with the pair as jspec.load gives it
  (INT2 OSCAR KV when the target ships rotations): sum over prompts of (new tokens - 1) / sum of
  rounds, from the engine's stats (the first token comes from the prefill, not from a round).
- agree: the pair's validation losses and greedy agreement (jspec.train.train.pair_metrics, 64 windows;
  validation only, on --data's val.npy).
Prompts: the second ~600-character piece (cut at a line end) of each text of the split that has one,
in order; each prompt is `<|bos|>` + the last PROMPT_TOKENS - 1 tokens of its piece, so every prompt
has one length (one compiled program per pair) and ends at a line end for any tokenizer.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jspec
from jspec.config import GenerateConfig, KVConfig
from jspec.io.checkpoint import load_model, load_tokenizer
from jspec.model.decoder import forward
from jspec.train import data, train
from jspec.train.seq_unlikelihood import repeated_line_share

SEQ_LEN = 2048
PROMPT_TOKENS = 128
PIECE_CHARS = 600
STAGES = ("bpb", "repetition", "tau", "agree")


def val_texts(data_dir: Path, max_bytes: int | None = None) -> list[str]:
    """The validation texts in corpus order; with max_bytes, the longest prefix of them within it."""
    texts = json.loads((Path(data_dir) / "val_texts.json").read_text())
    if max_bytes is None:
        return texts
    out, total = [], 0
    for t in texts:
        total += len(t.encode())
        if total > max_bytes:
            break
        out.append(t)
    return out


def token_stream(tok, texts: list[str]) -> np.ndarray:
    """`<|bos|> text <|eos|>` per text (the tokenizer adds BOS), concatenated: int32 [N]."""
    eos = [tok.eos_token_id]
    return np.asarray([i for e in tok.backend.encode_batch(texts) for i in e.ids + eos], np.int32)


def scored_windows(stream: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows [n, seq_len + 1] that predict every token of stream after the first exactly once, and
    the mask [n, seq_len] of real (not padding) predicted positions."""
    n = -(-(len(stream) - 1) // seq_len)
    padded = np.zeros(n * seq_len + 1, np.int32)
    padded[:len(stream)] = stream
    windows = np.stack([padded[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)])
    mask = (np.arange(n * seq_len) < len(stream) - 1).reshape(n, seq_len).astype(np.float32)
    return windows, mask


def bits_per_byte(nll_nats: float, n_bytes: int) -> float:
    return nll_nats / math.log(2) / n_bytes


def total_nll(params, cfg, windows: np.ndarray, mask: np.ndarray, batch: int = 8) -> float:
    """Sum of next-token NLL (nats) over the masked positions of windows [n, L + 1]."""

    @jax.jit
    def nll(params, w, m):
        logits, _ = forward(params, cfg, w[:, :-1])
        return (optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), w[:, 1:]) * m).sum()

    total = 0.0
    for i in range(0, len(windows), batch):
        w, m = windows[i:i + batch], mask[i:i + batch]
        pad = batch - len(w)  # one compiled shape: pad with masked-out copies
        w, m = np.concatenate([w, np.repeat(w[:1], pad, 0)]), np.concatenate([m, np.zeros((pad, m.shape[1]), m.dtype)])
        total += float(nll(params, w, m))
    return total


def measure_bpb(model: Path, texts: list[str], dtype=jnp.bfloat16, batch: int = 8) -> dict:
    cfg, params, tok = load_model(model, dtype)
    stream = token_stream(tok, texts)
    windows, mask = scored_windows(stream, SEQ_LEN)
    n_bytes = sum(len(t.encode()) for t in texts)
    nll = total_nll(params, cfg, windows, mask, min(batch, len(windows)))
    return {"bpb": bits_per_byte(nll, n_bytes), "bytes": n_bytes, "tokens": int(len(stream)),
            "bytes_per_token": n_bytes / len(stream), "nll_per_token": nll / float(mask.sum()), "files": len(texts)}


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def corpus_here(meta: dict) -> tuple[list[str], set[str], dict]:
    """The corpus rule applied to this machine, for a corpus built elsewhere (meta: its meta.json):
    (validation texts in corpus order, sha1 of every corpus text of either split, what was read).

    Only the distributions meta lists are read, at the versions installed here; the stdlib is this
    Python's. Exact duplicates are dropped as the corpus drops them (the first file decides the split)."""
    names = {p["name"]: p["version"] for p in meta["packages"]}
    sources, kept, _ = data.corpus_sources(data.stdlib_root(), names=set(names))
    val, hashes = [], set()
    for rel, path in sources:
        text = data.read_source(path)
        if not text or sha1(text) in hashes:
            continue
        hashes.add(sha1(text))
        if data.is_validation(rel):
            val.append(text)
    info = {"python": platform.python_version(), "corpus_python": meta.get("python"),
            "packages": len(kept), "corpus_packages": len(names),
            "same_version": sum(p["version"] == names[p["name"]] for p in kept), "files": len(hashes)}
    return val, hashes, info


def outside_texts(source: str, meta: dict, corpus_hashes: set[str]) -> tuple[list[str], dict]:
    """Texts of code the corpus never read: an installed distribution's non-test *.py files (refused when
    the corpus read that distribution), or a directory's; a file whose text is a corpus text is left
    out, and an exact duplicate is kept once."""
    path = Path(source)
    if path.is_dir():
        files = [f for f in sorted(path.rglob("*.py")) if not data.is_test_path(f.relative_to(path).as_posix())]
        info = {"directory": str(path)}
    else:
        name = source.lower().replace("_", "-")
        if name in {p["name"] for p in meta["packages"]}:
            raise ValueError(f"{source}: the corpus read this distribution; name one it did not")
        dist = importlib.metadata.distribution(source)
        files = data.package_files(dist)
        info = {"package": name, "version": dist.version, "licence": data.licence_text(dist.metadata)}
    texts, seen, in_corpus = [], set(), 0
    for f in files:
        text = data.read_source(f)
        if not text or sha1(text) in seen:
            continue
        in_corpus += sha1(text) in corpus_hashes
        if sha1(text) not in corpus_hashes:
            texts.append(text)
        seen.add(sha1(text))
    return texts, {**info, "files": len(texts), "files_in_corpus": in_corpus}


def sample_texts(texts: list[str], max_bytes: int | None, seed: int) -> list[str]:
    """Whole texts taken in a seeded random order, each one that keeps the total within max_bytes (UTF-8);
    returned in their original order."""
    if max_bytes is None:
        return texts
    picked, total = [], 0
    for i in np.random.default_rng(seed).permutation(len(texts)):
        size = len(texts[i].encode())
        if total + size <= max_bytes:
            picked.append(i)
            total += size
    return [texts[i] for i in sorted(picked)]


def prompt_texts(texts: list[str], n: int) -> list[str]:
    return [p[1] for p in (data.pieces(t, PIECE_CHARS) for t in texts) if len(p) > 1][:n]


def prompt_ids(tok, text: str, length: int = PROMPT_TOKENS) -> list[int] | None:
    """`<|bos|>` + the last length - 1 tokens of text; None when text is shorter."""
    ids = tok.encode(text)[1:]
    return [tok.bos_token_id] + ids[-(length - 1):] if len(ids) >= length - 1 else None


def measure_repetition(target: Path, prompts: list[str], new_tokens: int) -> dict:
    engine = jspec.load(target, draft=None, kv=KVConfig("bf16"))
    ids = [x for x in (prompt_ids(engine.tokenizer, p) for p in prompts) if x]
    results = engine.generate(ids, GenerateConfig(max_new_tokens=new_tokens, lookahead=0))
    repeated, total = repeated_line_share([r.text for r in results])
    return {"repeated_line_share": repeated / max(total, 1), "repeated_lines": repeated, "lines": total,
            "prompts": len(ids), "new_tokens": new_tokens, "kv": "bf16",
            "samples": [r.text for r in results[:4]]}


def measure_tau(target: Path, draft: Path, prompts: list[str], new_tokens: int, lookahead: int = 4) -> dict:
    engine = jspec.load(target, draft=draft)
    gen = GenerateConfig(max_new_tokens=new_tokens, lookahead=lookahead)
    emitted = rounds = 0
    per_prompt = []
    for ids in (x for x in (prompt_ids(engine.tokenizer, p) for p in prompts) if x):
        [r] = engine.generate([ids], gen)
        emitted += r.stats.new_tokens - 1
        rounds += r.stats.rounds
        per_prompt.append(round(r.stats.accept_length, 3))
    return {"tokens_per_round": emitted / max(rounds, 1), "rounds": rounds, "prompts": len(per_prompt),
            "per_prompt": per_prompt, "lookahead": lookahead, "batch": 1, "kv": engine.kv.mode,
            "new_tokens": new_tokens}


def split_texts(args, meta: dict) -> tuple[dict[str, list[str]], dict]:
    """{"validation": texts[, "outside": texts]} sampled as args say, and where each came from."""
    val_path = args.data / "val_texts.json"
    here = None
    if args.outside or not val_path.is_file():  # the outside split must leave out every corpus text
        val, hashes, here = corpus_here(meta)
    if val_path.is_file():
        val, sources = val_texts(args.data, args.max_val_bytes), {"validation": {"val_texts": str(val_path)}}
    else:
        sources = {"validation": {"rebuilt_here": here}}
    splits = {"validation": val}
    if args.outside:
        splits["outside"], info = outside_texts(args.outside, meta, hashes)
        sources["outside"] = info
    for name, texts in splits.items():
        splits[name] = sample_texts(texts, args.sample_bytes, args.seed)
        sources[name].update(sampled_files=len(splits[name]), of_files=len(texts),
                             sampled_bytes=sum(len(t.encode()) for t in splits[name]))
    return splits, sources


def jobs(only: list[str], splits: list[str], draft: bool, val_npy: bool,
         baseline: bool = False) -> list[tuple[str, str, str]]:
    """(stage, split, model) in run order; the draft's rows need --draft, agree needs val.npy, and a
    baseline (another target, e.g. an earlier shipped one) gets bpb rows only."""
    out = []
    for stage in only:
        bpb = ["target"] + ["draft"] * draft + ["baseline"] * baseline
        models = {"bpb": bpb, "repetition": ["target"]}.get(stage, ["pair"] * draft)
        for split in splits if stage != "agree" else ["validation"] * val_npy:
            out += [(stage, split, model) for model in models]
    return out


def run_info(argv) -> dict:
    """Where and how the report was made: commit, device, jax, date, command."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    device = jax.devices()[0]
    return {"commit": commit, "device": f"{device.platform}: {device.device_kind}, {os.cpu_count()} cores",
            "jax": jax.__version__, "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python benchmarks/pair_quality.py " + " ".join(argv)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--baseline", type=Path, help="another target whose bits per byte are reported beside")
    ap.add_argument("--data", type=Path, default=Path("data/code"), help="corpus directory (val_texts.json)")
    ap.add_argument("--corpus-meta", type=Path, default=Path("checkpoints/corpus_meta.json"),
                    help="the corpus' meta.json: the distributions it read (used when --data has none)")
    ap.add_argument("--outside", help="an installed distribution the corpus never read, or a directory of code")
    ap.add_argument("--sample-bytes", type=int, help="score a seeded sample of whole files of each split")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-val-bytes", type=int, help="score only a prefix of --data's validation texts")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="bpb forward dtype")
    ap.add_argument("--batch", type=int, default=8, help="bpb windows per forward")
    ap.add_argument("--only", nargs="*", choices=STAGES, default=list(STAGES))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    meta_path = args.data / "meta.json" if (args.data / "meta.json").is_file() else args.corpus_meta
    splits, sources = split_texts(args, json.loads(meta_path.read_text()))
    report = {"target": str(args.target), "draft": str(args.draft) if args.draft else None,
              "baseline": str(args.baseline) if args.baseline else None, **run_info(argv),
              "dtype": args.dtype, "seed": args.seed, "sample_bytes": args.sample_bytes, "corpus_meta": str(meta_path),
              "splits": sources, "rows": []}
    models = {"target": args.target, "draft": args.draft, "baseline": args.baseline}
    stages = {
        "bpb": lambda texts, model: measure_bpb(models[model], texts, jnp.dtype(args.dtype), args.batch),
        "repetition": lambda texts, _: measure_repetition(args.target, prompt_texts(texts, args.prompts),
                                                          args.new_tokens),
        "tau": lambda texts, _: measure_tau(args.target, args.draft, prompt_texts(texts, args.prompts),
                                            args.new_tokens),
        "agree": lambda texts, _: train.pair_metrics(args.target, args.draft, train.spaced(
            data.eval_windows(data.load_split(args.data, "val"), SEQ_LEN), 64), 8),
    }
    # agree scores val.npy, which is in the corpus' tokenizer
    val_npy = (args.data / "val.npy").is_file() and \
        load_tokenizer(args.target).get_vocab() == load_tokenizer(args.data / "tokenizer").get_vocab()
    for stage, split, model in jobs(args.only, list(splits), args.draft is not None, val_npy,
                                    args.baseline is not None):
        t0 = time.perf_counter()
        row = {"metric": stage, "split": split, "model": model, **stages[stage](splits[split], model),
               "wall_s": round(time.perf_counter() - t0, 1)}
        report["rows"].append(row)
        args.out.write_text(json.dumps(report, indent=2) + "\n")  # what finished survives a later timeout
        print(json.dumps({k: v for k, v in row.items() if k not in ("samples", "per_prompt")}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
