"""Acceptance at long context on the CPU: tokens per round of each drafter against the prompt's context.

    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/long_context_acceptance.py \
        [--contexts 256 1024 2048 4096] [--ks 4 2 6] [--dtypes float32 bfloat16] [--prompts 3] [--new-tokens 32]

The shipped target (INT2 OSCAR KV, sink 64 + recent 256) with each drafter: self, ngram, ngram+self, the shipped
draft model with a full BF16 cache and with a windowed one (decode.state.DRAFT_WINDOW), the shipped EAGLE-3 head
likewise. Greedy, batch = the prompts, one row per prompt. Prompts: held-out code, cut deep inside the
validation files of the shipped corpus (jspec.train.data: stdlib_root, corpus_files, is_validation): for each of
the longest validation files, a cut at a line end past the longest context, and for a context of c tokens the c
tokens before that cut (the same continuation at every context; "4096" is the shipped pair's whole context less
the new tokens, the lookahead and the bonus token: prompt_tokens in each row).

Per row and round the accepted count a is read between rounds (decode.loop's round program, one host sync per
round; the tokens are the generate program's), so each row also gives where its drafts were rejected: the
histogram of a (a < K: the draft at position a + 1 was the first rejected) and the kind of token the target
wanted there. tokens per round = (new tokens - 1) / rounds over all rows (the first token comes from the prefill).
Rows are appended to the JSON as they finish (an interrupted run keeps them); a plot of tokens per round against
context per drafter (K = 4) is written next to it where matplotlib is installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

import jspec
from jspec.config import GenerateConfig, SamplingConfig
from jspec.decode import loop as decode
from jspec.paths import CHECKPOINTS
from jspec.train import data
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

OUT = default_out("long_context_acceptance.json")
HEAD = CHECKPOINTS / "code-head"
DRAFTERS = {  # name: (load's draft argument, draft_window: "default" keeps load's)
    "self": ("self", "default"), "ngram": ("ngram", "default"), "ngram+self": ("ngram+self", "default"),
    "model": ("shipped", None), "model-window": ("shipped", "default"),
    "head": (str(HEAD), None), "head-window": (str(HEAD), "default"),
}


def prompts(tok, n: int, context: int, new_tokens: int) -> list[list[int]]:
    """n cuts of `context` tokens, each ending at a line end deep inside one of the longest validation files."""
    root = data.stdlib_root()
    texts = [data.read_source(root / rel) for rel in data.corpus_files(root) if data.is_validation(rel)]
    ids = sorted((tok.encode(t) for t in texts if t), key=len, reverse=True)
    newline = {i for i in range(len(tok.get_vocab())) if "\n" in tok.decode([i])}
    out = []
    for x in ids:
        cut = next((i for i in range(context, len(x) - new_tokens) if x[i - 1] in newline), None)
        if cut is not None:
            out.append(x[cut - context: cut])
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} validation files hold {context} + {new_tokens} tokens")


def token_kind(tok, i: int) -> str:
    s = tok.decode([i])
    return "newline" if "\n" in s else "space" if not s.strip() else "word" if s.strip()[0].isalnum() or \
        s.strip()[0] == "_" else "punct"


def run(engine, ids, K: int, new_tokens: int) -> dict:
    """One batch through the round program, a read after each round: stats, the histogram of a and the kinds of the
    target's tokens where a draft was rejected."""
    gen = GenerateConfig(max_new_tokens=new_tokens, lookahead=K, stop_at_eos=False)
    args = engine.prepare(ids, [SamplingConfig()] * len(ids), [new_tokens] * len(ids), gen)
    t0 = time.perf_counter()
    s = decode.start_program(*args)
    hist, kinds = np.zeros(K + 1, np.int64), {}
    while not bool(np.asarray(s.done).all()):
        acc, count, active = np.asarray(s.accepted), np.asarray(s.count), ~np.asarray(s.done)
        s = decode.round_program(args.models, args.sampler, args.max_new, args.eos_ids, s)
        a, tokens = np.asarray(s.accepted) - acc, np.asarray(s.tokens)
        for b in np.flatnonzero(active[: len(ids)]):
            hist[a[b]] += 1
            if a[b] < K and count[b] + a[b] < new_tokens:
                kind = token_kind(engine.tokenizer, int(tokens[b, count[b] + a[b]]))
                kinds[kind] = kinds.get(kind, 0) + 1
    rounds, count = np.asarray(s.rounds)[: len(ids)], np.asarray(s.count)[: len(ids)]
    return dict(tokens_per_round=float((count - 1).sum() / max(rounds.sum(), 1)),
                per_row=[round(float(c - 1) / max(r, 1), 3) for c, r in zip(count, rounds)],
                rounds=int(rounds.sum()), accepted_histogram=hist.tolist(), rejected_token_kinds=kinds,
                seconds=round(time.perf_counter() - t0, 2))


def load(name: str, dtype: str):
    draft, window = DRAFTERS[name]
    kw = {} if window == "default" else dict(draft_window=window)
    return jspec.load(draft=draft, dtype=dtype, **kw)


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, dtype in zip(axes, ("float32", "bfloat16")):
        for name in DRAFTERS:
            pts = sorted((r["context"], r["tokens_per_round"]) for r in rows
                         if r["drafter"] == name and r["dtype"] == dtype and r["K"] == 4)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set(xscale="log", xlabel="context (tokens)", title=f"K = 4, {dtype}")
    axes[0].set_ylabel("tokens per round")
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 2048, 4096])
    p.add_argument("--ks", type=int, nargs="+", default=[4, 2, 6])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=list(DRAFTERS))
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--append", action="store_true", help="add to the rows of --out (a run in several parts)")
    a = p.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    record = dict(commit=commit, device=f"{jax.devices()[0].device_kind} ({platform.processor() or 'cpu'})",
                  jax=jax.__version__, date=datetime.date.today().isoformat(),
                  command="PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/long_context_acceptance.py "
                          + " ".join(sys.argv[1:] if argv is None else argv),
                  target="checkpoints/code-target (INT2 OSCAR, sink 64, recent 256)", greedy=True,
                  prompts=a.prompts, new_tokens=a.new_tokens, rows=[])
    if a.append and a.out.is_file():
        previous = json.loads(a.out.read_text())
        record.update(rows=previous["rows"], command=previous["command"] + " && " + record["command"])
    # K first, so the headline (K = 4) lands first; a drafter's engine serves every context and K of a dtype
    for dtype in a.dtypes:
        for name in a.drafters:
            engine = load(name, dtype)
            for K in a.ks:
                for context in a.contexts:
                    # the longest context holds the new tokens, the lookahead and the bonus token too
                    n = min(context, engine.cfg.context - a.new_tokens - K - 1)
                    ids = prompts(engine.tokenizer, a.prompts, n, a.new_tokens)
                    row = dict(drafter=name, dtype=dtype, K=K, context=context, prompt_tokens=n, prompts=a.prompts,
                               new_tokens=a.new_tokens,
                               draft_cache=engine.drafter.cache_kv(engine.capacity(
                                   GenerateConfig(a.new_tokens, lookahead=K), [n] * a.prompts,
                                   [a.new_tokens] * a.prompts)).mode if name.startswith(("model", "head")) else None,
                               **run(engine, ids, K, a.new_tokens))
                    record["rows"].append(row)
                    print(json.dumps({k: row[k] for k in ("drafter", "dtype", "K", "context", "draft_cache",
                                                          "tokens_per_round", "seconds")}), flush=True)
                    a.out.write_text(json.dumps(record, indent=1))
            jax.clear_caches()
    plot(record["rows"], a.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
