"""Batch jobs: rows refilled as they finish (jspec.runtime.slots) against static batches, on one device.

    PYTHONPATH=. python benchmarks/jobs.py --model tiny                    # CPU: a tiny random llama
    PYTHONPATH=. python benchmarks/jobs.py --model tiny --small            # CPU check of the script, ~1 minute
    PYTHONPATH=. python benchmarks/jobs.py --model shipped --scale 4       # the shipped pair, lengths / 4
    PYTHONPATH=. python benchmarks/jobs.py --model 8b                      # GPU: 8B-shaped INT2 target + 0.6B draft

A job of --prompts prompts (default 256) whose max_new_tokens are drawn uniformly from 16..512 (divided by
--scale), EOS allowed, run through batch.run_rows (the job runner's loop, without the files) at --batch-size
slots: static batches (each until its slowest row is done), then refilled batches for each --fills (rows per
refilled batch, at least this many times its slots: slots.groups) and --refill-at (rows done before the rounds
stop for a refill; 0: slots.default_refill_at). Each run reports the decode time and
tokens/s (compile excluded), the rounds the rows took, the row-rounds the batches ran (slots x rounds), and the
wasted fraction (row-rounds in which a slot was done or empty). Writes --out (default: a scratch folder):
the rows and the commit, device, jax version, date and command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from jspec.jobs import batch  # noqa: E402
from jspec.config import GenerateConfig, KVConfig, ModelConfig, SamplingConfig  # noqa: E402
from jspec.decode.state import Drafter, DraftMode  # noqa: E402
from jspec.model import decoder as model, rotation  # noqa: E402
from jspec.runtime import engine, slots  # noqa: E402
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

TINY = ModelConfig("llama", 512, 128, 256, 4, 4, 2, 32, max_position=4096, eos_token_ids=(2,))
PROMPTS = ["def fibonacci(n):", "class Stack:", "import numpy as np\n", "def quicksort(xs):", "# parse a CSV file\n",
           "def is_prime(n):", "async def fetch(url):", "def merge(a, b):"]


def make_engine(name: str):
    """(engine, prompt token ids maker, lookahead): tiny (random, float32, n-gram drafts), shipped (the pair in
    checkpoints/), 8b (random Llama-3-8B shapes, INT2, a random 0.6B-shaped draft)."""
    if name == "shipped":
        eng = engine.load()
        return eng, lambda rng, i: eng.encode(PROMPTS[i % len(PROMPTS)] + f"  # {i}\n"), 4
    if name == "tiny":
        cfg, kv, dtype, drafter = TINY, KVConfig("bf16"), jnp.float32, Drafter(mode=DraftMode.NGRAM)
    else:
        from decode import LLAMA3_8B
        from speculative import QWEN3_06B_SHAPE

        cfg, kv, dtype = LLAMA3_8B, KVConfig("int2"), jnp.bfloat16
        draft = model.init_params(QWEN3_06B_SHAPE, jax.random.key(1), dtype=dtype)
        drafter = Drafter(draft, mode=DraftMode.MODEL, model_cfg=QWEN3_06B_SHAPE)
    params = model.init_params(cfg, jax.random.key(0), dtype=dtype)
    if kv.int2:
        params = engine._apply_rotations(params, cfg, *rotation.hadamard_rotations(cfg))
    eng = engine.Engine(cfg, params, None, kv, drafter, dtype=jnp.dtype(dtype).name, attn_impl=engine._default_impl())
    return eng, lambda rng, i: rng.integers(3, cfg.vocab_size, int(rng.integers(8, 33))).tolist(), 4


def make_jobs(prompt_ids, n: int, lo: int, hi: int, seed: int = 0) -> list[batch.Job]:
    rng = np.random.default_rng(seed)
    return [batch.Job(i, i + 1, "", prompt_ids(rng, i), int(rng.integers(lo, hi + 1)), SamplingConfig())
            for i in range(n)]


# records are left out: only the stats count here (no tokenizer needed)
FORMAT = dataclasses.replace(batch.JSPEC, record=lambda eng, job, tokens, stats: {"id": job.id})


def run(eng, jobs, gen, batch_size: int, refill: bool, refill_at: int | None, fills: int) -> dict:
    summary, t0 = batch.Summary(), time.perf_counter()
    for answered, call in batch.run_rows(eng, jobs, gen, batch_size, FORMAT, refill, refill_at, fills):
        summary.add([st for _, st in answered if st is not None], call)
        summary.errors += sum(st is None for _, st in answered)
    summary.wall_s = time.perf_counter() - t0
    d = summary.as_dict()
    keep = ("prompts", "errors", "new_tokens", "rounds", "row_rounds", "wasted_row_rounds", "wasted_fraction",
            "compile_s", "decode_s", "wall_s", "decode_tokens_per_s", "accept_length")
    return {k: d[k] for k in keep}


def meta(argv: list[str]) -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dev = jax.devices()[0]
    return dict(commit=commit.strip(), device=f"{dev.platform} {dev.device_kind}", jax=jax.__version__,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                command="PYTHONPATH=. python benchmarks/jobs.py " + " ".join(argv))


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("tiny", "shipped", "8b"), default="tiny")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--scale", type=float, default=1.0, help="max_new_tokens drawn from 16..512 divided by this")
    ap.add_argument("--refill-at", type=int, nargs="+", default=[0, 1],
                    help="rows done before a refill, one run each (0: the default, slots.default_refill_at)")
    ap.add_argument("--fills", type=int, nargs="+", default=[slots.FILLS],
                    help="a refilled batch's rows at least this many times its slots (slots.groups), one run each")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each configuration, interleaved (the first "
                    "compiles); the fastest decode is reported")
    ap.add_argument("--small", action="store_true", help="a quick check: 32 prompts of 4..32 tokens, batch 8")
    ap.add_argument("--out", type=Path, default=default_out("jobs.json"), help="JSON path (default: a scratch folder)")
    a = ap.parse_args(argv)
    if a.small:
        a.prompts, a.batch_size, a.scale, a.repeats = 32, 8, 16.0, 1
    lo, hi = max(1, round(16 / a.scale)), max(2, round(512 / a.scale))
    eng, prompt_ids, K = make_engine(a.model)
    jobs = make_jobs(prompt_ids, a.prompts, lo, hi)
    gen = GenerateConfig(max_new_tokens=hi, lookahead=K)
    rows = []
    runs = [(False, None, None)] + [(True, x or None, f) for f in a.fills for x in a.refill_at]
    for rep in range(a.repeats):  # interleaved: a busy machine slows every configuration alike
        for i, (refill, at, fills) in enumerate(runs):
            r = run(eng, jobs, gen, a.batch_size, refill, at, fills or slots.FILLS)
            print(json.dumps(r), flush=True)
            if rep == 0:
                rows.append(dict(mode="refill" if refill else "static", fills=fills, batch_size=a.batch_size,
                                 refill_at=at or (slots.default_refill_at(a.batch_size) if refill else None),
                                 max_new=[lo, hi], **r, decode_s_runs=[]))
            rows[i]["decode_s_runs"].append(r["decode_s"])
    for r in rows:  # the fastest run of each (the rounds are the same in every run)
        r["decode_s"] = min(r["decode_s_runs"])
        r["decode_tokens_per_s"] = round(r["new_tokens"] / r["decode_s"], 1)
    base = rows[0]["decode_tokens_per_s"]
    for r in rows:
        r["decode_speedup_vs_static"] = round(r["decode_tokens_per_s"] / base, 3) if base else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(dict(meta(argv), model=a.model, rows=rows), indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
