"""Lower the 8B+draft K=4 program (startup.py's '8b+draft', abstract weights) for CUDA on the CPU, as
engine.compile's two parts (start, rounds), with the GPU's attention path; write StableHLO with debug info."""
import sys, time
sys.path.insert(0, "/work/main/benchmarks")
import jax
import startup
from jspec import decode, engine, kvcache
from jspec.config import SamplingConfig
from jspec.pallas import int2_mosaic

engine._default_impl = lambda: "pallas"
eng, ids, gen = startup._build("8b+draft", False, abstract=True)
args = eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)
print("capacity", args.cache.capacity, "K", args.models.lookahead, "attn", args.models.attn_impl, "prompts", args.prompts.shape)
int2_mosaic.available = lambda: True
jax.default_backend = lambda: "gpu"
t = time.time()
parts = engine.trace_parts(args)
print("trace", time.time() - t)
for name, p in zip(("start", "rounds"), parts):
    t = time.time()
    low = p.lower(lowering_platforms=("cuda",))
    txt = low.as_text(debug_info=True)
    open(f"/tmp/h14/{name}.mlir", "w").write(txt)
    print(name, "lower", round(time.time() - t, 2), "chars", len(txt))
