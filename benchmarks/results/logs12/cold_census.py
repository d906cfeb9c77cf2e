"""Where a cold README command's time goes, program by program (issue 14's 15 s goal).

Runs `python -m jspec.generate "def fibonacci(n):"` in a fresh process with new compilation and lookahead
caches and JAX_LOG_COMPILES=1, and sums JAX's own log lines per program: tracing, lowering (jaxpr to MLIR)
and XLA compile seconds, with the count of programs of each name (the 4 `<lambda>` are lookahead's cost
loops, compiled side by side: their seconds overlap), then a second (warm) run the same way.

    PYTHONPATH=. python benchmarks/results/logs12/cold_census.py [--out census.json] [--env K=V] [--cold-only]
        [generate's own options, e.g. --lookahead 2]
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

LINE = re.compile(r"Finished (tracing|jaxpr to MLIR module conversion|XLA compilation of) (\S+?)(?: for \S+)? in "
                  r"([0-9.e-]+) sec")


def run(tmp: str, extra_env: dict, extra_args: list) -> dict:
    env = dict(os.environ, JAX_LOG_COMPILES="1", JSPEC_CACHE_DIR=os.path.join(tmp, "jspec"), **extra_env)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "jspec.generate", "def fibonacci(n):", "--compile-cache",
                        os.path.join(tmp, "xla"), *extra_args], env=env, capture_output=True, text=True,
                       timeout=300)
    wall = time.perf_counter() - t
    phase = {"tracing": "trace_s", "jaxpr to MLIR module conversion": "lower_s",
             "XLA compilation of": "compile_s"}
    rows = collections.defaultdict(lambda: collections.Counter())
    for m in LINE.finditer(p.stderr):
        name = m[2].removeprefix("jit(").removesuffix(")")
        rows[name][phase[m[1]]] += float(m[3])
        rows[name]["programs"] += m[1] == "XLA compilation of"
    stats = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr.strip().splitlines()[-1]
    table = sorted(((k, {f: round(x, 3) for f, x in v.items()}) for k, v in rows.items()),
                   key=lambda kv: -kv[1].get("compile_s", 0))
    return dict(wall_s=round(wall, 2), returncode=p.returncode, stats=stats[-300:], programs=dict(table))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for both runs")
    ap.add_argument("--cold-only", action="store_true")
    args, extra = ap.parse_known_args()
    env = dict(e.split("=", 1) for e in args.env)
    with tempfile.TemporaryDirectory() as tmp:
        out = dict(cold=run(tmp, env, extra))
        if not args.cold_only:
            out["warm"] = run(tmp, env, extra)
    for name, r in out.items():
        print(name, r["wall_s"], "s", r["stats"])
        for prog, f in list(r["programs"].items())[:12]:
            print(f"  {prog:32s} {dict(f)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
