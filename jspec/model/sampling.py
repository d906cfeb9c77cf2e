"""Per-row sampling parameters and the warp from logits to the distribution a token is drawn from.

Temperature 0 is greedy: the warped distribution is the one-hot of the argmax, so the speculative
acceptance rule needs no special case (p/q is 1 or 0) and greedy output is exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jspec import struct


@struct.dataclass
class Sampler:
    temperature: jax.Array  # [B] f32; 0 = greedy
    top_k: jax.Array  # [B] int32; 0 = off
    top_p: jax.Array  # [B] f32; 1 = off
    greedy: bool = struct.field(pytree_node=False, default=False)  # every row greedy: argmax only

    @classmethod
    def make(cls, batch: int, temperature=0.0, top_k=0, top_p=1.0) -> "Sampler":
        # made on the host and put on the device: jnp.asarray of a numpy array runs a program (lax.stage)
        full = lambda x, dt: jax.device_put(np.broadcast_to(np.asarray(x, dt), (batch,)))
        t = full(temperature, jnp.float32)
        greedy = bool(np.all(np.asarray(temperature) == 0))  # host values: no device round trip
        return cls(t, full(top_k, jnp.int32), full(top_p, jnp.float32), greedy)


def _rows(x, logits):
    """Broadcasts a per-row [B] parameter against logits [B, ..., V]."""
    return x.reshape(x.shape + (1,) * (logits.ndim - 1))


def warp(logits, s: Sampler):
    """logits [B, ..., V] f32 -> probabilities [B, ..., V] after temperature, top-k and top-p."""
    greedy = jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=jnp.float32)
    if s.greedy:
        return greedy
    t = _rows(s.temperature, logits)
    x = logits / jnp.where(t > 0, t, 1.0)
    desc = -jnp.sort(-x, axis=-1)  # [B, ..., V] descending
    k = _rows(s.top_k, logits)
    kth = jnp.take_along_axis(desc, jnp.clip(k - 1, 0, x.shape[-1] - 1), axis=-1)
    x = jnp.where((k > 0) & (x < kth), -jnp.inf, x)
    desc = jnp.where((k > 0) & (desc < kth), -jnp.inf, desc)
    # top-p: keep the smallest prefix of the sorted distribution whose mass reaches p. The cut is a
    # logit, not a probability: a softmax in sorted order and one in vocabulary order differ in the
    # last ulp, and comparing those could drop the boundary token (or every token: 0/0 = NaN).
    sorted_p = jax.nn.softmax(desc, axis=-1)
    before = jnp.cumsum(sorted_p, axis=-1) - sorted_p  # mass strictly above each sorted entry
    top_p = _rows(s.top_p, logits)
    # top_p = 1 is off, whatever the rounding of cumsum; the top token is always kept, even for a top_p
    # that float32 flushes to 0 (else nothing would be kept and every logit would be cut)
    first = jnp.arange(desc.shape[-1]) == 0
    keep = (before < top_p) | (top_p >= 1) | first
    cut = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
    probs = jax.nn.softmax(jnp.where(x < cut, -jnp.inf, x), axis=-1)
    return jnp.where(t > 0, probs, greedy)


def sample(keys, probs):
    """One token per row: keys [B] (typed PRNG keys), probs [B, V] -> [B] int32."""
    draw = lambda key, p: jax.random.categorical(key, jnp.log(p))
    return jax.vmap(draw)(keys, probs).astype(jnp.int32)


def split_keys(keys, n: int):
    """[B] keys -> [n, B] fresh keys (the first carries the row's stream on)."""
    return jax.vmap(lambda k: jax.random.split(k, n), out_axes=1)(keys)
