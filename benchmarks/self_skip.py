"""The layer-skipping self-draft on the CPU: its acceptance against the self-draft's, and a round's cost against a
plain step.

    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/self_skip.py [--layers 4 5 6 7] [--context 1024] \
        [--out benchmarks/results/self_skip.json]

Acceptance: the shipped target (INT2 OSCAR, sink 64 + recent 256), float32, greedy, K = 4, batch 3 (one row per
prompt): `self` and `self-skip` at each N of --layers, on held-out code (long_context_acceptance.prompts) and on
prose (pydoc's documentation topics: English the code model saw only in docstrings). Tokens per round = (new
tokens - 1) / rounds.
Costs: a 32-layer, 8B-proportioned stand-in small enough for the CPU (hidden 512, MLP 1792, 8 query / 2 KV heads of
64, vocabulary 16384: the LM head weighs about 2.4 layers, as the 8B's does), random bf16 weights, INT2 cache filled
to --cost-context, batch 1, each step timed as --lookahead auto times it (runtime.lookahead.per_step). CPU timings;
the GPU's figures come from benchmarks/long_context.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jspec
from jspec.config import KVConfig, ModelConfig
from jspec.decode import drafters
from jspec.decode.state import Drafter, DraftMode, Models
from jspec.model import decoder as model
from jspec.runtime import lookahead

from decode import LLAMA3_8B  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from long_context_acceptance import prompts as code_prompts, run  # noqa: E402
from scratch import default_out  # noqa: E402

K, ROWS, NEW_TOKENS = 4, 3, 32
STAND_IN = dataclasses.replace(LLAMA3_8B, vocab_size=16384, hidden_size=512, intermediate_size=1792, num_heads=8,
                               num_kv_heads=2, head_dim=64, max_position=8192)


def prose_prompts(tok, n: int, context: int) -> list[list[int]]:
    """n cuts of `context` tokens of pydoc's topics, each ending at a line end, spread over the text."""
    from pydoc_data import topics

    ids = tok.encode("\n\n".join(topics.topics[k] for k in sorted(topics.topics)))
    newline = {i for i in range(len(tok.get_vocab())) if "\n" in tok.decode([i])}
    ends = np.linspace(context, len(ids) - NEW_TOKENS, n).astype(int)
    cuts = [next(i for i in range(e, len(ids)) if ids[i - 1] in newline) for e in ends]
    return [ids[c - context: c] for c in cuts]


def acceptance(layers, context: int) -> list[dict]:
    rows = []
    for N in [None, *layers]:
        engine = jspec.load(draft="self" if N is None else "self-skip", dtype="float32", draft_layers=N)
        for text, make in (("code", lambda t: code_prompts(t, ROWS, context, NEW_TOKENS)),
                           ("prose", lambda t: prose_prompts(t, ROWS, context))):
            r = run(engine, make(engine.tokenizer), K, NEW_TOKENS)
            tau = r["tokens_per_round"]
            rows.append(dict(drafter="self" if N is None else "self-skip", layers=N or engine.cfg.num_layers,
                             text=text, context=context, tokens_per_round=round(tau, 3),
                             alpha=round(lookahead.alpha_from_accepted(tau - 1, K), 3), per_row=r["per_row"]))
            print(json.dumps(rows[-1]), flush=True)
        jax.clear_caches()
    return rows


def costs(cfg: ModelConfig, layers, context: int) -> dict:
    kv = KVConfig("int2")
    target = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    cap = context + K + 2
    plain = Models(target, Drafter(), cfg, K)
    step = lambda p: lookahead.per_step(p, 8) * 1e3
    out = dict(plain_step_ms=step(lookahead.verify_probe(plain, kv, 1, cap, context, 1, jnp.bfloat16)),
               verify_5_ms=step(lookahead.verify_probe(plain, kv, 1, cap, context, K + 1, jnp.bfloat16)))
    for N in [None, *layers]:
        d = Drafter(mode=DraftMode.SELF) if N is None else Drafter(mode=DraftMode.SELF_SKIP, layers=N)
        m = Models(target, d, cfg, K)
        [probe] = drafters.of(m).probes(m, kv, 1, cap, context, K, jnp.bfloat16).values()
        ms = step(probe)
        name = "self" if N is None else f"self-skip {N}"
        out[name] = dict(step_ms=round(ms, 3), round_k4_in_plain_steps=round(K * ms / out["plain_step_ms"], 3))
        print(name, json.dumps(out[name]), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 5, 6, 7], help="self-skip's N (shipped: of 8)")
    ap.add_argument("--cost-layers", type=int, nargs="+", default=[8, 12, 16, 24], help="N of the stand-in's 32")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--cost-context", type=int, default=4096)
    ap.add_argument("--parts", default="ac", help="a: acceptance; c: costs")
    ap.add_argument("--small", action="store_true", help="costs on a 4-layer stand-in (tests/test_benchmarks.py)")
    ap.add_argument("--out", type=Path, default=default_out("self_skip.json"), help="JSON path (default: a scratch folder)")
    a = ap.parse_args(argv)
    result = dict(device=str(jax.devices()[0]), jax=jax.__version__, K=K, greedy=True)
    if "a" in a.parts:
        result["acceptance"] = acceptance(a.layers, a.context)
        a.out.write_text(json.dumps(result, indent=1))
    if "c" in a.parts:
        cfg = dataclasses.replace(STAND_IN, num_layers=4, vocab_size=2048) if a.small else STAND_IN
        result["costs"] = dict(shape=dataclasses.asdict(cfg), context=a.cost_context, batch=1,
                               **costs(cfg, a.cost_layers, a.cost_context))
        a.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
