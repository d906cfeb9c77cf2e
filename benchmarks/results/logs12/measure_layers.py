"""What lookahead auto's first cost measurement costs, and whether loops over fewer target layers would do.

The README command's cold run spends about 13 s getting its costs (session 12), most of it compiling four
full-model loops. This times `Engine.plan` (lookahead.measure: the loops compiled side by side, then timed)
in fresh processes with new caches, for the shipped pair as it is and with the target cut to its first 1
and 2 layers, and compares the full target's verify costs with the ones the cut loops predict,
t1 + (L - 1) (t2 - t1) (per-layer cost from the difference, the rest from the one-layer loop).

    PYTHONPATH=. python benchmarks/results/logs12/measure_layers.py [--phases] [--out measure_layers.json]
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROMPT = "def fibonacci(n):"


def child(layers: int, phases: bool) -> dict:
    t0 = time.perf_counter()
    import jax

    import jspec
    from jspec import engine
    from jspec.config import GenerateConfig

    engine.use_compile_cache(os.path.join(os.environ["JSPEC_CACHE_DIR"], "xla"))
    eng = jspec.load()
    if layers:  # the target's first `layers` layers, the draft as it is
        cfg = dataclasses.replace(eng.cfg, num_layers=layers)
        eng = dataclasses.replace(eng, cfg=cfg, params=eng.params.replace(layers=eng.params.layers[:layers]),
                                  _compiled={}, _costs={}, _seen={})
    ids = eng.encode(PROMPT)
    out = dict(layers=layers or eng.cfg.num_layers, load_s=time.perf_counter() - t0)
    gen = GenerateConfig(max_new_tokens=128)
    with tempfile.TemporaryDirectory() as trace_dir:
        ctx = jax.profiler.trace(trace_dir) if phases else None
        if ctx:
            ctx.__enter__()
        t = time.perf_counter()
        _, choice = eng.plan(gen, [len(ids)], [gen.max_new_tokens])
        out["plan_s"] = time.perf_counter() - t
        if ctx:
            ctx.__exit__(None, None, None)
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from startup import host_events
            out["phases"] = host_events(trace_dir, top=15)
    out.update(K=choice.K, measure_s=choice.measure_s, costs_ms=choice.costs.as_ms())
    return out


def run(layers: int, phases: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, JSPEC_CACHE_DIR=tmp, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, __file__, "--child", str(layers)] + ["--phases"] * phases
        t = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - t
    if p.returncode:
        return dict(layers=layers, error=(p.stderr.strip().splitlines() or ["?"])[-1][:300], wall_s=wall)
    return dict(json.loads(p.stdout.strip().splitlines()[-1]), wall_s=wall)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--phases", action="store_true", help="trace each plan with jax.profiler: its longest host events")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.phases)), flush=True)
        return
    rows = [run(n, args.phases) for n in (0, 2, 1)]  # 0: the target's full depth
    for r in rows:
        print({k: v for k, v in r.items() if k != "phases"}, flush=True)
        for event in r.get("phases", [])[:8]:
            print("   ", event)
    full, two, one = rows
    if not any("error" in r for r in rows):
        L = full["layers"]
        for n, t_full in full["costs_ms"]["verify"].items():
            t1, t2 = one["costs_ms"]["verify"][n], two["costs_ms"]["verify"][n]
            print(f"verify at {n}: full {t_full:.4f} ms, from 1 and 2 layers {t1 + (L - 1) * (t2 - t1):.4f} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
