"""Sequence-level unlikelihood: the candidate masks, the loss, the continuation generator, the training hook."""

import dataclasses
import json
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jspec.config import ModelConfig
from jspec.model.decoder import forward, init_params
from jspec.train import seq_unlikelihood as su, train

TINY = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=16, max_position=64, tie_embeddings=True, qk_norm=True,
                   bos_token_id=0)
# A hand-made vocabulary: token i is PIECES[i] (the rest are letters nobody uses below).
PIECES = ["x", " = ", "1", "\n", "    ", "y", "2", "(", ")", "\n\n"] + [chr(65 + i) for i in range(54)]


def ids(*pieces):
    return np.asarray([PIECES.index(p) for p in pieces])


def test_repeated_line_mask_marks_the_repeat_not_the_original():
    # "x = 1 / y / (blank) / x = 1 / y = 2": line 4 repeats line 1 (indentation differs), line 5 is new.
    seq = ids("x", " = ", "1", "\n", "y", "\n\n", "    ", "x", " = ", "1", "\n", "y", " = ", "2")
    mask = su.repetition_mask(seq, PIECES, ngram=12)
    assert mask.tolist() == [False] * 7 + [True] * 3 + [False] * 4
    text = "".join(PIECES[i] for i in seq)
    assert su.repeated_line_share([text]) == (1, 4)
    assert su.repeated_line_share(["a\n  b\n\na\nb\nc", "a\nd"]) == (2, 7)  # pair_quality's count, unchanged


def test_ngram_mask_marks_the_completing_token_of_long_repeats_only():
    seq = np.asarray([10, 11, 12, 13, 14, 10, 11, 12, 13, 15])
    assert np.flatnonzero(su.ngram_repeats(seq, 4)).tolist() == [8]
    assert np.flatnonzero(su.ngram_repeats(seq, 3)).tolist() == [7, 8]
    assert not su.ngram_repeats(seq, 5).any()
    # n-grams count on a line without a repeated line: an inline loop "AB AB AB ..."
    assert np.flatnonzero(su.repetition_mask(np.asarray([10, 11] * 4), PIECES, ngram=4)).tolist() == [5, 6, 7]


@jax.jit
def _full(params, tokens):
    return forward(params, TINY, tokens)[0]


def test_loss_is_zero_without_candidates_and_a_step_lowers_the_candidates():
    params = init_params(TINY, jax.random.key(0), jnp.float32, std=0.2)
    seqs = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 12)), jnp.int32)
    none = jnp.zeros(seqs.shape, bool)
    assert float(su.seq_loss(params, TINY, seqs, none, 4)) == 0.0
    mask = none.at[:, 10].set(True)
    loss, grads = jax.jit(jax.value_and_grad(su.seq_loss), static_argnums=(1, 4))(params, TINY, seqs, mask, 4)
    assert float(loss) > 0
    stepped = jax.tree.map(lambda p, g: p - 1.0 * g, params, grads)
    p = lambda params: np.asarray(jax.nn.softmax(_full(params, seqs)[:, 9], -1))[[0, 1], np.asarray(seqs[:, 10])]
    assert np.all(p(stepped) < p(params))


def test_continuations_equal_stepwise_greedy_of_the_full_forward():
    params = init_params(TINY, jax.random.key(1), jnp.float32, std=0.2)
    prompts = np.random.default_rng(1).integers(1, 64, (3, 5)).astype(np.int32)
    got = np.asarray(su.greedy_continuations(params, TINY, jnp.asarray(prompts), 8))
    want = np.concatenate([prompts, np.zeros((3, 8), np.int32)], 1)
    for t in range(5, 13):  # causal: the zeros after position t - 1 do not change its logits
        want[:, t] = np.asarray(_full(params, jnp.asarray(want)))[:, t - 1].argmax(-1)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got[:, 5:])) > 1  # not a degenerate constant model


def test_line_prompts_end_at_a_line_end_and_start_with_bos():
    stream = np.asarray([5, 3, 5, 5, 3, 5, 3, 5, 5, 5])
    ends = np.flatnonzero(stream == 3)
    prompts = su.line_prompts(stream, ends, 0, 4, 3, np.random.default_rng(0))
    assert prompts.shape == (4, 3) and (prompts[:, 0] == 0).all() and (prompts[:, -1] == 3).all()


class _Pieces:
    def decode(self, ids):
        return "".join(PIECES[i] for i in ids)


SC = su.SeqULConfig(prefixes=2, prompt_len=4, new_tokens=6, ngram=3, eval_prompts=2, slack=0.5)
TC = train.TrainConfig(steps=2, batch=2, seq_len=16, warmup=1, eval_every=2, save_every=2, eval_windows=2,
                       unlikelihood=0.5, sequl=SC)


def _streams():
    rng = np.random.default_rng(0)
    return rng.integers(1, 10, 512).astype(np.uint16), rng.integers(1, 10, 64).astype(np.uint16)


def test_training_with_sequl_logs_evals_and_exports_an_admissible_step(tmp_path):
    stream, val = _streams()
    seq = su.SeqUL.create(TINY, SC, _Pieces(), stream, tmp_path)
    state = train.train(TINY, TC, tmp_path, stream, val, seq=seq)
    evals = json.loads((tmp_path / "sequl_evals.json").read_text())
    assert [e["step"] for e in evals] == [0, 2] and evals[0]["admissible"]
    best = [e for e in evals if e["step"] == int(state.best_step)][0]
    assert best["admissible"] and float(state.best_val) == best["repetition"]
    assert all(e["repetition"] >= best["repetition"] for e in evals if e["admissible"])


def test_a_resumed_run_keeps_the_logged_reference_and_redoes_later_evals(tmp_path):
    # As after a restart from the step-0 checkpoint: the log holds step 0 (the reference) and a step 5
    # evaluated after that checkpoint; no step-0 evaluation again, step 5 dropped, the slack from step 0.
    stream, val = _streams()
    logged = [{"step": 0, "val": 1e-3, "repetition": 0.9, "admissible": True},
              {"step": 5, "val": 1e-3, "repetition": 0.1, "admissible": True}]
    (tmp_path / "sequl_evals.json").write_text(json.dumps(logged))
    seq = su.SeqUL.create(TINY, SC, _Pieces(), stream, tmp_path)
    train.train(TINY, dataclasses.replace(TC, steps=1), tmp_path, stream, val, seq=seq)
    evals = json.loads((tmp_path / "sequl_evals.json").read_text())
    assert [e["step"] for e in evals] == [0, 1] and not evals[1]["admissible"]  # val >> 1.5 x 1e-3


def test_selection_refuses_unnatural_continuations():
    """A later model whose continuations the starting model finds unlikely is not admissible (the guard
    against escaping repetition into gibberish), whatever its validation loss; without the guard it is."""
    stream, _ = _streams()
    start, other = init_params(TINY, jax.random.key(1)), init_params(TINY, jax.random.key(2))
    for natural in (True, False):
        seq = su.SeqUL(TINY, dataclasses.replace(SC, slack=1e9, natural=natural), PIECES, stream,
                       np.flatnonzero(np.isin(stream, [3, 9])), Path(tempfile.mkdtemp()) / "evals.json")
        assert seq.score(start, 0, 1e-3) == seq.evals[0]["repetition"]  # the start: admissible as it is
        score = seq.score(other, 1, 1e-3)
        assert seq.evals[1]["admissible"] is not natural and (score == float("inf")) is natural
