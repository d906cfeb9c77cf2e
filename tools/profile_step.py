"""Where the time of an 8B-shaped decode step goes: a GPU kernel profile per step.

    PYTHONPATH=.:benchmarks python tools/profile_step.py --out $OUT/profile --cases bf16:1:8192,int2:1:8192

For each case (kv mode : batch : context) the step of benchmarks/decode.py is timed (median wall
time), traced with jax.profiler over a few steps, and its GPU kernels are summed by kind: the number
of kernels per step, their total duration, and the gap between the wall time and that sum (launch
and scheduling time the GPU sits idle). The compiled HLO of each step is written beside the JSON.
Note: XLA runs kernels one by one while a profile is active (no command buffers), so the profiled
wall time can exceed the untraced one; kernel durations are unaffected.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import time

import jax
import jax.numpy as jnp
from jax.profiler import ProfileData

from jspec.cache import kvcache
from jspec.model import decoder as model

from decode import LLAMA3_8B, kv_modes, make_step, weight_bytes  # noqa: E402  (benchmarks/ on PYTHONPATH)
from timing import median_time  # noqa: E402


def kernel_kind(name: str) -> str:
    """A kernel name without its instance numbers: 'loop_add_fusion_12' -> 'loop_add_fusion'."""
    return re.sub(r"(_\d+)+$|\.\d+$", "", name)


def gpu_kernels(trace_dir: str) -> list[tuple[str, float, float, dict]]:
    """(name, start_ns, duration_ns, stats) of every kernel event on the GPU planes of the trace."""
    path = sorted(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True))[-1]
    events = []
    for plane in ProfileData.from_file(path).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if "Stream" not in line.name:  # kernels and copies live on the stream lines
                continue
            events += [(ev.name, ev.start_ns, ev.duration_ns, dict(ev.stats)) for ev in line.events]
    return events


def profile_case(modes: dict, mode: str, B: int, ctx: int, out_dir: str, steps: int = 5) -> dict:
    cfg = LLAMA3_8B
    kv, impl, p = modes[mode]
    cache = kvcache.init_cache(cfg, kv, B, ctx + 64, jnp.bfloat16)
    cache = cache.replace(length=jnp.full((B,), ctx, jnp.int32))
    step = make_step(cfg, impl, options=model.compile_options())
    tok = jnp.zeros((B,), jnp.int32)
    name = f"{mode}_B{B}_{ctx}"
    with open(f"{out_dir}/{name}.hlo.txt", "w") as f:
        f.write(step.lower(p, cache, tok).compile().as_text())
    state = {"cache": cache, "tok": tok}

    def run():
        state["tok"], state["cache"] = step(p, state["cache"], state["tok"])
        return state["tok"]

    wall = median_time(run, iters=10)
    trace_dir = f"/tmp/trace_{name}"
    jax.profiler.start_trace(trace_dir)
    t0 = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(run())
    traced_wall = (time.perf_counter() - t0) / steps
    jax.profiler.stop_trace()
    events = gpu_kernels(trace_dir)
    busy = sum(e[2] for e in events) / steps * 1e-9
    kinds = _grouped(events, lambda e: kernel_kind(e[0]), steps)
    # per HLO instruction (the stats' hlo_op, named as in the .hlo.txt beside): which GEMM, which fusion
    ops = _grouped(events, lambda e: str(e[3].get("hlo_op", "?")), steps)[:OPS_KEPT]
    return dict(case=name, wall_ms=wall * 1e3, traced_wall_ms=traced_wall * 1e3,
                kernels_per_step=len(events) / steps, kernel_ms_per_step=busy * 1e3,
                stat_keys=sorted(events[0][3]) if events else [],
                kinds=[dict(kind=k, per_step=n, ms=ms) for k, n, ms in kinds],
                ops=[dict(op=k, per_step=n, ms=ms) for k, n, ms in ops])


OPS_KEPT = 80  # the HLO instructions kept in a profile, by time


def _grouped(events, key, steps: int) -> list[tuple[str, float, float]]:
    """(group, kernels per step, ms per step) of the events grouped by key, longest first."""
    groups = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        g = groups[key(e)]
        g[0] += 1
        g[1] += e[2]
    return sorted(((k, n / steps, d / steps * 1e-6) for k, (n, d) in groups.items()), key=lambda r: -r[2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/profile")
    ap.add_argument("--cases", default="bf16:1:8192,int2:1:8192")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    params = model.init_params(LLAMA3_8B, jax.random.key(0), dtype=jnp.bfloat16)
    modes = kv_modes(params, LLAMA3_8B)
    results = dict(xla_flags=os.environ.get("XLA_FLAGS", ""), weight_bytes=weight_bytes(params), cases=[])
    for case in args.cases.split(","):
        mode, B, ctx = case.split(":")
        r = profile_case(modes, mode, int(B), int(ctx), args.out)
        results["cases"].append(r)
        print(f"{r['case']}: wall {r['wall_ms']:.2f} ms (traced {r['traced_wall_ms']:.2f}), "
              f"{r['kernels_per_step']:.0f} kernels/step, kernel time {r['kernel_ms_per_step']:.2f} ms", flush=True)
        for k in r["kinds"][:25]:
            print(f"   {k['ms']:7.3f} ms  {k['per_step']:6.0f}x  {k['kind'][:110]}")
        with open(f"{args.out}/profile.json", "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
