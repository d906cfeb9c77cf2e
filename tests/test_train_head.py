"""Head training (jspec/train_head.py): the training-time test computes what the decode loop's head computes,
the loss falls on a tiny target, and the draft vocabulary is the most frequent tokens.

The whole script (generation, training, evaluation, export) is checked by hand on the CPU with --small
against checkpoints/code-target (minutes of compiling: too slow for the suite); its export is the one
tests/test_head.py loads back.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig
from jspec.model import head, decoder as model
from jspec.train import train_head

CFG = ModelConfig("qwen3", 64, 32, 64, 4, 4, 2, 8, max_position=64, tie_embeddings=True, qk_norm=True)
T, TTT = 10, 3
# jitted, so that the test runs two small programs rather than hundreds of eager ops
_head_forward = jax.jit(head.forward, static_argnums=1)
_ttt_logits = jax.jit(train_head.ttt_logits, static_argnums=(1, 3, 5))


def _setup():
    target = model.init_params(CFG, jax.random.key(0), std=0.3)
    d2t = train_head.draft_vocabulary(np.arange(64)[None] % 48, 64, 40)
    hcfg = head.HeadConfig(head.layer_config(CFG, 2, 1, 48), 40, train_head.train_taps(CFG.num_layers))
    hp = train_head.init(hcfg, target, CFG, d2t, jax.random.key(1))
    hp = hp.replace(fc=hp.fc + 0.3 * jax.random.normal(jax.random.key(2), hp.fc.shape))  # not just the top tap
    seqs = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, T)), jnp.int32)
    return target, hcfg, hp, seqs


def test_ttt_unroll_is_what_the_decode_head_computes(f32_matmul):
    """Unroll k at root t == the head fed the target's pairs up to t (cached), then k steps on its own
    features at positions t + 1.., the tokens of the sequence as its inputs."""
    target, hcfg, hp, seqs = _setup()
    outs, _ = _ttt_logits(hp, hcfg, target, CFG, seqs, TTT)
    _, _, tapped = model.forward_taps(target, CFG, seqs, None, hcfg.taps)
    feats = head.fuse(hp, tapped)
    ids = np.arange(40) + np.asarray(hp.d2t)
    for t in (0, 5):
        cache = kvcache.init_cache(hcfg.layer, KVConfig("bf16"), 2, 16, jnp.float32)
        logits, h, (k, v) = _head_forward(hp, hcfg, target.embed, seqs[:, 1 : t + 2], feats[:, : t + 1], cache)
        cache = kvcache.commit(cache, k, v, jnp.full((2,), t + 1))
        h = h[:, -1:]
        for step in range(TTT):
            np.testing.assert_allclose(np.asarray(logits[:, -1])[:, ids], np.asarray(outs[step][:, t]), rtol=1e-4,
                                       atol=1e-4, err_msg=f"root {t}, unroll {step}")
            if step + 1 < TTT:
                logits, h, (k, v) = _head_forward(hp, hcfg, target.embed, seqs[:, t + step + 2 : t + step + 3], h,
                                                  cache)
                cache = kvcache.commit(cache, k, v, jnp.ones((2,), jnp.int32))


def test_training_lowers_the_loss():
    target, hcfg, hp, _ = _setup()
    seqs = jnp.asarray(np.random.default_rng(1).integers(0, 64, (8, 12)), jnp.int32)
    tx = optax.adamw(3e-3)
    opt = tx.init(hp.replace(d2t=None))
    step = train_head.make_step(hcfg, CFG, tx, 2)
    first = None
    for _ in range(20):
        hp, opt, loss, _ = step(hp, opt, target, seqs)
        first = float(loss) if first is None else first
    assert float(loss) < 0.8 * first, (first, float(loss))


def test_draft_vocabulary_is_the_most_frequent_tokens():
    seqs = np.array([[5, 5, 5, 9, 9, 2, 7, 7, 7, 7]])
    d2t = train_head.draft_vocabulary(seqs, 10, 3)
    np.testing.assert_array_equal(np.arange(3) + d2t, [5, 7, 9])
