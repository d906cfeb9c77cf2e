"""Time to first token: import, load, trace, lower and compile per model shape, cold and warm (one GPU).

    PYTHONPATH=. python benchmarks/startup.py --out $OUT/startup.json           # GPU, about 4 minutes
    PYTHONPATH=. python benchmarks/startup.py --small --out /tmp/startup.json    # CPU check, tiny shapes

Every figure comes from a fresh process. Per case two processes share one new persistent compilation
cache directory: the first compiles (cold), the second finds the program there (warm, where compile_s
should be near 0). Each reports the import of jspec (and whether torch came with it), the load
(checkpoint read, or random weights made on the device and the Hadamard rotation folded in), trace
(jax.jit(...).trace), lower (to StableHLO), compile (XLA, or the cache hit) and one run of the program.
Cases: the shipped pair with the README command's shapes, and an 8B-shaped INT2 target alone and with
a 0.6B-shaped draft at K = 4 (random weights, 2K-token prompt, 256 new tokens). Then the README command
itself, `python -m jspec.generate "def fibonacci(n):"`, as a whole process: with a new compilation cache
directory and a new lookahead timing cache (cold: it times lookahead auto's costs, as on a new machine)
and again (warm), each with the programs it missed in the compilation cache. Then a job of 24 held-out
prompts with mixed max_new_tokens through the CLI: the programs it compiled against the capacity buckets
its batches fell in (told apart by the KV bytes of a batch). --small swaps the 8B shapes for tiny ones (a
CPU check of the script). --phases traces each case's compile with jax.profiler and keeps its longest host
events (XLA's passes, autotuning, LLVM and ptxas; a cache hit's deserialize and load) and what the events directly
inside XLA's one-thread IR emission (CompileModuleToLlvmIr) took. --engine compiles each
case through Engine.compile, the CLI's path: jspec's program store, read before any trace, so that compile_s
is what the CLI's stats report (no trace or lower figures then). Every process
inherits XLA_FLAGS (the result records it): set it around the script to A/B a flag.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
README = ["-m", "jspec.generate", "def fibonacci(n):"]
CASES = ("shipped", "8b", "8b+draft")


def child(case: str, cache_dir: str, small: bool, abstract: bool = False, phases: bool = False,
          one_program: bool = False, engine_path: bool = False, scan: bool = False, rerun: bool = False,
          xla_norms: bool = False, attn: str | None = None) -> dict:
    """One process's figures for one case (run as `startup.py --child CASE --cache DIR`). abstract: weights
    as shapes only (no load, no run): what a CPU can trace, lower and compile of the 8B shapes. phases: the
    compile (with engine_path, Engine.compile) traced with jax.profiler, and its longest host events (XLA's passes,
    autotuning, LLVM; a read from the store) kept.
    one_program: decode.generate_program, the prefill and rounds as one program (earlier), against
    the two parts compiled side by side that Engine.compile builds on one device. engine_path: compiled by
    Engine.compile itself (no trace or lower when jspec's program store holds the program: the CLI's compile_s).
    scan: each forward's layer loop rolled (Options.layer_unroll = 1: one layer's ops in the program). rerun: the
    program run a second time on fresh arguments (rerun_s: without the first run's one-time costs). xla_norms: the
    residual adds and norms in XLA (Options.fused_norms off), against their Pallas kernel. attn: the
    8B cases' attention path (engine.attn_impl: "triton" holds no Mosaic GPU kernel, which a new process builds)."""
    t0 = time.perf_counter()
    import jax

    import jspec  # noqa: F401  (the import being timed)
    from jspec.config import Options, SamplingConfig
    from jspec.decode import loop as decode
    from jspec.runtime import parts, programs
    from jspec.runtime.startup import compile_cache

    out = dict(case=case, import_s=time.perf_counter() - t0, torch_imported="torch" in sys.modules,
               transformers_imported="transformers" in sys.modules, device=str(jax.devices()[0]))
    compile_cache.use_compile_cache(cache_dir)
    options = Options(fused_norms=False if xla_norms else None, layer_unroll=1 if scan else True)
    t = time.perf_counter()
    eng, ids, gen = _build(case, small, abstract)
    eng = dataclasses.replace(eng, options=options, attn_impl=attn or eng.attn_impl)
    jax.block_until_ready((eng.params, eng.drafter))
    out["load_s"] = time.perf_counter() - t
    prepare = lambda: eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)
    args = prepare()
    again = prepare if rerun else None
    if engine_path:  # what the CLI's stats report as compile_s: from jspec's program store when it holds it
        with tempfile.TemporaryDirectory() as trace_dir:
            with jax.profiler.trace(trace_dir) if phases else contextlib.nullcontext():
                run, out["compile_s"] = eng.compile(args)
            if phases:
                out["phases"] = host_events(trace_dir)
        return _run_once(out, run, args, eng, len(ids[0]), again)
    t = time.perf_counter()
    if one_program:
        traced = [decode.generate_program.trace(*args)]
    else:  # Engine.compile's parts
        traced = parts.trace_parts(args)
    out["trace_s"] = time.perf_counter() - t
    t = time.perf_counter()
    lowered = [x.lower() for x in traced]
    out["lower_s"] = time.perf_counter() - t
    hits = []
    jax.monitoring.register_event_listener(lambda event, **_: hits.append(event) if "cache_hits" in event else None)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir) if phases else contextlib.nullcontext():
            t = time.perf_counter()
            compiled = programs.compile_all(lowered, [eng.xla_options] * len(lowered))  # side by side, as Engine.compile
            out["compile_s"] = time.perf_counter() - t
        if phases:
            out["phases"] = host_events(trace_dir)
            out["llvm_ir"] = children(trace_dir)
    out["cache_hit"] = bool(hits)
    out["programs"] = len(compiled)
    out["hlo_ops"] = sum(1 for c in compiled for line in c.as_text().splitlines() if " = " in line)
    if abstract:
        return out
    run = compiled[0] if one_program else parts.back_to_back(*compiled)
    return _run_once(out, run, args, eng, len(ids[0]), again)


def _run_once(out: dict, run, args, eng, prompt_tokens: int, again=None) -> dict:
    """out with one run of the compiled program (its first: one-time costs on the GPU included), and with again
    (a function making fresh arguments: the caches are donated) a second run, rerun_s."""
    import jax

    t = time.perf_counter()
    state = jax.block_until_ready(run(*args))
    out["run_s"] = time.perf_counter() - t
    if again is not None:
        args = again()
        t = time.perf_counter()
        jax.block_until_ready(run(*args))
        out["rerun_s"] = time.perf_counter() - t
    out.update(new_tokens=int(state.count.sum()), prompt_tokens=prompt_tokens, capacity=args.cache.capacity,
               lookahead=args.models.lookahead, kv=eng.kv.mode, attn=eng.attn_impl)
    return out


def host_events(trace_dir: str, top: int = 25) -> list:
    """[name, count, total seconds, longest seconds, threads, span seconds] of the longest host events of a
    jax.profiler trace, by name (nested events each count: a pass and its parent both appear; threads: how many
    host threads ran them; span: from the first's start to the last's end, less than the total where they
    overlapped); Python's own frames ('$file:line ...') left out."""
    from jax.profiler import ProfileData

    path = sorted(Path(trace_dir).rglob("*.xplane.pb"))[-1]
    total = {}
    for plane in ProfileData.from_file(str(path)).planes:
        if plane.name.startswith("/host"):
            for line in plane.lines:
                for ev in (ev for ev in line.events if not ev.name.startswith("$")):
                    n, s, longest, threads, a, b = total.get(ev.name, (0, 0.0, 0.0, set(), ev.start_ns, ev.end_ns))
                    d = ev.duration_ns / 1e9
                    total[ev.name] = (n + 1, s + d, max(longest, d), threads | {(plane.name, line.name)},
                                      min(a, ev.start_ns), max(b, ev.end_ns))
    rows = sorted(total.items(), key=lambda kv: -kv[1][1])[:top]
    return [[name, n, round(s, 3), round(longest, 3), len(threads), round((b - a) / 1e9, 3)]
            for name, (n, s, longest, threads, a, b) in rows]


def children(trace_dir: str, parent: str = "CompileModuleToLlvmIr", top: int = 15) -> list:
    """[name, count, total seconds] of the host events directly inside each `parent` event on its own thread (what
    XLA's one-thread IR emission spends its time on), and ["(self)", count, seconds] for the parent's time outside
    them."""
    from jax.profiler import ProfileData

    path = sorted(Path(trace_dir).rglob("*.xplane.pb"))[-1]
    total, own = {}, [0, 0.0]
    for plane in ProfileData.from_file(str(path)).planes:
        if not plane.name.startswith("/host"):
            continue
        for line in plane.lines:
            stack = []  # the open events enclosing the current one: [event, seconds of its direct children]
            for ev in sorted(line.events, key=lambda e: (e.start_ns, -e.duration_ns)):
                while stack and stack[-1][0].end_ns <= ev.start_ns:
                    done, inner = stack.pop()
                    if done.name == parent:
                        own[0] += 1
                        own[1] += done.duration_ns / 1e9 - inner
                if stack:
                    stack[-1][1] += ev.duration_ns / 1e9
                    if stack[-1][0].name == parent:
                        n, t = total.get(ev.name, (0, 0.0))
                        total[ev.name] = (n + 1, t + ev.duration_ns / 1e9)
                stack.append([ev, 0.0])
            for done, inner in stack:
                if done.name == parent:
                    own[0] += 1
                    own[1] += done.duration_ns / 1e9 - inner
    rows = sorted(total.items(), key=lambda kv: -kv[1][1])[:top]
    return [["(self)", own[0], round(own[1], 3)]] + [[name, n, round(t, 3)] for name, (n, t) in rows]


def _build(case: str, small: bool, abstract: bool = False):
    """(engine, prompt ids, GenerateConfig) of a case; abstract: the 8B weights as shapes only."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jspec
    from jspec.config import GenerateConfig, KVConfig
    from jspec.decode.state import Drafter, DraftMode
    from jspec.model import decoder as model, rotation
    from jspec.runtime import engine

    if case == "shipped":  # the README command's program
        eng = jspec.load()
        return eng, [eng.encode(README[-1])], GenerateConfig(max_new_tokens=128, lookahead=4)
    target, draft, prompt, new = _shapes(small)
    with_draft = case == "8b+draft"

    def weights(cfg, seed, rotate):  # random bf16 weights; R_K set and R_V folded in (Hadamard)
        p = model.init_params(cfg, jax.random.key(seed), dtype=jnp.bfloat16)
        return engine._apply_rotations(p, cfg, *rotation.hadamard_rotations(cfg)) if rotate else p

    make = (lambda *a: jax.eval_shape(lambda: weights(*a))) if abstract else weights
    params = make(target, 0, True)
    dparams = make(draft, 1, False) if with_draft else None
    drafter = Drafter(dparams, mode=DraftMode.MODEL, model_cfg=draft) if with_draft else Drafter()
    eng = engine.Engine(target, params, None, KVConfig("int2"), drafter, attn_impl=engine._default_impl())
    ids = np.random.default_rng(0).integers(0, target.vocab_size, prompt).tolist()
    return eng, [ids], GenerateConfig(max_new_tokens=new, lookahead=4)


def _shapes(small: bool):
    """(target, draft, prompt tokens, new tokens): Llama-3-8B and Qwen3-0.6B shapes, or tiny ones."""
    sys.path.insert(0, str(Path(__file__).parent))
    from decode import LLAMA3_8B
    from speculative import QWEN3_06B_SHAPE

    from jspec.config import ModelConfig

    if not small:
        return LLAMA3_8B, QWEN3_06B_SHAPE, 2048, 256
    target = ModelConfig("llama", 512, 128, 256, 4, 4, 2, 32, max_position=4096)
    return target, ModelConfig("qwen3", 512, 64, 128, 2, 2, 1, 32, qk_norm=True, max_position=4096), 300, 32


def run_child(case: str, cache_dir: Path, args, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--child", case, "--cache", str(cache_dir)]
    cmd += ["--small"] * args.small + ["--abstract"] * args.abstract + ["--phases"] * args.phases
    cmd += ["--one-program"] * args.one_program + ["--engine"] * args.engine + ["--scan-layers"] * args.scan_layers
    cmd += ["--rerun"] * args.rerun + ["--xla-norms"] * args.xla_norms
    cmd += [f"--attn={args.attn}"] * bool(args.attn)
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if p.returncode:
        return dict(case=case, error=(p.stderr.strip().splitlines() or ["?"])[-1][:300], wall_s=wall)
    return dict(json.loads(p.stdout.strip().splitlines()[-1]), wall_s=wall)


def run_readme(cache_dir: Path, timeout: float) -> dict:
    """The README command as a whole process, with its compilation cache and lookahead timings under
    cache_dir; its stats line gives compile and decode time and the seconds lookahead auto spent getting its
    costs, the entries it added to JAX's cache the programs it missed there (JAX_EXPLAIN_CACHE_MISSES made
    the command fail on the H200 under jax 0.11.2)."""
    env = dict(_env(), JSPEC_CACHE_DIR=str(cache_dir / "jspec"))
    entries = lambda: set((cache_dir / "xla").glob("*-cache"))
    before = entries()
    t = time.perf_counter()
    p = subprocess.run([sys.executable, *README, "--compile-cache", str(cache_dir / "xla")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    out = dict(wall_s=time.perf_counter() - t, returncode=p.returncode,
               cache_misses=sorted(e.name.split("-")[0] for e in entries() - before))
    stats = re.search(r"compile ([\d.]+)s, decode ([\d.]+)s", p.stdout)
    if stats:
        out.update(compile_s=float(stats[1]), decode_s=float(stats[2]))
        timed = re.search(r"costs timed in ([\d.]+)s", p.stdout)  # lookahead auto's first measurement
        out["lookahead_measure_s"] = float(timed[1]) if timed else 0.0
    else:
        out["error"] = (p.stderr.strip().splitlines() or ["?"])[-1][:300]
    return out


def run_job(tmp: Path, timeout: float, n: int = 24) -> dict:
    """A batch job of n held-out prompts, each with its own max_new_tokens, through the CLI in a fresh process
    with a new compilation cache and lookahead timing cache: how many programs it compiled against how many
    capacity buckets its batches fell in (one program per bucket and lookahead), and the seconds lookahead
    auto spent measuring costs."""
    sys.path.insert(0, str(Path(__file__).parent))
    from speculative import held_out_prompts

    from jspec.io.tokenizer import load_tokenizer

    tok = load_tokenizer(ROOT / "checkpoints" / "code-target")
    rng = np.random.default_rng(0)
    lines = [json.dumps(dict(id=i, prompt=p, max_new_tokens=int(rng.choice([16, 40, 64, 100, 128]))))
             for i, p in enumerate(held_out_prompts(tok, n))]
    src, dst = tmp / "job.jsonl", tmp / "job.out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "jspec.generate", "--input", str(src), "--output", str(dst), "--batch-size", "8",
           "--compile-cache", str(tmp / "job-cache")]
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=dict(_env(), JSPEC_CACHE_DIR=str(tmp / "job-jspec")), capture_output=True,
                       text=True, timeout=timeout)
    out = dict(wall_s=time.perf_counter() - t, returncode=p.returncode, prompts=n)
    if p.returncode:
        return dict(out, error=(p.stderr.strip().splitlines() or ["?"])[-1][:300])
    stats = [json.loads(line)["stats"] for line in dst.read_text().splitlines()]
    batches = {(s["compile_s"], s["decode_s"], s["batch_kv_bytes"], s["lookahead"],
                s.get("lookahead_auto", {}).get("measure_s", 0.0)) for s in stats}
    return dict(out, batches=len(batches), compiles=sum(c > 0 for c, *_ in batches),
                buckets=len({kv for _, _, kv, *_ in batches}), lookaheads=sorted({b[3] for b in batches}),
                compile_s=round(sum(c for c, *_ in batches), 2), decode_s=round(sum(b[1] for b in batches), 2),
                lookahead_measure_s=round(sum(b[4] for b in batches), 2))


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def table(result: dict) -> str:
    rows = ["| case | process | import s | torch | load s | trace s | lower s | compile s | run s | rerun s "
            "| wall s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["cases"]:
        if "error" in r:
            rows.append(f"| {r['case']} | {r['process']} | error: {r['error']} |")
            continue
        f = lambda k: f"{r[k]:.2f}" if k in r else "-"
        rows.append(f"| {r['case']} | {r['process']} | {f('import_s')} | {'yes' if r['torch_imported'] else 'no'} | "
                    f"{f('load_s')} | {f('trace_s')} | {f('lower_s')} | {f('compile_s')} | {f('run_s')} | "
                    f"{f('rerun_s')} | {f('wall_s')} |")
    for name, r in result["readme"].items():
        detail = (f"compile {r['compile_s']:.2f} s, decode {r['decode_s']:.2f} s, lookahead's costs "
                  f"{r['lookahead_measure_s']:.2f} s" if "compile_s" in r else r["error"])
        detail += f", {len(r.get('cache_misses', []))} cache misses"
        rows.append(f"| README command | {name} | {detail} | | | | | | | | {r['wall_s']:.2f} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(default_out("startup.json")), help="JSON path (default: a scratch folder)")
    ap.add_argument("--small", action="store_true", help="tiny shapes instead of the 8B ones (CPU check)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--budget", type=float, default=330, help="seconds; later steps are skipped past it")
    ap.add_argument("--abstract", action="store_true",
                    help="8B cases with weights as shapes only: trace, lower and compile, no load or run (a CPU "
                         "proxy for compile time)")
    ap.add_argument("--no-readme", action="store_true", help="skip the README command")
    ap.add_argument("--no-job", action="store_true", help="skip the 24-prompt job")
    ap.add_argument("--phases", action="store_true", help="trace each compile (a cache hit too, and with --engine "
                    "Engine.compile, a read from jspec's store): its longest host events")
    ap.add_argument("--one-program", action="store_true", help="the cases' prefill and rounds compiled as one "
                    "program (decode.generate_program, as before), not as Engine.compile's two parts")
    ap.add_argument("--engine", action="store_true", help="the cases compiled by Engine.compile (jspec's program "
                    "store, then JAX's cache: what the CLI's stats report as compile_s), not trace, lower and compile")
    ap.add_argument("--scan-layers", action="store_true", help="the cases' layer loops rolled (Options.layer_unroll "
                    "= 1: one layer's ops in each program), not unrolled")
    ap.add_argument("--rerun", action="store_true", help="the 8B cases' program run twice, the second on fresh "
                    "arguments (rerun s: without the first run's one-time costs; its time counts in wall s)")
    ap.add_argument("--xla-norms", action="store_true", help="the 8B cases' residual adds and norms in XLA "
                    "(Options.fused_norms off), to time their Pallas kernel's compiles (kernels/add_norm.py)")
    ap.add_argument("--attn", choices=("pallas", "mosaic", "triton"), help="the 8B cases' attention path (default: "
                    "the engine's, pallas: Mosaic GPU on Hopper)")
    ap.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.small, args.abstract, args.phases, args.one_program,
                              args.engine, args.scan_layers, args.rerun, args.xla_norms, args.attn)),
              flush=True)
        return
    start = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - start)
    result = dict(small=args.small, abstract=args.abstract, one_program=args.one_program, scan_layers=args.scan_layers,
                  rerun=args.rerun, xla_norms=args.xla_norms,
                  xla_flags=os.environ.get("XLA_FLAGS", ""), cases=[], readme={})
    with tempfile.TemporaryDirectory(prefix="jspec-startup-") as tmp:
        for name in ("cold", "warm"):  # first: the figure users see
            if left() > 0 and not args.no_readme:
                result["readme"][name] = run_readme(Path(tmp) / "readme", max(left(), 1))
                print(name, "README command:", result["readme"][name], flush=True)
                save(args.out, result)
        if left() > 0 and not (args.no_readme or args.no_job):
            result["job"] = run_job(Path(tmp), max(left(), 1))
            print("job:", result["job"], flush=True)
            save(args.out, result)
        for case in args.cases.split(","):
            for process in ("cold", "warm"):
                if left() <= 0:
                    result.setdefault("skipped", []).append(f"{case} {process}")
                    continue
                try:
                    r = run_child(case, Path(tmp) / case, args, max(left(), 1))
                except subprocess.TimeoutExpired:
                    r = dict(case=case, error="timed out (budget)", wall_s=left())
                result["cases"].append(dict(r, process=process))
                print(result["cases"][-1], flush=True)
                save(args.out, result)
    print(table(result))


def save(path, result):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
