"""Where a decode round's time goes: plain decoding, the EAGLE-3 head and the draft model on the shipped pair.

    PYTHONPATH=. python benchmarks/profile_round.py --out $OUT/profile_round/profile_round.json --hlo

Issue 19: on the H200 a head round at K = 4 costs about 4.3 plain steps where its kernel count predicts 1.24.
For each mode (batch 1, greedy, a fixed prompt, INT2 KV by default) the library's own program is built from
Engine.prepare's arguments as decode.generate_program, prefill and one lax.while_loop over rounds in one
program (Engine.compile on one device compiles the same work as two programs since session 11, the prefill
and the rounds: the rounds' kernels are the same), compiled once per variant, warmed up and timed untraced (median of --reps calls
of --new tokens). Then one call is traced with jax.profiler and read from the xplane's GPU stream lines:
kernels, kernel time and idle time per round, the kernel kinds by time, the memcpys (each trip of a while
loop copies its predicate to the host: one MemcpyD2H per round, more for loops inside a round), the stretch
between consecutive device-to-host copies (one loop trip, prefill excluded), and the largest gaps on the
device timeline with the events on both sides. The HLO of each round (the rounds loop's body, as executed)
is counted too, and with --hlo each program's text is written beside the JSON (<mode>_<variant>.hlo.txt.gz).

Variants (--variants, one compile each): "default" is the library's compile; "nocmdbuf" compiles with XLA's
command buffers (CUDA graphs) off, and "cmdbuf-traced" keeps them while profiling. XLA runs a program's
kernels one by one while a profile is active (xla_enable_command_buffers_during_profiling is off by default),
so a traced call can be slower than an untraced one; "nocmdbuf" times what the trace sees, untraced.

On a machine without GPU planes (CPU) the trace's host events are summarised instead. The JSON is rewritten
after every step; --budget-s stops starting new steps once spent.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from jax.profiler import ProfileData

import jspec
from jspec.config import GenerateConfig, KVConfig, SamplingConfig
from jspec.decode import loop as decode
from jspec.runtime import sharding

from head_round import PROMPT, _computations, executed  # noqa: E402  (benchmarks/ is on sys.path)
from profile_step import gpu_kernels, kernel_kind  # noqa: E402

# compiler_options per variant: a command buffer needs at least xla_gpu_graph_min_graph_size thunks in a row
VARIANTS = {
    "default": {},
    "nocmdbuf": {"xla_gpu_graph_min_graph_size": 1 << 30},
    "cmdbuf-traced": {"xla_enable_command_buffers_during_profiling": True},
}
COPY = re.compile(r"^(memcpy|memset)", re.IGNORECASE)  # CUPTI names copies MemcpyD2H, MemcpyH2D, MemcpyD2D, Memset
D2H = re.compile(r"D2H|DtoH", re.IGNORECASE)
INTERESTING_OPS = ("while", "conditional", "call", "custom-call", "copy", "copy-start", "copy-done", "scatter",
                   "gather", "dynamic-update-slice", "dynamic-slice", "sort", "send", "recv", "infeed", "outfeed")


# ------------------------------------------------------------------------------------------ building


def load_engines(a) -> dict:
    """{mode: (engine, K)}: plain and head share the head's engine (K = 0 drops the head)."""
    load = lambda draft: jspec.load(a.target, draft=draft, kv=KVConfig(a.kv), mesh=None)
    engs, modes = {}, a.modes.split(",")
    if "plain" in modes or "head" in modes:
        eng = load(a.head)
        engs.update({m: (eng, K) for m, K in (("plain", 0), ("head", a.k)) if m in modes})
    if "model" in modes:
        engs["model"] = (load(a.draft), a.k)
    return {m: engs[m] for m in modes}


def call_args(eng, K: int, new: int):
    """Fresh program arguments for one call (the caches are donated), ready on the device."""
    gen = GenerateConfig(max_new_tokens=new, lookahead=K, stop_at_eos=False)
    return jax.block_until_ready(eng.prepare([eng.encode(PROMPT)], [SamplingConfig()], [new], gen))


def compile_program(eng, args, options: dict):
    """decode.generate_program for these arguments (the one-program form of Engine.compile's two parts), with
    XLA compiler options."""
    with sharding.context(eng.mesh):
        return decode.generate_program.lower(*args).compile(compiler_options=options or None)


def run_call(program, eng, K: int, new: int) -> tuple[float, dict]:
    """(seconds, stats) of one decode call; the arguments are built and ready before the clock starts."""
    args = call_args(eng, K, new)
    t0 = time.perf_counter()
    state = jax.block_until_ready(program(*args))
    seconds = time.perf_counter() - t0
    count, rounds, accepted = (int(np.asarray(x)[0]) for x in (state.count, state.rounds, state.accepted))
    return seconds, dict(new_tokens=count, rounds=rounds, accepted=accepted)


def timing(program, eng, K: int, new: int, reps: int) -> dict:
    """Median of reps untraced calls after a warm-up call."""
    run_call(program, eng, K, new)
    runs = [run_call(program, eng, K, new) for _ in range(reps)]
    seconds = [s for s, _ in runs]
    st = runs[0][1]
    wall = statistics.median(seconds)
    rounds = max(st["rounds"], 1)
    return dict(wall_s=seconds, median_s=wall, tok_s=st["new_tokens"] / wall, **st,
                tokens_per_round=(st["new_tokens"] - 1) / rounds, accepted_per_round=st["accepted"] / rounds,
                ms_per_round=wall / rounds * 1e3)


# ------------------------------------------------------------------------------------------ the HLO


def rounds_loop(hlo: str) -> tuple[str, str] | None:
    """(body, condition) of the rounds loop: the while whose op_name is the program's own top-level while
    (decode._generate's; the prefill's and a round's inner loops have longer names). XLA:CPU may wrap it in a call."""
    top = re.compile(r'op_name="jit\([^)"]*\)/while"')
    found = None
    for line in hlo.splitlines():
        if " while(" in line and top.search(line):
            found = (re.search(r"body=%([\w.-]+)", line).group(1), re.search(r"condition=%([\w.-]+)", line).group(1))
    return found


def op_histogram(comps: dict, name: str, counts: collections.Counter, times: int = 1) -> collections.Counter:
    """Opcodes one run of computation `name` executes (custom calls by target), nested loops times their trips,
    every branch of a conditional once; fusions count as one op."""
    for op, rest in comps[name]:
        if op == "custom-call":
            op = "custom-call " + (re.search(r'custom_call_target="([^"]+)"', rest) or [None, "?"])[1]
        counts[op] += times
        sub = []
        if op == "while":
            m = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
            trips = int(m.group(1)) if m else 1
            sub = [(re.search(r"body=%([\w.-]+)", rest).group(1), trips),
                   (re.search(r"condition=%([\w.-]+)", rest).group(1), trips + 1)]
        elif op == "conditional":
            sub = [(b, 1) for b in re.findall(r"%([\w.-]+)", rest) if b in comps]
        elif op == "call":
            sub = [(re.search(r"to_apply=%([\w.-]+)", rest).group(1), 1)]
        for child, n in sub:
            op_histogram(comps, child, counts, times * n)
    return counts


def round_hlo(hlo: str) -> dict:
    """What one round executes, from the compiled program's text: head_round's counts and the notable opcodes."""
    comps = _computations(hlo)
    loop = rounds_loop(hlo)
    if loop is None:
        return dict(error="no rounds loop found")
    body, cond = loop
    counts = executed(hlo, root=body)
    cond_counts = executed(hlo, root=cond)
    ops = op_histogram(comps, body, collections.Counter())
    ops = op_histogram(comps, cond, ops)
    notable = {k: v for k, v in sorted(ops.items()) if k.split(" ")[0] in INTERESTING_OPS}
    return dict(body=body, condition=cond, body_counts=counts, condition_kernels=cond_counts["kernels"],
                notable_ops=notable, whiles_in_program=hlo.count(" while("), hlo_chars=len(hlo))


# ------------------------------------------------------------------------------------------ the trace


def trace_call(program, eng, K: int, new: int, trace_dir: str) -> tuple[float, dict]:
    """One decode call under jax.profiler (host Python tracer off): (wall seconds, stats)."""
    shutil.rmtree(trace_dir, ignore_errors=True)
    args = call_args(eng, K, new)
    jax.profiler.start_trace(trace_dir, profiler_options=_profile_options())
    try:
        t0 = time.perf_counter()
        state = jax.block_until_ready(program(*args))
        wall = time.perf_counter() - t0
    finally:
        jax.profiler.stop_trace()
    count, rounds, accepted = (int(np.asarray(x)[0]) for x in (state.count, state.rounds, state.accepted))
    return wall, dict(new_tokens=count, rounds=rounds, accepted=accepted)


def _profile_options():
    opts = jax.profiler.ProfileOptions()
    opts.python_tracer_level = 0  # no Python function events: the host lines show XLA and CUDA calls only
    return opts


def gpu_summary(events: list, wall: float, rounds: int, top: int) -> dict:
    """Per-round figures of the GPU stream events of one traced call (gpu_kernels' tuples)."""
    events = sorted(events, key=lambda e: e[1])
    r = max(rounds, 1)
    kernels = [e for e in events if not COPY.match(e[0])]
    copies = [e for e in events if COPY.match(e[0])]
    busy = sum(e[2] for e in kernels)
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    for name, _, dur, _ in events:
        k = by_kind[kernel_kind(name)]
        k[0] += 1
        k[1] += dur
    kinds = sorted(by_kind.items(), key=lambda kv: -kv[1][1])
    by_name = collections.defaultdict(lambda: [0, 0.0])  # the instance (HLO fusion name) behind a kind's time
    for name, _, dur, _ in kernels:
        by_name[name][0] += 1
        by_name[name][1] += dur
    names = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    span = (max(e[1] + e[2] for e in events) - events[0][1]) * 1e-9
    return dict(
        rounds=rounds, traced_wall_ms=wall * 1e3, device_span_ms=span * 1e3,
        kernels_per_round=len(kernels) / r, kernel_ms_per_round=busy * 1e-6 / r,
        idle_ms_per_round=(wall - busy * 1e-9) / r * 1e3, traced_ms_per_round=wall / r * 1e3,
        copies_per_round={k: n / r for k, n in sorted(collections.Counter(kernel_kind(e[0]) for e in copies).items())},
        copy_ms_per_round=sum(e[2] for e in copies) * 1e-6 / r,
        kinds=[dict(kind=k, per_round=n / r, us_per_round=d * 1e-3 / r, us_each=d * 1e-3 / n)
               for k, (n, d) in kinds[:top]],
        kernels=[dict(name=k, per_round=n / r, us_per_round=d * 1e-3 / r, us_each=d * 1e-3 / n)
                 for k, (n, d) in names[:top]],
        gaps=gaps(events, r), loop_trips=loop_trips(events),
        stat_keys=sorted(events[0][3]) if events else [],
    )


def gaps(events: list, r: int, largest: int = 10, pairs: int = 15) -> dict:
    """Idle stretches of the device timeline (events sorted by start, all streams merged): their sum, the largest
    ones with the events on both sides, and the sums by (kind before, kind after)."""
    t0, end, before = events[0][1], events[0][1] + events[0][2], events[0][0]
    found = []
    for name, start, dur, _ in events[1:]:
        if start > end:
            found.append((start - end, before, name, end - t0))
        if start + dur >= end:
            end, before = start + dur, name
    by_pair = collections.defaultdict(lambda: [0, 0.0])
    for g, b, a, _ in found:
        p = by_pair[(kernel_kind(b), kernel_kind(a))]
        p[0] += 1
        p[1] += g
    total = sum(g for g, *_ in found)
    return dict(
        sum_ms=total * 1e-6, us_per_round=total * 1e-3 / r, count_per_round=len(found) / r,
        largest=[dict(us=g * 1e-3, before=b, after=a, at_ms=at * 1e-6)
                 for g, b, a, at in sorted(found, key=lambda x: -x[0])[:largest]],
        by_pair=[dict(before=b, after=a, per_round=n / r, us_per_round=d * 1e-3 / r)
                 for (b, a), (n, d) in sorted(by_pair.items(), key=lambda kv: -kv[1][1])[:pairs]],
    )


def loop_trips(events: list) -> dict:
    """Stretches between consecutive device-to-host copies (a while loop's trip ends with one: its predicate):
    their count and the median duration, events and kernel time of one stretch. The prefill's few stretches
    and a loop inside a round's skew little of the median; with such inner loops a round is several stretches."""
    starts = [i for i, e in enumerate(events) if COPY.match(e[0]) and D2H.search(e[0])]
    if len(starts) < 3:
        return dict(d2h_copies=len(starts))
    spans = [(events[j][1] - events[i][1], j - i, sum(e[2] for e in events[i + 1:j] if not COPY.match(e[0])))
             for i, j in zip(starts, starts[1:])]
    med = lambda k: statistics.median(s[k] for s in spans)
    return dict(d2h_copies=len(starts), stretches=len(spans), median_us=med(0) * 1e-3, median_events=med(1),
                median_kernel_us=med(2) * 1e-3, max_us=max(s[0] for s in spans) * 1e-3,
                min_us=min(s[0] for s in spans) * 1e-3)


def host_summary(trace_dir: str, rounds: int, top: int = 20) -> dict:
    """The host planes' events by name (count and total time per round): the fallback where there are no GPU
    planes, and on a GPU where the host waits (stream synchronisation, predicate copies, launches). The device
    planes' lines are listed with their event counts."""
    path = sorted(Path(trace_dir).rglob("*.xplane.pb"))[-1]
    r, out = max(rounds, 1), {}
    for plane in ProfileData.from_file(str(path)).planes:
        if plane.name.startswith("/device:"):
            out[plane.name] = {line.name: sum(1 for _ in line.events) for line in plane.lines}
            continue
        by_name = collections.defaultdict(lambda: [0, 0.0])
        for line in plane.lines:
            for ev in line.events:
                k = by_name[kernel_kind(ev.name)]
                k[0] += 1
                k[1] += ev.duration_ns
        if by_name:
            rows = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
            out[plane.name] = [dict(name=n[:160], per_round=c / r, us_per_round=d * 1e-3 / r) for n, (c, d) in rows]
    return out


# ------------------------------------------------------------------------------------------ the run


def profile_variant(eng, K: int, variant: str, a, out_dir: Path, tag: str, rec: dict, over) -> None:
    """Compiles, times and traces one (mode, variant) into rec, step by step (a spent budget stops it)."""
    args = call_args(eng, K, a.new)
    t0 = time.perf_counter()
    program = compile_program(eng, args, VARIANTS[variant])
    rec["compile_s"] = time.perf_counter() - t0
    hlo = program.as_text()
    rec["hlo"] = round_hlo(hlo)
    if a.hlo:  # gzipped: a few MB of text each, mostly metadata
        with gzip.open(out_dir / f"{tag}.hlo.txt.gz", "wt") as f:
            f.write(hlo)
    del args, hlo
    if over("timing"):
        return
    rec["timing"] = timing(program, eng, K, a.new, a.reps)
    if over("trace") or a.no_trace:
        return
    trace_dir = os.path.join(a.trace_dir, tag)
    wall, st = trace_call(program, eng, K, a.new, trace_dir)
    rec["profile"] = dict(traced_wall_ms=wall * 1e3, rounds=st["rounds"],
                          traced_ms_per_round=wall / max(st["rounds"], 1) * 1e3)
    try:  # a trace without GPU planes (CPU) or without any xplane: what there is, and the timings
        events = gpu_kernels(trace_dir) if jax.default_backend() == "gpu" else []
        rec["profile"].update(gpu_summary(events, wall, st["rounds"], a.top) if events else
                              dict(note="no GPU kernel events in the trace"))
        rec["profile"]["host"] = host_summary(trace_dir, st["rounds"])
    except (IndexError, OSError, ValueError) as e:
        rec["profile"]["error"] = f"{type(e).__name__}: {e}"


def print_variant(tag: str, rec: dict) -> None:
    t, p = rec.get("timing"), rec.get("profile")
    line = f"{tag}: compile {rec.get('compile_s', 0):.1f} s, HLO round {rec.get('hlo', {}).get('body_counts')}"
    print(line, flush=True)
    if t:
        print(f"   untraced {t['tok_s']:.0f} tok/s, {t['rounds']} rounds, {t['tokens_per_round']:.2f} tok/round, "
              f"{t['ms_per_round']:.3f} ms/round", flush=True)
    if p and "kinds" in p:
        print(f"   traced {p['traced_ms_per_round']:.3f} ms/round: {p['kernels_per_round']:.0f} kernels "
              f"{p['kernel_ms_per_round']:.3f} ms, idle {p['idle_ms_per_round']:.3f} ms, "
              f"copies {p['copies_per_round']}", flush=True)
        lt = p["loop_trips"]
        if "median_us" in lt:  # one stretch between device-to-host copies: a loop trip
            print(f"   {lt['d2h_copies']} D2H copies; between two: median {lt['median_us']:.1f} us, "
                  f"{lt['median_events']:.0f} events, {lt['median_kernel_us']:.1f} us of kernels", flush=True)
        for k in p["kinds"][:15]:
            print(f"   {k['us_per_round']:8.1f} us {k['per_round']:6.1f}x  {k['kind'][:80]}")
        print("   the slowest kernels by name:")
        for k in p["kernels"][:10]:
            print(f"   {k['us_per_round']:8.1f} us {k['per_round']:6.1f}x  {k['us_each']:7.1f} us each  {k['name'][:70]}")
        g = p["gaps"]
        print(f"   gaps {g['us_per_round']:.1f} us/round ({g['count_per_round']:.1f} per round), "
              "by the kinds around them:")
        for x in g["by_pair"][:5]:
            print(f"   {x['us_per_round']:8.1f} us {x['per_round']:6.1f}x  {x['before'][:45]} -> {x['after'][:45]}")
        for x in g["largest"][:5]:
            print(f"   largest {x['us']:8.1f} us at {x['at_ms']:.2f} ms: {x['before'][:45]} -> {x['after'][:45]}")
    elif p:
        print(f"   traced {p['traced_ms_per_round']:.3f} ms/round, no GPU events {p.get('error', '')}", flush=True)
    for plane, rows in (p or {}).get("host", {}).items():
        if isinstance(rows, list):  # host planes: where the host spends a round (launches, waits)
            print(f"   {plane}: " + ", ".join(f"{h['name'][:40]} {h['per_round']:.1f}x {h['us_per_round']:.0f} us"
                                           for h in rows[:6]), flush=True)


def table(results: dict) -> str:
    """One row per (mode, variant); x plain = the round's cost in plain steps of the same variant."""
    head = (f"{'mode/variant':24} {'tok/s':>7} {'tok/rnd':>7} {'ms/rnd':>7} {'x plain':>7} {'traced':>7} "
            f"{'x plain':>7} {'kern/rnd':>8} {'kern ms':>7} {'idle ms':>7} {'D2H/rnd':>7} {'trip us':>7}")
    rows = [head]
    for tag, rec in results.items():
        mode, variant = tag.split("/")
        plain = results.get(f"plain/{variant}", {})
        t, p = rec.get("timing", {}), rec.get("profile", {})
        ratio = lambda x, y: f"{x / y:7.2f}" if x and y else f"{'':>7}"
        ms, pms = t.get("ms_per_round"), plain.get("timing", {}).get("ms_per_round")
        tr, ptr = p.get("traced_ms_per_round"), plain.get("profile", {}).get("traced_ms_per_round")
        d2h = sum(v for k, v in p.get("copies_per_round", {}).items() if D2H.search(k))
        fmt = lambda x, f: format(x, f) if x is not None else f"{'':>{f.split('.')[0]}}"
        rows.append(f"{tag:24} {fmt(t.get('tok_s'), '7.0f')} {fmt(t.get('tokens_per_round'), '7.2f')} "
                    f"{fmt(ms, '7.3f')} {ratio(ms, pms)} {fmt(tr, '7.3f')} {ratio(tr, ptr)} "
                    f"{fmt(p.get('kernels_per_round'), '8.0f')} {fmt(p.get('kernel_ms_per_round'), '7.3f')} "
                    f"{fmt(p.get('idle_ms_per_round'), '7.3f')} "
                    f"{fmt(d2h if p.get('copies_per_round') else None, '7.2f')} "
                    f"{fmt(p.get('loop_trips', {}).get('median_us'), '7.1f')}")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="checkpoints/code-target")
    ap.add_argument("--head", default="checkpoints/code-head")
    ap.add_argument("--draft", default="checkpoints/code-draft")
    ap.add_argument("--kv", default="int2", choices=("bf16", "int2"))
    ap.add_argument("--modes", default="plain,head,model", help="of plain, head, model")
    ap.add_argument("--variants", default="default", help=f"of {', '.join(VARIANTS)} (one compile each)")
    ap.add_argument("--k", type=int, default=4, help="lookahead of the head and the draft model")
    ap.add_argument("--new", type=int, default=256, help="tokens per decode call")
    ap.add_argument("--reps", type=int, default=3, help="untraced calls timed (median)")
    ap.add_argument("--top", type=int, default=25, help="kernel kinds listed per mode")
    ap.add_argument("--out", default="/tmp/profile_round/profile_round.json", help="JSON path")
    ap.add_argument("--hlo", action="store_true", help="write each program's compiled HLO beside the JSON (gzipped)")
    ap.add_argument("--no-trace", action="store_true", help="timings and HLO counts only")
    ap.add_argument("--trace-dir", default=os.path.join(tempfile.gettempdir(), "profile_round_traces"))
    ap.add_argument("--budget-s", type=float, default=110.0, help="no new step starts after this many seconds")
    a = ap.parse_args()
    start = time.perf_counter()
    out_path = Path(a.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    variants = a.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS] + [m for m in a.modes.split(",") if m not in
                                                             ("plain", "head", "model")]
    if unknown:
        ap.error(f"unknown modes/variants: {unknown}")
    out = dict(backend=jax.default_backend(), device=str(jax.devices()[0]), jax=jax.__version__,
               xla_flags=os.environ.get("XLA_FLAGS", ""), kv=a.kv, K=a.k, new=a.new, reps=a.reps, prompt=PROMPT,
               skipped=[], results={})

    def save():
        out["elapsed_s"] = time.perf_counter() - start
        out_path.write_text(json.dumps(out, indent=1))

    def over(step: str, tag: str = "") -> bool:
        save()
        if time.perf_counter() - start <= a.budget_s:
            return False
        out["skipped"].append(f"{tag} {step}".strip())
        return True

    engines = load_engines(a)
    out["load_s"] = time.perf_counter() - start
    for mode, (eng, K) in engines.items():
        for variant in variants:
            tag = f"{mode}/{variant}"
            if over("all", tag):
                continue
            rec = out["results"][tag] = dict(mode=mode, variant=variant, K=K, kv=eng.kv.mode,
                                             draft_mode=eng.draft_mode if K else "none",
                                             compiler_options=VARIANTS[variant])
            try:
                profile_variant(eng, K, variant, a, out_path.parent, tag.replace("/", "_"), rec,
                                lambda step: over(step, tag))
            finally:
                save()
            print_variant(tag, rec)
    print(f"\n{out['device']}, kv {a.kv}, K {a.k}, {a.new} tokens, batch 1, greedy ({out['elapsed_s']:.0f} s; "
          f"skipped: {out['skipped'] or 'nothing'}). ms/rnd untraced (x plain = the round in plain steps), "
          f"traced ms/rnd, kernels, kernel and idle ms per round, device-to-host copies per round, median loop trip:")
    print(table(out["results"]))


if __name__ == "__main__":
    main()
