"""How often bf16 greedy output depends on speculation or on the batch: the shipped pair, held-out prompts.

    PYTHONPATH=. python benchmarks/bf16_agreement.py --out $OUT/bf16_agreement.json            # GPU
    PYTHONPATH=. python benchmarks/bf16_agreement.py --prompts 8 --max-new-tokens 32 --out a.json  # CPU

Greedy speculative decoding is plain decoding exactly in float32, and a row's output does not depend on its
batch-mates. In bf16 the verify forward (K+1 positions) and a plain step (one position), or the same step at
batch 1 and batch 8, round differently; after a near-tie between the top two logits the argmax can flip and
the outputs diverge from there. This counts, over the held-out prompts of benchmarks/speculative.py, the share
of prompts whose outputs are identical and their mean common prefix, for speculative vs plain decoding (at
batch 1 and at batch 8) and for batch 1 vs batch 8 (plain and speculative). --dtype float32 is the control:
every comparison should then agree on every prompt.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

import jspec
from jspec.config import GenerateConfig, KVConfig

from speculative import held_out_prompts  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

COMPARISONS = {  # name -> the two runs compared, each (speculative or plain, batch size)
    "speculative vs plain, batch 8": (("spec", 8), ("plain", 8)),
    "speculative vs plain, batch 1": (("spec", 1), ("plain", 1)),
    "batch 1 vs batch 8, plain": (("plain", 1), ("plain", 8)),
    "batch 1 vs batch 8, speculative": (("spec", 1), ("spec", 8)),
}


def run(eng, prompts: list[str], gen: GenerateConfig, batch: int) -> list[list[int]]:
    """Greedy token ids of every prompt, generated `batch` prompts per call."""
    out = []
    for i in range(0, len(prompts), batch):
        out += [r.token_ids for r in eng.generate(prompts[i : i + batch], gen)]
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(a: list[list[int]], b: list[list[int]]) -> dict:
    prefix = [common_prefix(x, y) for x, y in zip(a, b)]
    same = sum(x == y for x, y in zip(a, b))
    return dict(identical=same, prompts=len(a), share=same / len(a), mean_common_prefix=float(np.mean(prefix)),
                mean_length=float(np.mean([(len(x) + len(y)) / 2 for x, y in zip(a, b)])))


def table(results: dict, head: str) -> str:
    rows = [head, f"{'comparison':34s} {'identical':>14s}   mean common prefix (tokens)"]
    for name, r in results.items():
        rows.append(f"{name:34s} {r['identical']:>4d}/{r['prompts']:<3d} ({r['share']:4.0%})   "
                    f"{r['mean_common_prefix']:.1f} of {r['mean_length']:.1f}")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64, help="held-out prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--lookahead", type=int, default=4, help="K of the speculative runs")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--kv", choices=("auto", "bf16", "int2"), default="auto", help="auto: the shipped INT2 cache")
    ap.add_argument("--out", required=True, help="JSON results path")
    a = ap.parse_args()

    eng = jspec.load(dtype=a.dtype, kv=KVConfig(a.kv))
    prompts = held_out_prompts(eng.tokenizer, a.prompts)
    gens = {"spec": GenerateConfig(a.max_new_tokens, a.lookahead), "plain": GenerateConfig(a.max_new_tokens, 0)}
    outputs = {(kind, b): run(eng, prompts, gens[kind], b) for kind in gens for b in (1, 8)}
    results = {name: compare(outputs[x], outputs[y]) for name, (x, y) in COMPARISONS.items()}
    device = jax.devices()[0].device_kind
    head = (f"greedy agreement, shipped pair, {a.dtype}, kv {eng.kv.mode}, K={a.lookahead}, {len(prompts)} prompts x "
            f"{a.max_new_tokens} new tokens, {jax.default_backend()} ({device})")
    print(table(results, head))
    with open(a.out, "w") as f:
        json.dump(dict(backend=jax.default_backend(), device=device, jax=jax.__version__, dtype=a.dtype,
                       kv=eng.kv.mode, lookahead=a.lookahead, prompts=len(prompts), max_new_tokens=a.max_new_tokens,
                       results=results), f, indent=2)


if __name__ == "__main__":
    main()
