"""The prefill's chunks: a prompt array read in chunks of Options.prefill_chunk tokens (the array can be as wide
as the cache, so one program serves every prompt length, while the work follows the longest prompt of the call
and a chunk's attention scores stay [B, H, chunk, capacity])."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def width(m, P: int) -> int:
    """The width of the chunks of a prompt array P tokens wide (m: the program's Models)."""
    return min(m.options.prefill_chunk, P)


def rows(prompt_lens, i, c: int):
    """[B] the prompt tokens of each row in chunk i (of width c)."""
    return jnp.clip(prompt_lens - i * c, 0, c)


def over_chunks(m, prompts, prompt_lens, chunk, carry):
    """carry through chunk(i, tokens [B, c], carry) for the prompts' chunks i of c = width(m, P) tokens (the last
    padded) until the longest prompt is done; one chunk: no loop."""
    P = prompts.shape[1]
    c = width(m, P)
    prompts = jnp.pad(prompts, ((0, 0), (0, -P % c)))  # whole chunks
    body = lambda i, carry: chunk(i, jax.lax.dynamic_slice_in_dim(prompts, i * c, c, axis=1), carry)
    if prompts.shape[1] == c:
        return body(0, carry)
    return jax.lax.fori_loop(0, -(-jnp.max(prompt_lens) // c), body, carry)
