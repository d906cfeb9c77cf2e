"""(A record of call 2, run on tree 552bb6c: kvcache.ALL_LAYERS_COMMIT and int2_commit.commit_int2_layers
were renamed after it; the all-layers kernel is now int2_commit.commit_int2 and the only fused form.)
Session 18, call 2: the pallas decode steps against the reference, per variant (as logs17/bisect.py), with
the all-layers commit (kvcache.ALL_LAYERS_COMMIT) added, and teacher-forced: every step from the reference's
cache, so errors do not compound (the form tests/test_int2_mosaic.py's decode-step test now takes)."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jspec import attention_split, kvcache, model
from jspec.config import KVConfig, ModelConfig

cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=256, intermediate_size=128, num_layers=2,
                  num_heads=8, num_kv_heads=2, head_dim=64, max_position=1024)
kv = KVConfig("int2", sink=4, recent=16)
params = model.init_params(cfg, jax.random.key(0), std=0.1)
rel = lambda a, b: float(np.linalg.norm(np.float64(a) - np.float64(b)) / np.linalg.norm(np.float64(b)))


def flags(fused_commit, fused_window, all_layers):
    kvcache.FUSED_COMMIT, attention_split.FUSED_WINDOW, kvcache.ALL_LAYERS_COMMIT = fused_commit, fused_window, all_layers
    kvcache._commit_layer.clear_cache()


def chunks(n):
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 300 + 4 * n)), jnp.int32)
    yield tokens[:, :300], jnp.full((2,), 300)
    for i in range(4):
        yield tokens[:, 300 + n * i: 300 + n * (i + 1)], jnp.asarray([n, 1])


def run(n, impl, fused_commit, fused_window, all_layers):
    flags(fused_commit, fused_window, all_layers)
    step = jax.jit(lambda c, t: model.forward(params, cfg, t, c, attn_impl=impl))
    cache, out = kvcache.init_cache(cfg, kv, 2, 400, jnp.float32), []
    for chunk, count in chunks(n):
        logits, (k, v) = step(cache, chunk)
        cache = kvcache.commit(cache, k, v, count)
        out.append(np.asarray(logits))
    return out


def forced(n, all_layers):
    """Per step: the pallas logits on the reference's cache, and the fused commit against the jnp one."""
    ref = jax.jit(lambda c, t: model.forward(params, cfg, t, c, attn_impl="reference"))
    pal = jax.jit(lambda c, t: model.forward(params, cfg, t, c, attn_impl="pallas"))
    cache, errs, commits = kvcache.init_cache(cfg, kv, 2, 400, jnp.float32), [], []
    for chunk, count in chunks(n):
        flags(None, None, all_layers)
        want, (k, v) = ref(cache, chunk)
        got, _ = pal(cache, chunk)
        errs.append(rel(got, want))
        fused = kvcache.commit(cache, k, v, count)
        flags(False, None, False)
        cache = kvcache.commit(cache, k, v, count)
        win = max(float(np.max(np.abs(np.asarray(getattr(f, x)) - np.asarray(getattr(w, x)))))
                  for f, w in zip(fused.layers, cache.layers) for x in ("k", "v"))
        codes = max(float(np.mean(np.asarray(f.codes) != np.asarray(w.codes))) for f, w in zip(fused.layers, cache.layers))
        qp = max(float(np.max(np.abs(np.float32(f.qparams) - np.float32(w.qparams)) / (np.abs(np.float32(w.qparams)) + 1e-6)))
                 for f, w in zip(fused.layers, cache.layers))
        commits.append(f"{win:.1g}/{qp:.1g}/{codes:.4f}")
    return errs, commits


for n in (1, 5):
    ref = run(n, "reference", False, False, False)
    for name, args in [("pallas", ("pallas", None, None, False)), ("all-layers", ("pallas", None, None, True)),
                       ("jnp commit", ("pallas", False, None, False)), ("xla window", ("pallas", None, False, False)),
                       ("triton, both off", ("triton", False, False, False))]:
        got = run(n, *args)
        print(n, name, "prefill", f"{rel(got[0], ref[0]):.2e}", "steps",
              " ".join(f"{rel(g, r):.2e}" for g, r in zip(got[1:], ref[1:])), flush=True)
    for all_layers in (False, True):
        errs, commits = forced(n, all_layers)
        print(n, "forced", "all-layers" if all_layers else "per-layer", "logits", " ".join(f"{e:.2e}" for e in errs),
              "commit win/qparams/codes", " ".join(commits), flush=True)
flags(None, None, False)
