"""Sequence-level unlikelihood (Welleck et al. 2019, section 5.2): fine-tuning a model on its own greedy
continuations, pushing down p(token) where the continuation repeats itself (the sequence-level unlikelihood fine-tune).

    python -m jspec.train.train --preset target-sequl --init checkpoints/code-target --data data/code \
        --out runs/sequl --export runs/sequl-hf --time-budget 200

Each training step (jspec.train.train with TrainConfig.sequl set) adds to the corpus loss (cross-entropy plus
the token-level unlikelihood) `weight` x the mean over continuation tokens of -log(1 - p(x_t | x_<t))
at the candidate tokens x_t of fresh greedy continuations of train-split prefixes. Candidates match
what issue 18 measures (benchmarks/pair_quality.py, repeated_line_share below): every token of a line
that equals an earlier non-blank line of the same continuation (stripped), and every token that
completes an n-gram the continuation already holds (long n-grams only: short ones are code's idiom).

Continuations are generated on the device (greedy, BF16 KV cache: as the metric decodes); the masks
are computed on the host from the decoded text, token by token. Checkpoint selection: every evaluation
measures the repetition of greedy continuations of fixed train-split prompts (the goal is checked on
validation prompts this never sees) beside the validation objective; the params exported are those of
the lowest repetition whose validation objective is within `slack` of the starting model's and whose
continuations are natural: their NLL per token under the starting model at most its validation
objective, i.e. no less likely than held-out code. Without that guard, the first GPU run
escaped repetition into gibberish identifiers within 25 steps, at a validation cost inside the slack.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jspec.cache.kvcache import commit, init_cache
from jspec.config import KVConfig, ModelConfig
from jspec.model.decoder import Params, forward


@dataclasses.dataclass(frozen=True)
class SeqULConfig:
    weight: float = 1.0  # of the sequence-level term, beside the corpus loss (same step)
    prefixes: int = 32  # continuations per step
    prompt_len: int = 64  # prefix tokens (BOS + the tokens before a line end)
    new_tokens: int = 128  # greedy tokens per continuation (the metric's length)
    ngram: int = 12  # a repeated n-gram of this many tokens marks its last token
    eval_prompts: int = 32  # train-split prompts whose repetition selects the checkpoint
    slack: float = 0.06  # admissible: validation objective <= (1 + slack) x the starting model's
    # admissible: the eval continuations' mean NLL per token under the starting model <= its validation
    # objective: no less natural than held-out code (the first GPU run of this fine-tune escaped repetition into gibberish)
    natural: bool = True


# ------------------------------------------------------------------------------------- candidates


def nonblank_lines(text: str):
    """(start, end, stripped line) of each non-blank line of text, in order (start..end: the stripped span)."""
    pos = 0
    for raw in text.split("\n"):
        line = raw.strip()
        if line:
            start = pos + len(raw) - len(raw.lstrip())
            yield start, start + len(line), line
        pos += len(raw) + 1


def repeated_lines(text: str) -> list[tuple[int, int]]:
    """The (start, end) spans of the non-blank lines that equal an earlier line of text (stripped)."""
    seen, spans = set(), []
    for start, end, line in nonblank_lines(text):
        if line in seen:
            spans.append((start, end))
        seen.add(line)
    return spans


def repeated_line_share(continuations: list[str]) -> tuple[int, int]:
    """(lines that repeat an earlier line of their continuation, non-blank lines), stripped, pooled:
    issue 18's repetition measure (benchmarks/pair_quality.py)."""
    repeated = sum(len(repeated_lines(t)) for t in continuations)
    return repeated, sum(1 for t in continuations for _ in nonblank_lines(t))


def ngram_repeats(ids: np.ndarray, n: int) -> np.ndarray:
    """bool [T]: token t completes an n-gram (ids[t - n + 1..t]) that ended earlier in ids."""
    seen, mask = set(), np.zeros(len(ids), bool)
    for t in range(n - 1, len(ids)):
        gram = tuple(ids[t - n + 1:t + 1])
        mask[t] = gram in seen
        seen.add(gram)
    return mask


def token_pieces(tokenizer, vocab_size: int) -> list[str]:
    """Each token's own text. Joined they give the decoded text, except that a character split over
    tokens (byte-level BPE) shows as U+FFFD: line ends and ASCII lines are exact."""
    return [tokenizer.decode([i]) for i in range(vocab_size)]


def repetition_mask(ids: np.ndarray, pieces: list[str], ngram: int) -> np.ndarray:
    """bool [T] over a continuation's tokens ids [T]: the sequence-level unlikelihood candidates."""
    ends = np.cumsum([len(pieces[i]) for i in ids])  # [T] character offsets of each token's end
    starts = ends - [len(pieces[i]) for i in ids]
    mask = ngram_repeats(ids, ngram)
    for a, b in repeated_lines("".join(pieces[i] for i in ids)):
        mask |= (starts < b) & (ends > a)  # the tokens that overlap the repeated line's text
    return mask


# ------------------------------------------------------------------------------------ continuations


@functools.partial(jax.jit, static_argnames=("cfg", "new_tokens"))
def greedy_continuations(params: Params, cfg: ModelConfig, prompts, new_tokens: int):
    """prompts [B, P] int32 -> [B, P + new_tokens]: the prompts and their greedy continuations, one
    forward per token over a BF16 KV cache (params' dtype sets the compute dtype)."""
    B, P = prompts.shape
    cache = init_cache(cfg, KVConfig("bf16"), B, P + new_tokens)
    logits, (k, v) = forward(params, cfg, prompts, cache)
    cache = commit(cache, k, v, jnp.full((B,), P))
    buf = jnp.concatenate([prompts, jnp.zeros((B, new_tokens), jnp.int32)], 1)

    def step(i, carry):
        buf, cache, nxt = carry  # nxt [B]: the token at position P + i
        buf = jax.lax.dynamic_update_slice(buf, nxt[:, None], (0, P + i))
        logits, (k, v) = forward(params, cfg, nxt[:, None], cache)
        return buf, commit(cache, k, v, jnp.ones((B,), jnp.int32)), logits[:, -1].argmax(-1).astype(jnp.int32)

    buf, _, _ = jax.lax.fori_loop(0, new_tokens, step, (buf, cache, logits[:, -1].argmax(-1).astype(jnp.int32)))
    return buf


def line_prompts(stream: np.ndarray, ends: np.ndarray, bos: int, n: int, length: int,
                 rng: np.random.Generator) -> np.ndarray:
    """n prompts [n, length]: BOS + the length - 1 stream tokens up to a line end (ends: the stream
    positions whose token ends a line), as pair_quality's prompts end at a line end."""
    picks = rng.choice(ends[ends >= length - 2], n)
    rows = [stream[e - length + 2:e + 1] for e in picks]
    return np.concatenate([np.full((n, 1), bos), np.stack(rows)], 1).astype(np.int32)


# -------------------------------------------------------------------------------------------- loss


def seq_loss(params16: Params, cfg: ModelConfig, seqs, mask, new_tokens: int):
    """Sequence-level unlikelihood of seqs [B, T] (prompt + continuation) at mask [B, T] (candidates;
    never in the prompt): sum of -log(1 - p(x_t | x_<t)) / (B x new_tokens), in f32."""
    logits, _ = forward(params16, cfg, seqs[:, :-1])
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    p = jnp.exp(jnp.take_along_axis(logp, seqs[:, 1:, None], -1)[..., 0])  # [B, T - 1]
    ul = -jnp.log(jnp.clip(1 - p, 1e-5))
    return jnp.sum(jnp.where(mask[:, 1:], ul, 0.0)) / (seqs.shape[0] * new_tokens)


@functools.partial(jax.jit, static_argnames=("cfg", "prompt_len"))
def continuation_nll(params16: Params, cfg: ModelConfig, seqs, prompt_len: int):
    """Mean NLL (nats per token) of the continuations seqs[:, prompt_len:] under params16, in f32."""
    logits, _ = forward(params16, cfg, seqs[:, :-1])
    logp = jax.nn.log_softmax(logits[:, prompt_len - 1:].astype(jnp.float32), -1)
    return -jnp.mean(jnp.take_along_axis(logp, seqs[:, prompt_len:, None], -1))


# ------------------------------------------------------------------------------------ the host side


@dataclasses.dataclass
class SeqUL:
    """What jspec.train.train's loop asks of sequence-level unlikelihood: a batch of continuations and their
    candidate masks per step, and a selection score per evaluation (logged to run_dir/sequl_evals.json,
    read back on resume)."""

    cfg: ModelConfig
    sc: SeqULConfig
    pieces: list[str]
    stream: np.ndarray  # the train split's tokens
    ends: np.ndarray  # positions in stream whose token ends a line
    log_path: Path
    evals: list[dict] = dataclasses.field(default_factory=list)
    reference: Params | None = None  # the starting model (bf16), which judges how natural continuations are

    @classmethod
    def create(cls, cfg: ModelConfig, sc: SeqULConfig, tokenizer, stream: np.ndarray, run_dir: Path) -> "SeqUL":
        pieces = token_pieces(tokenizer, cfg.vocab_size)
        line_end = np.asarray([p.endswith("\n") for p in pieces])
        log_path = Path(run_dir) / "sequl_evals.json"
        evals = json.loads(log_path.read_text()) if log_path.is_file() else []
        return cls(cfg, sc, pieces, stream, np.flatnonzero(line_end[stream]), log_path, evals)

    def continuations(self, params: Params, prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Greedy continuations [B, P + N] of prompts [B, P] with the bf16 params, and their masks [B, P + N]."""
        p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
        seqs = np.asarray(greedy_continuations(p16, self.cfg, prompts, self.sc.new_tokens))
        P = prompts.shape[1]
        mask = np.zeros(seqs.shape, bool)
        mask[:, P:] = [repetition_mask(s[P:], self.pieces, self.sc.ngram) for s in seqs]
        return seqs, mask

    def batch(self, params: Params, seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, step, 1])  # a function of the step: resumes reproduce it
        prompts = line_prompts(self.stream, self.ends, self.cfg.bos_token_id, self.sc.prefixes, self.sc.prompt_len, rng)
        return self.continuations(params, prompts)

    def repetition(self, params: Params) -> tuple[float, float, int]:
        """(repeated-line share, NLL per token under the reference (nan without one), non-blank lines) of
        greedy continuations of fixed train-split prompts."""
        prompts = line_prompts(self.stream, self.ends, self.cfg.bos_token_id, self.sc.eval_prompts,
                               self.sc.prompt_len, np.random.default_rng(12345))
        seqs, _ = self.continuations(params, prompts)
        P = prompts.shape[1]
        repeated, total = repeated_line_share(["".join(self.pieces[i] for i in s[P:]) for s in seqs])
        nll = float("nan") if self.reference is None else float(continuation_nll(self.reference, self.cfg, seqs, P))
        return repeated / max(total, 1), nll, total

    def score(self, params: Params, step: int, val: float) -> float:
        """The selection score (lower is better): the repetition when the params are admissible, else inf.
        Admissible: the first evaluation (the starting model), and later ones with val within the slack of
        the first's and (sc.natural) continuations whose NLL per token under the starting model is at most
        the first's val."""
        if self.reference is None and self.sc.natural:
            self.reference = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)  # the first call: the start
        rep, nll, lines = self.repetition(params)
        first = self.evals[0]["val"] if self.evals else None  # None: this is the start, admissible as it is
        ok = first is None or (val <= first * (1 + self.sc.slack) and not (self.sc.natural and nll > first))
        self.evals.append({"step": step, "val": val, "repetition": rep, "reference_nll": nll, "lines": lines,
                           "admissible": ok})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(json.dumps(self.evals, indent=1) + "\n")
        return rep if ok else float("inf")
