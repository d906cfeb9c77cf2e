"""Session 11: what a draft-model step costs with two rows (decode.draft_model since session 11: one traced
forward serves the resync and the steps) against one row (before), in the same process: the forward over
the carried tokens, a commit and the argmax, timed as jitted loops by lookahead's own machinery.

    PYTHONPATH=. python benchmarks/results/logs11/draft_rows.py [--small]
"""

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import jspec
from jspec import decode, kvcache, lookahead, model
from jspec.config import KVConfig, ModelConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    from speculative import QWEN3_06B_SHAPE

    shipped = jspec.load()
    drafts = dict(shipped=(shipped.draft_cfg, shipped.draft_params, 512))
    if not args.small:
        cfg = QWEN3_06B_SHAPE
        drafts["qwen3-0.6b-shape"] = (cfg, model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16), 2560)
    step = lookahead._forward_step(lambda m, tok, cache: m.draft_forward(tok, cache))
    rows = []
    for name, (cfg, params, capacity) in drafts.items():
        m = decode.Models(None, params, cfg, cfg, 4)
        for B in (1, 8) if args.small else (1, 8, 32, 64):
            t = {}
            for W in (1, 2):
                cache = kvcache.init_cache(cfg, KVConfig("bf16"), B, capacity, params.embed.dtype)
                carry = lookahead._at(cache, capacity // 2, jnp.zeros((B, W), jnp.int32), None, heads=False)
                t[W] = lookahead._per_step(step, m, carry, 16)
            rows.append(dict(draft=name, batch=B, one_row_ms=round(t[1] * 1e3, 4), two_rows_ms=round(t[2] * 1e3, 4),
                             ratio=round(t[2] / t[1], 4)))
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps(dict(device=str(jax.devices()[0]), rows=rows)))


if __name__ == "__main__":
    main()
