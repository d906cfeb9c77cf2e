"""Session 17, call 4: where the pallas decode steps part from the reference (tests/test_int2_mosaic.py's
test_decode_steps_with_the_kernels_match_the_reference_forward): relative logit error per variant."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jspec import attention_split, kvcache, model
from jspec.config import KVConfig, ModelConfig

n = int(sys.argv[1])
cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=256, intermediate_size=128, num_layers=2,
                  num_heads=8, num_kv_heads=2, head_dim=64, max_position=1024)
kv = KVConfig("int2", sink=4, recent=16)
params = model.init_params(cfg, jax.random.key(0), std=0.1)
tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 300 + 4 * n)), jnp.int32)


def run(impl, fused_commit, fused_window, dtype=jnp.float32):
    kvcache.FUSED_COMMIT, attention_split.FUSED_WINDOW = fused_commit, fused_window
    step = jax.jit(lambda c, t: model.forward(params, cfg, t, c, attn_impl=impl))
    cache = kvcache.init_cache(cfg, kv, 2, 400, dtype)
    logits, (k, v) = step(cache, tokens[:, :300])
    cache, out = kvcache.commit(cache, k, v, jnp.full((2,), 300)), [np.asarray(logits[:, -1:])]
    for i in range(4):
        logits, (k, v) = step(cache, tokens[:, 300 + n * i: 300 + n * (i + 1)])
        cache = kvcache.commit(cache, k, v, jnp.asarray([n, 1]))
        out.append(np.asarray(logits))
    return out


rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
ref = run("reference", False, False)
for name, args in [("pallas", ("pallas", None, True)), ("jnp commit", ("pallas", False, True)),
                   ("xla window", ("pallas", None, False)), ("both off", ("pallas", False, False)),
                   ("triton, both off", ("triton", False, False))]:
    got = run(*args)
    print(n, name, "prefill", f"{rel(got[0], ref[0]):.2e}", "steps", " ".join(f"{rel(g, r):.2e}" for g, r in zip(got[1:], ref[1:])))
