"""Issue 14: does jspec's program store keep the shipped pair's programs on a GPU (session 19, call 3)?
startup.py --engine measured a second process's Engine.compile of the 8B + draft program at 2.83 s, about what
trace + lower + JAX's cache hit take: as if the store never held it. This compiles the README command's parts
in a new cache, serializes each as programs._keep does (printing any failure), lists the store, and times a
read back."""
import pickle, tempfile, time, traceback

import jax
from jax.experimental import serialize_executable

import jspec
from jspec import engine, programs
from jspec.config import GenerateConfig, SamplingConfig

engine.use_compile_cache(tempfile.mkdtemp())
eng = jspec.load()
gen = GenerateConfig(max_new_tokens=16, lookahead=4)
args = eng.prepare([eng.encode("def fibonacci(n):")], [SamplingConfig()], [16], gen)
_, s = eng.compile(args)
print("Engine.compile", round(s, 2), "s; store", programs.directory(), sorted(p.name for p in programs.directory().glob("*"))
      if programs.directory() and programs.directory().exists() else "absent")
for part in programs.compile_all(engine.lower_parts(args)):
    try:
        blob = pickle.dumps(serialize_executable.serialize(part))
        t = time.perf_counter()
        serialize_executable.deserialize_and_load(*pickle.loads(blob))
        print("serialized", len(blob), "bytes; read back in", round(time.perf_counter() - t, 3), "s")
    except Exception:  # noqa: BLE001
        print("serialize failed:", traceback.format_exc()[-1500:])
