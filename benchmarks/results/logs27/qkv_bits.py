# Session 27: model.qkv of one jspec tree on the CPU (float32 and bf16; 1, 5 and 40 rows) saved for a bit-for-bit
# comparison with another tree: python qkv_bits.py ROOT OUT.npz (run from the repository root), once per tree, then
# compare the two files with np.array_equal (done for HEAD 32fb762 in .before/prev against the new tree: identical).
import sys
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp, numpy as np
from jspec import model
from jspec.config import ModelConfig
print(model.__file__)
cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=64, num_layers=1,
                  num_heads=8, num_kv_heads=2, head_dim=16, rope_theta=10000.0)
out = {}
for dt in (jnp.float32, jnp.bfloat16):
    p = model.init_params(cfg, jax.random.key(1), dtype=dt, std=0.3)
    lp = p.layers[0]
    rot = jnp.linalg.qr(jax.random.normal(jax.random.key(2), (2, 16, 16)))[0].astype(jnp.float32)
    lp = lp.replace(rot_k=rot) if hasattr(lp, "replace") else lp._replace(rot_k=rot)
    for n in (1, 5, 40):
        h = jax.random.normal(jax.random.key(3), (1, n, 64), dt)
        pos = jnp.arange(n)[None] + 100
        q, k, v = jax.jit(lambda h, pos: model.qkv(lp, cfg, h, pos))(h, pos)
        out[f"{jnp.dtype(dt).name}_{n}"] = [np.asarray(x.astype(jnp.float32)) for x in (q, k, v)]
np.savez(sys.argv[2], **{f"{k}_{i}": a for k, v in out.items() for i, a in enumerate(v)})
