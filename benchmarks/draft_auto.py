"""Draft auto against plain decoding and each fixed drafter, end to end on the shipped pair (INT2, greedy).

    PYTHONPATH=$PWD python benchmarks/draft_auto.py --contexts 256 1024 --batches 1 8 --out benchmarks/results/draft_auto.json

Per (workload, context, batch): one call of each engine to compile, then `reps` rounds of calls: plain first, then
the others in an order that rotates each round (each drafter at lookahead auto: its K chosen per call; auto: its
drafter and K; "plain-again": a second plain engine, whose ratio is the timing noise). A drafter's speed-up is the
median over rounds of plain's decode seconds over its own in that round (paired: load that drifts between rounds
cancels). Workloads: held-out code (long_context_acceptance.prompts) and prose (this repository's docs, which the
code model was not trained on: n-gram lookup has little to copy). Rows: median decode seconds, paired speed-ups,
what auto chose in each round and the seconds its planning took (not in decode_s). --fresh: every engine is loaded
again before each of its calls, so every call is a new process's first on a model pair no process ran before (one
`jspec generate` run: auto's estimates at the priors, kept in memory only, every program run for the first time).
Without it, auto reads and writes its learned estimates on disk as `jspec generate` does (runtime.learned). Writes one
JSON only with --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax

import jspec
from jspec.config import GenerateConfig, SamplingConfig
from long_context_acceptance import prompts as code_prompts

DRAFTS = ("none", "plain-again", "ngram", "self", "shipped", "auto")  # "plain-again": draft "none" loaded twice


def prose_prompts(tok, n: int, context: int) -> list[list[int]]:
    """n cuts of `context` tokens of the docs' text, each starting at a different offset."""
    text = "\n\n".join(p.read_text() for p in sorted(Path("docs").glob("*.md")) + [Path("README.md")])
    ids = tok.encode(text)
    step = max((len(ids) - context) // max(n, 1), 1)
    return [ids[i * step: i * step + context] for i in range(n)]


def call(eng, ids, new_tokens: int):
    out = eng.generate_ids(ids, [SamplingConfig()] * len(ids), [new_tokens] * len(ids),
                           GenerateConfig(new_tokens, stop_at_eos=False))
    return out[0][1], [t for t, _ in out]


def _order(r: int) -> list[str]:
    """Round r's calls: plain first, then the others rotated by r (how long after plain each runs varies)."""
    rest = DRAFTS[1:]
    return ["none", *rest[r % len(rest):], *rest[: r % len(rest)]]


def _load(d: str, learn: str | None = None):
    return jspec.load(draft="none" if d == "plain-again" else d, learn=learn)


def run(contexts, batches, new_tokens: int, reps: int, budget_s: float, fresh: bool = False) -> list[dict]:
    learn = "memory" if fresh else None  # fresh: at the priors, as a first process
    engines = {d: _load(d, learn) for d in DRAFTS}
    tok, rows, t0 = engines["none"].tokenizer, [], time.perf_counter()
    for workload in ("code", "prose"):
        for ctx in contexts:
            for B in batches:
                if time.perf_counter() - t0 > budget_s:
                    rows.append(dict(workload=workload, ctx=ctx, batch=B, skipped="time budget"))
                    continue
                ids = code_prompts(tok, B, ctx, new_tokens) if workload == "code" else prose_prompts(tok, B, ctx)
                want = {d: call(e, ids, new_tokens)[1] for d, e in engines.items()}  # compiled (and learnt) once
                times, same, chose, plan_s = {d: [] for d in DRAFTS}, {}, [], []
                for r in range(reps):
                    for d in _order(r):
                        if fresh:
                            engines[d] = _load(d, learn)
                        st, tokens = call(engines[d], ids, new_tokens)
                        times[d].append(st.decode_s)
                        same[d] = same.get(d, True) and tokens == want["none"]  # bf16: may differ
                        if d == "auto":
                            chose.append(dict(drafter=st.draft_mode, K=st.lookahead))
                            plan_s.append(st.lookahead_auto["measure_s"] if st.lookahead_auto else 0.0)
                paired = {d: statistics.median(p / t for p, t in zip(times["none"], times[d])) for d in DRAFTS}
                rows.append(dict(workload=workload, ctx=ctx, batch=B, new_tokens=new_tokens, reps=reps,
                                 decode_s={d: round(statistics.median(t), 4) for d, t in times.items()},
                                 speedup_over_plain={d: round(x, 3) for d, x in paired.items()},
                                 fresh=fresh, auto_chose=chose, auto_plan_s=round(statistics.median(plan_s), 4),
                                 same_tokens_as_plain=same))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=1800.0, help="cells left after this are skipped")
    ap.add_argument("--out", type=Path, help="write the rows here as JSON (default: print only)")
    ap.add_argument("--fresh", action="store_true", help="load every engine again before each call: first calls only")
    a = ap.parse_args(argv)
    rows = run(a.contexts, a.batches, a.new_tokens, a.reps, a.budget_s, a.fresh)
    if a.out:
        a.out.write_text(json.dumps(dict(device=str(jax.devices()[0]), jax=jax.__version__, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
