"""Issue 14: where a second process's Engine.compile of the 8B + draft program goes when jspec's program store
holds it (prepared in session 19 for session 20; startup.py --engine measured 2.83 s against 1.54 s for JAX's
own cache hit in session 16).

    python store_probe.py --cache DIR write         # compiles through Engine.compile: the store and JAX's cache
    python store_probe.py --cache DIR engine        # a fresh process: Engine.compile as the CLI runs it
    python store_probe.py --cache DIR steps         # a fresh process: one part after the other, each step timed

steps times, per part: the file read, the executable's deserialization (inside pickle.loads), the rest of the
unpickling, and jax's load of it. --small: tiny shapes (a CPU check of the script; CPU has no store, so there the
parts are serialized and read back through a file here).
"""
import argparse, io, json, pickle, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import startup  # noqa: E402  benchmarks/startup.py

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["write", "engine", "steps"])
ap.add_argument("--cache", required=True)
ap.add_argument("--case", default="8b+draft")
ap.add_argument("--small", action="store_true")
a = ap.parse_args()

t0 = time.perf_counter()
import jax  # noqa: E402
from jax.experimental import serialize_executable as se  # noqa: E402

from jspec import engine, programs  # noqa: E402
from jspec.config import SamplingConfig  # noqa: E402

engine.use_compile_cache(a.cache)
eng, ids, gen = startup._build(a.case, a.small)
args = eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)
out = dict(mode=a.mode, setup_s=round(time.perf_counter() - t0, 2), store=str(programs.directory()))
here = Path(a.cache) / "probe"  # where the parts go when there is no store (CPU)
paths = ([programs.directory() / f"{programs.key(k)}{programs.SUFFIX}" for k in (("start", args), ("rounds", args))]
         if programs.directory() else [here / "start.program", here / "rounds.program"])
if a.mode == "write":
    run, out["compile_s"] = eng.compile(args)
    if programs.directory() is None:
        here.mkdir(exist_ok=True)
        for p, part in zip(paths, programs.compile_all(engine.lower_parts(args))):
            p.write_bytes(pickle.dumps(se.serialize(part)))
elif a.mode == "engine":
    run, out["compile_s"] = eng.compile(args)
else:
    backend = jax.devices()[0].client
    for name, p in zip(("start", "rounds"), paths):
        t = time.perf_counter()
        blob = p.read_bytes()
        out[f"{name}_bytes"], out[f"{name}_read_s"] = len(blob), round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        serialized, in_tree, out_tree = pickle.loads(blob)
        out[f"{name}_outer_unpickle_s"] = round(time.perf_counter() - t, 3)
        timed = {}

        class Unpickler(se._JaxPjrtUnpickler):
            def persistent_load(self, pid):
                t = time.perf_counter()
                x = super().persistent_load(pid)
                timed[pid[0]] = timed.get(pid[0], 0.0) + time.perf_counter() - t
                return x

        t = time.perf_counter()
        unloaded, args_info_flat, no_kwargs = Unpickler(io.BytesIO(serialized), backend).load()
        out[f"{name}_unpickle_s"] = round(time.perf_counter() - t, 3)
        out[f"{name}_deserialize_s"] = round(timed.get("exec", 0.0), 3)
        t = time.perf_counter()
        unloaded.load()
        out[f"{name}_load_s"] = round(time.perf_counter() - t, 3)
print(json.dumps(out), flush=True)
