"""Op counts of the 8B+draft K=4 program (startup.py's '8b+draft', abstract weights) under prototype changes,
applied as runtime patches (no jspec file edited):
  base            the tree as it is
  scan            lax.scan over the layers of every forward and every commit (target and draft, both parts)
  scan-draft      the same for the draft model only (its cache is the bf16 one)
  scan-prefill    scan in the start program (prefill) only; rounds as today
  scan-target     target only
Modes: 'cuda' = lowered for CUDA with the real GPU kernels, inlined StableHLO count;
       'cpu'  = kernels stubbed by host callbacks, compiled on the CPU, compiled-HLO instruction count.
usage: python variants.py MODE VARIANT..."""
import os, sys, time
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/tmp/h14")
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
import startup
from jspec import decode, engine, kvcache, model
from jspec.config import SamplingConfig
from jspec.pallas import int2_mosaic
import count_mlir, count_hlo

MODE = sys.argv[1]; VARIANTS = sys.argv[2:]
WHO = set()  # {"target", "draft"} scanned now

def _who(cache):
    return "target" if cache is not None and cache.kv.int2 else "draft"

_orig_taps, _orig_commit = model.forward_taps, kvcache.commit
stack = lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs)

def forward_taps(params, cfg, tokens, cache, taps, *, attn_impl="reference"):
    if taps or cache is None or _who(cache) not in WHO:
        return _orig_taps(params, cfg, tokens, cache, taps, attn_impl=attn_impl)
    B, n = tokens.shape
    length = cache.length
    pos = length[:, None] + jnp.arange(n)
    x = params.embed[tokens]
    rope = jax.lax.optimization_barrier(model.rope_tables(cfg, pos))
    def body(x, inp):
        lp, lc = inp
        x, k, v = model._block(lp, x, pos, rope, lc, length, cfg=cfg, kv=cache.kv, attn_impl=attn_impl)
        return x, (k, v)
    x, (ks, vs) = jax.lax.scan(body, x, (stack(params.layers), stack(cache.layers)))
    L = len(params.layers)
    x = model.rms_norm(x, params.norm, cfg.rms_eps)
    head = params.embed.T if params.lm_head is None else params.lm_head
    logits = model.einsum_f32("bne,ev->bnv", x, head)
    return logits, ([ks[i] for i in range(L)], [vs[i] for i in range(L)]), None

def commit(cache, new_k, new_v, n_commit):
    if _who(cache) not in WHO:
        return _orig_commit(cache, new_k, new_v, n_commit)
    first = cache.layers[0]
    S, W, T = first.pinned_slots, first.ring_slots, first.history_slots
    n = new_k[0].shape[1]
    pos = cache.length[:, None] + jnp.arange(n)
    end = cache.length + n_commit
    valid = pos < end[:, None]
    slot = jnp.where(valid & ((pos < S) | (pos >= end[:, None] - W)), first.slot(pos), S + W)
    hist = jnp.where(valid, pos, T)
    def body(_, inp):
        lc, k, v = inp
        return None, kvcache._commit_layer(lc, k, v, slot, hist, kv=cache.kv)
    _, layers = jax.lax.scan(body, None, (stack(cache.layers), jnp.stack(new_k), jnp.stack(new_v)))
    L = len(cache.layers)
    layers = tuple(jax.tree.map(lambda a: a[i], layers) for i in range(L))
    return cache.replace(layers=layers, length=end.astype(jnp.int32))

model.forward_taps = forward_taps
kvcache.commit = commit
decode.kvcache = kvcache  # decode calls kvcache.commit through the module: patched above

def _cb(out_type):
    leaves, tree = jax.tree.flatten(out_type)
    def call(*args):
        zeros = lambda *a: [np.zeros(t.shape, t.dtype) for t in leaves]
        return jax.tree.unflatten(tree, jax.pure_callback(zeros, leaves, *args))
    return call

engine._default_impl = lambda: "pallas"
eng, ids, gen = startup._build("8b+draft", False, abstract=True)
args = eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)
int2_mosaic.available = lambda: True
if MODE == "cpu":
    pl.pallas_call = lambda kernel, out_shape=None, **kw: _cb(out_shape)
    int2_mosaic.plgpu.kernel = lambda kernel, *, out_type, **kw: _cb(out_type)
real_backend = jax.default_backend
SETS = {"base": ({}, {}), "scan": ({"target", "draft"},) * 2, "scan-draft": ({"draft"},) * 2,
        "scan-target": ({"target"},) * 2, "scan-prefill": ({"target", "draft"}, set())}
for var in VARIANTS:
    who_start, who_rounds = SETS[var]; jax.clear_caches()
    jax.default_backend = lambda: "gpu"
    WHO.clear(); WHO.update(who_start)
    start = decode.start_program.trace(*args)
    WHO.clear(); WHO.update(who_rounds)
    rounds = decode.rounds_program.trace(args.models, args.sampler, args.max_new, args.eos_ids, start.out_info)
    res = {}
    for name, p in (("start", start), ("rounds", rounds)):
        if MODE == "cuda":
            txt = p.lower(lowering_platforms=("cuda",)).as_text(debug_info=True)
            path = f"/tmp/h14/{var}_{name}.mlir"; open(path, "w").write(txt)
            funcs = count_mlir.parse(path)
            import functools
            @functools.cache
            def total(fn): return sum(1 + (total(c) if c else 0) for _, _, c in funcs[fn])
            res[name] = total("main")
        else:
            jax.default_backend = real_backend
            t = time.time(); hlo = p.lower().compile().as_text()
            path = f"/tmp/h14/{var}_{name}.hlo.txt"; open(path, "w").write(hlo)
            res[name] = sum(" = " in l for l in hlo.splitlines())
            res[name + "_compile_s"] = round(time.time() - t, 1)
            res[name + "_toplevel"] = sum(1 for l in hlo.splitlines() if " fusion(" in l or " custom-call(" in l)
            jax.default_backend = lambda: "gpu"
    jax.default_backend = real_backend
    print(MODE, var, res, "total", res["start"] + res["rounds"], flush=True)
