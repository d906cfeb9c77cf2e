"""Issue 14, session 25: where the lowering of the 8B + draft program's parts goes, on any host. The GPU paths are
traced (jax.default_backend patched to "gpu", the Mosaic kernel taken as available) and each part is lowered for
CUDA; every Pallas Triton kernel's lowering is timed.

    PYTHONPATH=. python benchmarks/results/logs25/lower_probe.py [G]   # G: kvcache.COMMIT_GROUP (0: None)
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # benchmarks/
import jax

jax.default_backend = lambda: "gpu"
from jax._src.pallas.triton import lowering  # noqa: E402

from jspec.pallas import int2_mosaic  # noqa: E402

int2_mosaic.available = lambda: True
lower_kernel = lowering.lower_jaxpr_to_triton_module


def timed(jaxpr, *args, **params):
    t = time.perf_counter()
    out = lower_kernel(jaxpr, *args, **params)
    print(f"  Pallas Triton kernel {jaxpr.debug_info.func_name}: lowered in {time.perf_counter() - t:.3f} s")
    return out


lowering.lower_jaxpr_to_triton_module = timed
import startup  # noqa: E402

from jspec import engine, kvcache  # noqa: E402
from jspec.config import SamplingConfig  # noqa: E402

kvcache.COMMIT_GROUP = int(sys.argv[1]) or None if len(sys.argv) > 1 else None
eng, ids, gen = startup._build("8b+draft", small=False, abstract=True)
args = eng.prepare(ids, [SamplingConfig()], [gen.max_new_tokens], gen)
t = time.perf_counter()
parts = engine.trace_parts(args)
print(f"COMMIT_GROUP {kvcache.COMMIT_GROUP}: traced in {time.perf_counter() - t:.2f} s")
for name, part in zip(engine.part_names(args.models), parts):
    t = time.perf_counter()
    part.lower(lowering_platforms=("cuda",))
    print(f"{name} lowered in {time.perf_counter() - t:.2f} s")
