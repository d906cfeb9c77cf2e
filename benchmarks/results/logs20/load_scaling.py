"""Issue 14, prepared in session 20 for session 21: does a second process's load of the 8B + draft program scale
with its layer count? If it does, the scan over layers (each part's layer stack traced once) is the way to the 1 s
goal; if a large part is fixed, it is not. The 8B-shaped INT2 target with L layers and the 0.6B-shaped draft with
round(28 L / 32), K = 4, as startup.py's 8b+draft otherwise.

    python load_scaling.py --cache DIR --layers 8 write   # compiles through Engine.compile (jspec's store)
    python load_scaling.py --cache DIR --layers 8 read    # a fresh process: Engine.compile finds both parts there

--small: tiny shapes (a CPU check of the script; the CPU keeps no store, so there both modes compile).
"""
import argparse, dataclasses, json, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import startup  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["write", "read"])
ap.add_argument("--cache", required=True)
ap.add_argument("--layers", type=int, required=True)
ap.add_argument("--small", action="store_true")
a = ap.parse_args()

t0 = time.perf_counter()
from jspec import engine, programs  # noqa: E402
from jspec.config import SamplingConfig  # noqa: E402

engine.use_compile_cache(a.cache)
target, draft, prompt, new = startup._shapes(a.small)
target = dataclasses.replace(target, num_layers=a.layers)
draft = dataclasses.replace(draft, num_layers=max(1, round(draft.num_layers * a.layers / 32)))
startup._shapes = lambda small: (target, draft, prompt, new)  # _build reads the shapes from here
eng, ids, gen = startup._build("8b+draft", a.small)
args = eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)
setup = time.perf_counter() - t0
run, compile_s = eng.compile(args)
where = programs.directory()
parts = [where / f"{programs.key(k)}{programs.SUFFIX}" for k in (("start", args), ("rounds", args))] if where else []
sizes = [p.stat().st_size for p in parts if p.exists()]
print(json.dumps(dict(mode=a.mode, layers=a.layers, draft_layers=draft.num_layers, setup_s=round(setup, 2),
                      compile_s=round(compile_s, 3), store_MB=round(sum(sizes) / 1e6, 2))), flush=True)
