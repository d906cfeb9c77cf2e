"""The speculative acceptance rule, fixed-shape: no .nonzero(), no .item(), no host round trip.

Given K drafted tokens d_1..d_K drawn from the draft distributions q_1..q_K, and the target
distributions p_1..p_{K+1} from one verification forward over [next, d_1..d_K]:
  - d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)), in order, until the first rejection;
  - at the first rejected position a the token is redrawn from norm(max(0, p_a - q_a));
  - if all K pass, a bonus token is drawn from p_{K+1}.
The emitted tokens are then distributed exactly as the target's (Leviathan et al. 2023, Thm 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jspec.model.sampling import sample


def accepted_prefix(ok):
    """ok [B, K] bool -> length of the all-True prefix [B]: sum(cumprod(ok))."""
    return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=-1), axis=-1)


def accept_greedy(target_logits, drafts):
    """target_logits [B, K+1, V], drafts [B, K] -> (a [B] accepted drafts, next token [B])."""
    best = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, K+1]
    a = accepted_prefix(drafts == best[:, :-1])
    return a, jnp.take_along_axis(best, a[:, None], axis=1)[:, 0]


def acceptance(p, q, drafts):
    """[B, K] probability min(1, p_i(d_i) / q_i(d_i)) that draft i passes, given it was drawn from q_i.

    q_i(d_i) > 0 for a draft sampled from q_i; the floor only keeps a stray zero from dividing by 0.
    """
    K = drafts.shape[1]
    pd = jnp.take_along_axis(p[:, :K], drafts[..., None], axis=-1)[..., 0]  # [B, K] p_i(d_i)
    qd = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]  # [B, K] q_i(d_i)
    return jnp.minimum(1.0, pd / jnp.maximum(qd, jnp.finfo(qd.dtype).tiny))


def residual(p, q, a):
    """The distribution [B, V] of the token emitted after a [B] accepted drafts.

    a < K: the first rejection, norm(max(0, p_a - q_a)); a == K: the bonus token, p_{K+1}.
    """
    p_a = jnp.take_along_axis(p, a[:, None, None], axis=1)[:, 0]  # [B, V]
    q_pad = jnp.concatenate([q, jnp.zeros_like(p[:, :1])], axis=1)  # q_{K+1} := 0: bonus draws from p
    q_a = jnp.take_along_axis(q_pad, a[:, None, None], axis=1)[:, 0]
    resid = jnp.maximum(p_a - q_a, 0.0)
    mass = resid.sum(-1, keepdims=True)
    # mass is 0 only if p_a == q_a, where rejection has probability 0: fall back to p_a for safety.
    return jnp.where(mass > 0, resid / jnp.where(mass > 0, mass, 1.0), p_a)


def accept_sampled(p, q, drafts, keys):
    """p [B, K+1, V] target and q [B, K, V] draft probabilities, drafts [B, K], keys [2, B].

    Returns (a [B] accepted drafts, next token [B]): the replacement at the first rejection, or the
    bonus token drawn from p_{K+1} when every draft passes.
    """
    K = drafts.shape[1]
    u = jax.vmap(lambda k: jax.random.uniform(k, (K,), p.dtype))(keys[0])  # [B, K] in [0, 1)
    a = accepted_prefix(u < acceptance(p, q, drafts))
    return a, sample(keys[1], residual(p, q, a))
