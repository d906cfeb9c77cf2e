"""Token healing (as transformers' `token_healing`): a prompt's last token backed off, the first generated token
made to start with its text.

A prompt that ends where a token boundary rarely falls in training (a bare "\\n" before more code, half a word)
steers the model to what followed that token there: on the shipped model a prompt ending in "\\n" gives EOS
at once, since a bare "\\n" token is mostly seen at the end of a document. Healing drops that last token and
lets the model choose it again among the tokens whose text starts with the removed text ("\\n", "\\n\\n",
"\\n    ", ...), so the prompt's text is kept and the split is the model's own.

The constraint only touches the first token, which the target draws itself at the prefill (decode.loop.prefill):
the speculative rounds after it run on the same state as plain decoding, so speculative == plain still holds.
The mask is built here on the host from the tokenizer's byte table (decode.stops.token_bytes, built once per
tokenizer), one [V] row per prompt.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jspec.decode.stops import TokenBytes


class Healed(NamedTuple):
    """A batch's prompts after healing."""

    ids: list[list[int]]  # each prompt, its last token dropped where healed
    removed: list[str]  # each row's removed text ("" where not healed): the first token starts with it
    allowed: np.ndarray | None  # [B, V] bool the first token's choices (all True where not healed); None: none


def allowed(tb: TokenBytes, removed: bytes) -> np.ndarray:
    """[V] bool: the tokens whose bytes in running text start with `removed`."""
    n = len(removed)
    head = tb.table[:, :n] == np.frombuffer(removed, np.uint8)
    return (tb.lens >= n) & head.all(1)


def heal(tb: TokenBytes | None, ids: list[list[int]], stop: list[tuple[str, ...]]) -> Healed:
    """Each prompt of two tokens or more healed, unless its last token has no text (a special token), is part of a
    character, or a stop string could match across the removed text (it would end the row on the prompt's own
    text). tb None (a tokenizer whose decode is not concatenative): nothing is healed."""
    out, removed, rows = [], [], []
    for row, s in zip(ids, stop):
        text = _removed(tb, row, s)
        out.append(row[:-1] if text else row)
        removed.append(text)
        rows.append(allowed(tb, text.encode()) if text else None)
    if not any(removed):
        return Healed(out, removed, None)
    V = tb.table.shape[0]
    return Healed(out, removed, np.stack([np.ones(V, bool) if r is None else r for r in rows]))


def _removed(tb: TokenBytes | None, row: list[int], stop: tuple[str, ...]) -> str:
    """The text healing removes from this prompt, or "" where it leaves the prompt alone (heal)."""
    if tb is None or len(row) < 2:
        return ""
    raw = tb.table[row[-1], : tb.lens[row[-1]]].tobytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    if any(s in text or s.startswith(text[i:]) for s in stop for i in range(len(text))):
        return ""
    return text


def constrain(logits, allowed):
    """logits [B, V] with the tokens a row may not start with at -inf; allowed [B, V] bool, or None: unchanged."""
    return logits if allowed is None else jnp.where(allowed, logits, -jnp.inf)


def unheal(text: str, removed: str) -> str:
    """A healed row's text as the continuation of the prompt it was given: the removed text taken off its start
    (where the decode dropped a leading space of the first token, what is left of it)."""
    if not removed:
        return text
    for head in (removed, removed.lstrip(" ")):
        if text.startswith(head):
            return text[len(head):]
    return text
