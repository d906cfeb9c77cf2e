"""Issue 14: where a second process's load of the 8B + draft program goes (session 19, call 1).

python load_probe.py --cache DIR --variant V   (run twice: the first compiles, the second is the cache hit)
Prints one JSON line: the parts' compile (side by side, as Engine.compile; --only: one part alone), the
distinct Mosaic GPU kernels in each part, the compile's host events, the prefill (start part) run time and the
rounds part's first and second run (the first traced). V: "default", "start-nocb" (the start part compiled without XLA command buffers)
or "all-nocb" (both parts without).
"""
import argparse, json, os, re, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import startup  # noqa: E402  benchmarks/startup.py

ap = argparse.ArgumentParser()
ap.add_argument("--cache", required=True)
ap.add_argument("--variant", default="default")
ap.add_argument("--case", default="8b+draft")
ap.add_argument("--only", choices=["start", "rounds"], help="compile this part alone (no runs): its own load")
ap.add_argument("--small", action="store_true", help="tiny shapes (a CPU check of this script)")
a = ap.parse_args()

import jax  # noqa: E402
from jspec import engine  # noqa: E402
from jspec.config import SamplingConfig  # noqa: E402

engine.use_compile_cache(a.cache)
eng, ids, gen = startup._build(a.case, a.small)
fresh = lambda: eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)  # donated
args = fresh()
lowered = [x.lower() for x in engine.trace_parts(args)]
mosaic = [len(set(re.findall(r'kernel_hash = "([^"]+)"', x.as_text()))) for x in lowered]
no_cb = {"xla_gpu_enable_command_buffer": ""}
opts = {"default": [None, None], "start-nocb": [no_cb, None], "all-nocb": [no_cb, no_cb]}[a.variant]
hits = []
jax.monitoring.register_event_listener(lambda event, **_: hits.append(event) if "cache_hits" in event else None)
out = dict(variant=a.variant, only=a.only, mosaic_kernels=mosaic)
if a.only:
    i = ("start", "rounds").index(a.only)
    lowered, opts = lowered[i:i + 1], opts[i:i + 1]
from jspec import programs  # noqa: E402
with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
        t = time.perf_counter()
        compiled = programs._side_by_side(lambda xo: xo[0].compile(compiler_options=xo[1]) if xo[1] else xo[0].compile(),
                                          list(zip(lowered, opts)))
        out["compile_s"] = round(time.perf_counter() - t, 3)
    out["phases"] = startup.host_events(trace_dir, top=40)
out["cache_hit"] = bool(hits)
if a.only:
    print(json.dumps(out), flush=True)
    sys.exit()
start, rounds = compiled
runs = []
for _ in range(4):
    args = jax.block_until_ready(fresh())
    t = time.perf_counter()
    state = jax.block_until_ready(start(*args))
    runs.append(round(time.perf_counter() - t, 4))
out["start_run_s"] = runs
run_rounds = lambda: jax.block_until_ready(rounds(args.models, args.sampler, args.max_new, args.eos_ids, state))
with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
        t = time.perf_counter()
        run_rounds()
        out["rounds_first_run_s"] = round(time.perf_counter() - t, 3)
    out["first_run_phases"] = [e for e in startup.host_events(trace_dir, top=40) if e[2] > 0.02]
state = jax.block_until_ready(start(*fresh()))
t = time.perf_counter()
run_rounds()
out["rounds_second_run_s"] = round(time.perf_counter() - t, 3)
print(json.dumps(out), flush=True)
