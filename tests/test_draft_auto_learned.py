"""Draft "auto" keeps what it learns on disk (runtime.learned): a second engine on the same model pair, as a new
process would be, prices its first call with the first engine's acceptance and benches; a file it cannot use is
ignored (the priors); learn="memory" (the suite's default: conftest) keeps nothing on disk."""

import dataclasses
import json
import logging

import pytest

import jspec
from jspec.config import ConfigError, GenerateConfig
from jspec.decode import drafters
from jspec.runtime import learned, lookahead
from test_draft_auto import GREEDY, MAX_NEW, Constant, _auto, _gen, _ids
from test_drafter_plugin import CFG, INT2


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))
    return tmp_path / "lookahead"


def _load(hf_model_dir, **kw):
    return jspec.load(hf_model_dir("llama"), draft="auto", kv=jspec.KVConfig("bf16"), dtype="float32",
                      **{"learn": "disk"} | kw)


def _plan(eng, ids):
    """plan_auto's Choice for one call of ids: {drafter: its priced candidate's stats}."""
    gen = GenerateConfig(MAX_NEW, stop_at_eos=False)
    _, choice = eng.plan(gen, [len(x) for x in ids], [MAX_NEW] * len(ids))
    return {p.mode: p for p in choice.priced}


def test_a_new_engine_prices_its_first_call_with_what_the_last_one_learnt(hf_model_dir, cache):
    ids = _ids(1)
    first = _load(hf_model_dir)
    assert first.store is not None and not first._seen
    [(_, st)] = first.generate_ids(ids, GREEDY, [MAX_NEW], GenerateConfig(MAX_NEW, stop_at_eos=False))
    mode = st.draft_mode
    assert st.lookahead > 0 and st.speculation["why"]["candidates"][1]["alpha_from"] == "prior"  # the priors' pick
    assert [p.name for p in cache.glob("learned-*.json")] == [first.store.path.name]
    key = (mode, 1)
    want = lookahead.auto_alpha(mode, first._seen[key], first._bench.get(key), first._calls[1], 1)[0]

    second = _load(hf_model_dir)
    assert second.store == first.store and second._seen == first._seen and second._calls == {1: 1}
    got = _plan(second, ids)[mode]
    assert got.alpha == pytest.approx(want) and got.alpha != pytest.approx(lookahead.prior(mode, 1))
    drafts = int(first._seen[key][0])
    assert got.alpha_from in (f"{drafts} drafts measured ({drafts} read from disk)", "last call (read from disk)")
    assert _plan(_load(hf_model_dir, learn="memory"), ids)[mode].alpha_from == "prior"


def _store(name="pair"):
    return learned.store(name, CFG, (), INT2, "float32")


def test_a_bench_survives_and_its_probe_schedule_goes_on(cache):
    ids = _ids(3)
    plain, _ = _gen(_auto("ngram"), ids, 2 * MAX_NEW, K=0)
    drafters.register("constant-learned", Constant(token=next(t for t in range(CFG.vocab_size) if t not in plain)))
    eng = dataclasses.replace(_auto("constant-learned"), store=_store())
    _, st = _gen(eng, ids)
    assert st.lookahead > 0 and st.accepted == 0  # ran at its prior, lost
    bench = eng._bench[("constant-learned", 1)]
    assert bench.probe_at == lookahead.PROBE_EVERY

    again = dataclasses.replace(_auto("constant-learned"), store=_store())
    again.recall()
    assert again._bench[("constant-learned", 1)] == bench and again._calls == {1: 1}
    _, st = _gen(again, ids)
    assert st.lookahead == 0 and st.speculation["why"]["candidates"][1]["alpha_from"] == "last call (read from disk)"
    third = dataclasses.replace(_auto("constant-learned"), store=_store())
    third.recall()
    assert third._calls == {1: 2}  # counted on from the file: the probe stays PROBE_EVERY calls after the loss


@pytest.mark.parametrize("text", [
    b"\xff\xfe", b"{not json", b"[]", b'{"format": 0, "seen": [], "bench": [], "calls": []}',
    b'{"format": 1, "seen": [["ngram", 1, 10, 11]], "bench": [], "calls": []}',  # acceptance above 1
    b'{"format": 1, "seen": [["ngram", 3, 10, 5]], "bench": [], "calls": []}',  # not a bucket
    b'{"format": 1, "seen": [], "bench": [["ngram", 1, NaN, null, 4]], "calls": []}',
    b'{"format": 1, "seen": [], "bench": [], "calls": [[1, -2]]}',
    b'{"format": 1, "seen": [["ngram", 1]], "bench": [], "calls": []}',
    b'{"format": 1, "seen": []}'])
def test_a_file_it_cannot_use_is_ignored(cache, caplog, text):
    store = _store()
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(text)
    eng = dataclasses.replace(_auto("ngram"), store=store)
    with caplog.at_level(logging.WARNING, logger="jspec"):
        eng.recall()
    assert not (eng._seen or eng._bench or eng._calls)
    assert any("ignored draft auto's learned estimates" in r.getMessage() for r in caplog.records)
    assert _plan(eng, _ids())["ngram"].alpha_from == "prior"
    _gen(eng, _ids())
    assert store.read()[2] == {1: 1}  # the next call writes a good file over it


def test_memory_keeps_nothing_on_disk(hf_model_dir, cache, monkeypatch):
    assert _load(hf_model_dir, learn="memory").store is None
    monkeypatch.setenv("JSPEC_LEARN", "memory")
    eng = _load(hf_model_dir, learn=None)
    assert eng.store is None
    _gen(eng, _ids())
    assert eng._calls == {1: 1} and not list(cache.glob("learned-*.json"))
    with pytest.raises(ConfigError):
        _load(hf_model_dir, learn="nowhere")


def test_the_key_is_the_models_kv_and_dtype_not_the_device(cache, monkeypatch):
    store = _store()
    assert set(store.what) == {"source", "target", "drafts", "kv", "dtype"}
    assert store.path.parent == cache and json.dumps(store.what)  # small JSON, under cache_root()/lookahead
    assert _store() == store
    others = [_store("other pair"), learned.store("pair", CFG, (), jspec.KVConfig("bf16"), "float32"),
              learned.store("pair", CFG, (), INT2, "bfloat16")]
    assert len({store.path} | {s.path for s in others}) == 4


def test_a_measured_estimate_reads_back_as_measured_and_read_from_disk(cache):
    eng = dataclasses.replace(_auto("ngram", "self"), store=_store())
    eng._seen[("self", 1)] = (1e4, 1e4 * 0.9)
    eng.store.write(eng._seen, eng._bench, eng._calls)
    again = dataclasses.replace(_auto("ngram", "self"), store=_store())
    again.recall()
    got = _plan(again, _ids())
    assert got["self"].alpha == pytest.approx(lookahead.estimate("self", (1e4, 9e3))[0])
    assert got["self"].alpha_from == "10000 drafts measured (10000 read from disk)"
    assert got["ngram"].alpha_from == "prior"
