"""(A record of call 2, run on tree 552bb6c: kvcache.ALL_LAYERS_COMMIT and int2_commit.commit_int2_layers
were renamed after it; the all-layers kernel is now int2_commit.commit_int2 and the only fused form.)
Session 18, call 2: is an all-layers INT2 commit right compiled, in the cases the model gives it?

Call 1 (logs18/call1.txt) ran logs17/commit_probe.py on the H200: its three all-layers forms equalled
commit_layer at 1-3 layers, bf16 windows, 5 rows per batch row. Session 17's bisection (logs17/call4) saw the
first form go wrong in a float32 model, whose prefill commits 300 rows. Here kvcache.commit itself runs on random
caches of L = 1, 2, 3 layers, float32 and bf16, 5 and 300 new rows, and each form is compared with the jnp commit
(FUSED_COMMIT False) as tests/test_int2_commit.py's GPU test does (windows exact, scales to a rounding, codes
equal but at rounding boundaries):
  per-layer   the default: one commit_int2 kernel per layer (the control)
  library     int2_commit.commit_int2_layers (grid (2 L, B n, H)), through kvcache.ALL_LAYERS_COMMIT
  shared5, shared3, branch5   logs17/commit_probe.py's forms, in place of commit_int2_layers
On the CPU (interpret mode) every line must print ok: `PYTHONPATH=. python commit_probe.py`.
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "logs17"))
import commit_probe as probe17  # noqa: E402

from jspec import kvcache  # noqa: E402
from jspec.config import KVConfig, ModelConfig  # noqa: E402

LIBRARY = kvcache.commit_int2_layers


def case(seed, L, n, dtype):
    rng = np.random.default_rng(seed)
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=128, intermediate_size=128, num_layers=L,
                      num_heads=4, num_kv_heads=2, head_dim=64, max_position=1024)
    kv = KVConfig("int2", sink=4, recent=16)
    cache = kvcache.init_cache(cfg, kv, 2, 400, dtype)
    rand = lambda x: jnp.asarray(rng.integers(0, 256, x.shape) if x.dtype == jnp.uint8 else rng.normal(size=x.shape),
                                 x.dtype)
    cache = cache.replace(layers=jax.tree.map(rand, cache.layers), length=jnp.asarray([0, 9], jnp.int32))
    new = lambda: tuple(jnp.asarray(rng.normal(size=(2, n, 2, 64)), dtype) for _ in range(L))
    return cache, new(), new(), jnp.asarray([n, max(1, n - 3)], jnp.int32), kv


def compare(got, want):
    win = max(float(np.max(np.abs(np.asarray(getattr(g, x), np.float32) - np.asarray(getattr(w, x), np.float32))))
              for g, w in zip(got.layers, want.layers) for x in ("k", "v"))
    qp = max(float(np.max(np.abs(np.asarray(g.qparams, np.float32) - np.asarray(w.qparams, np.float32))
                          / (np.abs(np.asarray(w.qparams, np.float32)) + 1e-6))) for g, w in zip(got.layers, want.layers))
    codes = max(float(np.mean(np.asarray(g.codes) != np.asarray(w.codes))) for g, w in zip(got.layers, want.layers))
    ok = win == 0 and qp <= 2.0**-7 and codes < 0.01
    return f"window max diff {win:.3g}, qparams rel {qp:.3g}, codes differing {codes:.4f}: {'ok' if ok else 'WRONG'}"


def run(cache, k, v, n_commit, fused, all_layers, form):
    kvcache.FUSED_COMMIT, kvcache.ALL_LAYERS_COMMIT = fused, all_layers
    kvcache.commit_int2_layers = form
    kvcache._commit_layer.clear_cache()
    try:
        return jax.block_until_ready(kvcache.commit(cache, k, v, n_commit))
    finally:
        kvcache.FUSED_COMMIT, kvcache.ALL_LAYERS_COMMIT, kvcache.commit_int2_layers = None, False, LIBRARY


def main():
    interpret = jax.default_backend() != "gpu"
    forms = [("per-layer", False, LIBRARY), ("library", True, LIBRARY)] + [
        (name, True, functools.partial(probe17.commit_all, variant=name)) for name in ("shared5", "shared3", "branch5")]
    for dtype in (jnp.float32, jnp.bfloat16):
        for n in (5, 300):
            for L in (1, 2, 3):
                cache, k, v, n_commit, kv = case(L + n, L, n, dtype)
                want = run(cache, k, v, n_commit, False, False, LIBRARY)
                for name, all_layers, form in forms:
                    got = run(cache, k, v, n_commit, True, all_layers, form)
                    print(f"{jnp.dtype(dtype).name} n {n} L {L} {name}: {compare(got, want)}", flush=True)
    print("interpret mode" if interpret else "compiled")


if __name__ == "__main__":
    main()
