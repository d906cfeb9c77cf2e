"""Token healing (jspec/decode/healing.py): the mask from the byte table, the rows it leaves alone, and whole runs
on a tiny model: a prompt ending in "\\n" or mid-word gives the greedy run of the prompt less its last token whose
first token is the best one that starts with the removed text; the text is the continuation of the prompt as
given; speculative == plain and a refilled job == generate with healing on."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jspec.config import GenerateConfig, KVConfig, SamplingConfig
from jspec.decode import healing, stops
from jspec.jobs import batch
from jspec.model.decoder import forward
from jspec.runtime import engine, slots

PROMPTS = ["the quick brown fox jumps over the la", "hello world, this is\n"]
MAX_NEW = 12


def _table() -> stops.TokenBytes:
    return stops._pack_table([b"a", b"ab", b"abc", b"b", b"\n", b"\n\n", b"", "é".encode()[:1]], [0] * 8)


def test_allowed_tokens_start_with_the_removed_bytes():
    tb = _table()
    assert healing.allowed(tb, b"ab").tolist() == [False, True, True, False, False, False, False, False]
    assert healing.allowed(tb, b"\n").tolist() == [False] * 4 + [True, True, False, False]


def test_heal_leaves_alone_one_token_prompts_special_tokens_and_stop_overlaps():
    tb = _table()
    h = healing.heal(tb, [[0, 1], [1], [0, 6], [0, 7], [0, 4], [0, 4]], [(), (), (), (), ("\n\n",), ("x",)])
    assert h.ids == [[0], [1], [0, 6], [0, 7], [0, 4], [0]]
    assert h.removed == ["ab", "", "", "", "", "\n"]
    assert h.allowed[1].all() and h.allowed[5].tolist() == [False] * 4 + [True, True, False, False]
    assert healing.heal(None, [[0, 1]], [()]).allowed is None
    assert healing.heal(tb, [[0, 3]], [()]).allowed is not None


@pytest.fixture(scope="module")
def tiny(hf_model_dir):
    path = hf_model_dir("llama")
    load = lambda draft: engine.load(path, draft=draft, kv=KVConfig("bf16"), dtype="float32", mesh=None)
    return {"none": load("none"), "self": load(path)}


def _reference(eng, ids: list[int], max_new: int) -> list[int]:
    """Greedy healing by hand: the first token the argmax of the prompt less its last token over the tokens that
    start with its text, then plain greedy decoding after it."""
    tb = eng.token_bytes()
    removed = tb.table[ids[-1], : tb.lens[ids[-1]]].tobytes()
    logits, _ = forward(eng.params, eng.cfg, jnp.asarray([ids[:-1]]))
    first = int(np.argmax(np.where(healing.allowed(tb, removed), np.asarray(logits[0, -1]), -np.inf)))
    gen = GenerateConfig(max_new - 1, lookahead=0, stop_at_eos=False)
    [(rest, _)] = eng.generate_ids([ids[:-1] + [first]], [SamplingConfig()], [max_new - 1], gen)
    return [first] + rest


def test_healed_greedy_run_is_the_constrained_run_of_the_shorter_prompt(tiny):
    eng = tiny["none"]
    gen = GenerateConfig(MAX_NEW, lookahead=0, stop_at_eos=False, heal=True)
    results = eng.generate(PROMPTS, gen)
    for p, r in zip(PROMPTS, results):
        ids = eng.encode(p)
        removed = eng.tokenizer.decode(ids[-1:])
        assert r.stats.healed == removed != ""
        assert r.token_ids == _reference(eng, ids, MAX_NEW), p
        full = eng.tokenizer.decode(r.token_ids)
        assert full.startswith(removed) and r.text == full[len(removed):]  # the continuation of p as given
    plain = eng.generate(PROMPTS, dataclasses.replace(gen, heal=False))
    assert all(r.stats.healed == "" and "healed" not in r.stats.as_dict() for r in plain)


def test_healing_is_exact_with_speculation_and_in_refilled_jobs(tiny):
    gen = GenerateConfig(MAX_NEW, lookahead=0, stop_at_eos=False, heal=True)
    plain = tiny["none"].generate(PROMPTS, gen)
    spec = tiny["self"].generate(PROMPTS, dataclasses.replace(gen, lookahead=3))
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert spec[0].stats.accepted > 0

    eng = tiny["none"]
    rows = [batch.Job(i, i, "", eng.encode(p), MAX_NEW, SamplingConfig()) for i, p in enumerate(PROMPTS * 2)]
    done = [d for f in slots.refilled(eng, rows, gen, 2, refill_at=1) for d in f.done]
    assert len(done) == 4
    for row, ids, st in done:
        assert ids == plain[row.id % 2].token_ids and st.healed == plain[row.id % 2].stats.healed
        assert eng.text(ids, (), st.healed) == plain[row.id % 2].text


def test_stream_shows_the_healed_text_once(tiny):
    eng = tiny["none"]
    gen = GenerateConfig(MAX_NEW, lookahead=0, stop_at_eos=False, heal=True)
    [r] = eng.generate(PROMPTS[1:], gen)
    assert "".join(eng.stream(PROMPTS[1], gen)) == r.text
