"""The 8B+draft K=4 program's two parts traced along the GPU's code paths (default_backend patched to 'gpu'),
every Pallas/Mosaic kernel replaced by a host callback with the kernel's output shapes (one custom call, as
on the GPU), lowered and compiled for the CPU; compiled HLO text written to /tmp/h14/{start,rounds}.hlo.txt."""
import sys, time
sys.path.insert(0, "/work/main/benchmarks")
import jax, numpy as np
from jax.experimental import pallas as pl
import startup
from jspec import decode, engine
from jspec.config import SamplingConfig
from jspec.pallas import int2_mosaic

def _cb(out_type):
    leaves, tree = jax.tree.flatten(out_type)
    def call(*args):
        zeros = lambda *a: [np.zeros(t.shape, t.dtype) for t in leaves]
        return jax.tree.unflatten(tree, jax.pure_callback(zeros, leaves, *args))
    return call

def stub_pallas_call(kernel, out_shape=None, **kw):
    return _cb(out_shape)

def stub_kernel(kernel, *, out_type, **kw):
    return _cb(out_type)

engine._default_impl = lambda: "pallas"
# named scopes to tell the target's forward from the draft's in op_name metadata (runtime patch only)
_tf, _df = decode.Models.target_forward, decode.Models.draft_forward
def _scoped(f, name):
    def g(self, *a, **k):
        with jax.named_scope(name):
            return f(self, *a, **k)
    return g
decode.Models.target_forward = _scoped(_tf, "TGT")
decode.Models.draft_forward = _scoped(_df, "DRF")
eng, ids, gen = startup._build("8b+draft", False, abstract=True)
args = eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)
int2_mosaic.available = lambda: True
pl.pallas_call = stub_pallas_call
int2_mosaic.plgpu.kernel = stub_kernel
real_backend = jax.default_backend
jax.default_backend = lambda: "gpu"
parts = engine.trace_parts(args)
jax.default_backend = real_backend
only = sys.argv[1:] or ["start", "rounds"]
for name, p in zip(("start", "rounds"), parts):
    if name not in only: continue
    t = time.time()
    low = p.lower()
    txt = low.as_text(debug_info=True)
    open(f"/tmp/h14/{name}_cpu.mlir", "w").write(txt)
    print(name, "lowered", round(time.time() - t, 2), flush=True)
    t = time.time()
    c = low.compile()
    hlo = c.as_text()
    open(f"/tmp/h14/{name}.hlo.txt", "w").write(hlo)
    print(name, "compiled", round(time.time() - t, 1), "s; ' = ' lines", sum(" = " in l for l in hlo.splitlines()), flush=True)
