"""Quality of a target/draft pair on the corpus' validation split: the metrics of issue 18.

    PYTHONPATH=. python benchmarks/pair_quality.py --target jspec/checkpoints/code-target \
        --draft jspec/checkpoints/code-draft --data data/code --out pair.json [--only bpb repetition tau agree]

- bpb: validation bits per byte of the target, tokenizer-independent: each validation text (the
  corpus' val_texts.json) is encoded by the model's own tokenizer as `<|bos|> text <|eos|>`, the
  documents are concatenated and cut into consecutive windows of 2048 predicted tokens (the context
  restarts at each window), and the NLL of every token after the first (EOS included) is summed in
  nats, / ln 2, / the UTF-8 bytes of the texts. Exported bf16 weights, bf16 forward, f32 loss.
- repetition: greedy 128-token continuations (BF16 KV, no draft, one batch) of held-out prompts; the
  share of their non-blank lines (stripped) that equal an earlier line of the same continuation.
- tau: draft tokens per round at lookahead 4, batch 1, greedy, with the pair as jspec.load gives it
  (INT2 OSCAR KV when the target ships rotations): sum over prompts of (new tokens - 1) / sum of
  rounds, from the engine's stats (the first token comes from the prefill, not from a round).
- agree: the pair's validation losses and greedy agreement (jspec.train.train.pair_metrics, 64 windows).
Prompts: the second ~600-character piece (cut at a line end) of each validation text that has one,
in order; each prompt is `<|bos|>` + the last PROMPT_TOKENS - 1 tokens of its piece, so every prompt
has one length (one compiled program per pair) and ends at a line end for any tokenizer.
"""

from __future__ import annotations

import argparse
import json
import math
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


def measure_bpb(target: Path, texts: list[str]) -> dict:
    cfg, params, tok = load_model(target, jnp.bfloat16)
    stream = token_stream(tok, texts)
    windows, mask = scored_windows(stream, SEQ_LEN)
    n_bytes = sum(len(t.encode()) for t in texts)
    nll = total_nll(params, cfg, windows, mask)
    return {"bpb": bits_per_byte(nll, n_bytes), "bytes": n_bytes, "tokens": int(len(stream)),
            "bytes_per_token": n_bytes / len(stream), "nll_per_token": nll / float(mask.sum()), "files": len(texts)}


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--data", type=Path, default=Path("data/code"), help="corpus directory (val_texts.json)")
    ap.add_argument("--only", nargs="*", choices=STAGES, default=list(STAGES))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--max-val-bytes", type=int, help="score only a prefix of the validation texts")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    texts = val_texts(args.data)
    prompts = prompt_texts(texts, args.prompts)
    report = {"target": str(args.target), "draft": str(args.draft) if args.draft else None,
              "backend": jax.default_backend()}
    stages = {
        "bpb": lambda: measure_bpb(args.target, val_texts(args.data, args.max_val_bytes)),
        "repetition": lambda: measure_repetition(args.target, prompts, args.new_tokens),
        "tau": lambda: measure_tau(args.target, args.draft, prompts, args.new_tokens),
        "agree": lambda: train.pair_metrics(args.target, args.draft, train.spaced(
            data.eval_windows(data.load_split(args.data, "val"), SEQ_LEN), 64), 8),
    }
    same_tokenizer = load_tokenizer(args.target).get_vocab() == load_tokenizer(args.data / "tokenizer").get_vocab()
    for name in args.only:
        if name in ("tau", "agree") and not args.draft or name == "agree" and not same_tokenizer:
            continue  # agree scores val.npy, which is in the corpus' tokenizer
        t0 = time.perf_counter()
        report[name] = {**stages[name](), "wall_s": round(time.perf_counter() - t0, 1)}
        args.out.write_text(json.dumps(report, indent=2) + "\n")  # what finished survives a later timeout
        print(json.dumps({name: {k: v for k, v in report[name].items() if k not in ("samples", "per_prompt")}}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
