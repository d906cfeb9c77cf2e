"""A row's stats (runtime.engine.Stats): accepted counts only the drafts a row emitted (none cut by
max_new_tokens), accept_length agrees with it, and the KV size says what the BF16 cache would take."""

from __future__ import annotations

import pytest

from jspec.config import GenerateConfig, KVConfig
from jspec.runtime import engine


@pytest.fixture(scope="module")
def path(hf_model_dir):
    return hf_model_dir("llama")


def test_drafts_cut_by_max_new_tokens_are_not_accepted(path):
    """The model drafting for itself accepts every draft: K 3, 10 tokens = the prefill's, 4 + 4, then 1 of the
    third round's 4 (its 3 accepted drafts, 2 of them past max_new_tokens)."""
    eng = engine.load(path, draft=path, kv=KVConfig("bf16"), dtype="float32", mesh=None)
    [r] = eng.generate(["hello world"], GenerateConfig(10, lookahead=3, stop_at_eos=False))
    st = r.stats
    assert (st.new_tokens, st.rounds, st.accepted) == (10, 3, 7)
    assert st.accept_rate == pytest.approx(7 / 9) and st.accept_length == pytest.approx(9 / 3)
    assert st.new_tokens - 1 - st.rounds <= st.accepted <= st.new_tokens - st.rounds


def test_kv_bytes_name_the_bf16_size_of_the_same_call(path):
    gen = GenerateConfig(8, lookahead=0)
    bf16 = engine.load(path, draft="none", kv=KVConfig("bf16"), dtype="float32", mesh=None)
    int2 = engine.load(path, draft="none", kv=KVConfig("int2", sink=4, recent=16), dtype="float32", mesh=None)
    [b] = bf16.generate(["hello world"], gen)
    [i] = int2.generate(["hello world"], gen)
    assert b.stats.bf16_kv_bytes == b.stats.batch_kv_bytes
    assert i.stats.bf16_kv_bytes == b.stats.batch_kv_bytes != i.stats.batch_kv_bytes
