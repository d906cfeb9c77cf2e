"""Jobs whose rows are refilled as they finish (jspec/runtime/slots.py, jspec/decode/refill.py): the records equal
the same job's at batch size 1 (greedy, float32) in every draft mode; a job stopped mid-refill and resumed, or
killed and resumed, loses and duplicates no line; the summary counts the wasted row-rounds.

Every line of a job here falls in one capacity bucket (prompt + max_new + K + 1 in (32, 48]), so each mode
compiles one refilled batch's programs and one batch-1 program.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import build_hf_model, tiny_tokenizer
from test_head import _write_head

from jspec.jobs import batch
from jspec.config import GenerateConfig, KVConfig, SamplingConfig, load_model_config
from jspec.runtime import engine, slots

ROOT = Path(__file__).resolve().parents[1]
GEN = GenerateConfig(max_new_tokens=16, lookahead=2)
WORDS = ["the", "quick", "brown", "fox", "hello", "world", "two", "bit", "cache", "over"]
COMPARED = ("new_tokens", "rounds", "accepted", "finish_reason")


def _lines(n: int = 9) -> list[bytes]:
    """n lines of one capacity bucket: prompt + max_new tokens in [30, 45]; some with stop strings."""
    rng = np.random.default_rng(0)
    tok = tiny_tokenizer()
    out = []
    for i in range(n):
        prompt = " ".join(rng.choice(WORDS, int(rng.integers(1, 4))))
        m = int(rng.integers(30, 46)) - len(tok.encode(prompt))
        rec = {"id": f"r{i}", "prompt": prompt, "max_new_tokens": m} | ({"stop": ["e", "o"]} if i % 3 == 1 else {})
        out.append(json.dumps(rec).encode())
    return out


@pytest.fixture(scope="module")
def dirs(hf_model_dir, tmp_path_factory):
    """The tiny qwen3 target, a draft of the same shape with other weights, and an EAGLE-3 head for it."""
    root = tmp_path_factory.mktemp("refill")
    build_hf_model("qwen3", seed=1).save_pretrained(root / "draft")
    tiny_tokenizer().save_pretrained(root / "draft")
    target = hf_model_dir("qwen3")
    _write_head(root / "head", load_model_config(target))
    return {"target": target, "draft": root / "draft", "head": root / "head"}


def _engine(dirs, mode: str):
    draft = {"none": None, "ngram": "ngram", "model": dirs["draft"], "ngram+model": f"ngram+{dirs['draft']}",
             "head": dirs["head"]}[mode]
    return engine.load(dirs["target"], draft=draft, kv=KVConfig("bf16"), dtype="float32", mesh=None)


def _run(eng, src, dst, batch_size, **kw):
    return batch.run_job(eng, src, dst, GEN, SamplingConfig(), batch_size, progress=False, **kw)


def _records(path) -> dict:
    """{id: (line, text, compared stats)}; fails if an id is answered twice."""
    recs = [json.loads(x) for x in path.read_bytes().split(b"\n") if x]
    out = {r["id"]: (r["line"], r["text"], r["token_ids"], [r["stats"][k] for k in COMPARED]) for r in recs}
    assert len(out) == len(recs), "a line was answered twice"
    return out


@pytest.mark.parametrize("mode", ["none", "model", "ngram", "ngram+model", "head"])
def test_refilled_job_equals_batch_size_one(dirs, tmp_path, mode):
    eng = _engine(dirs, mode)
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(_lines()) + b"\n")
    one, refilled = tmp_path / "one.jsonl", tmp_path / "refilled.jsonl"
    _run(eng, src, one, 1)
    summary = _run(eng, src, refilled, 4)
    assert _records(refilled) == _records(one)
    reasons = [v[3][-1] for v in _records(one).values()]
    assert "stop" in reasons and "length" in reasons  # rows end early and late: slots are refilled mid-run
    d = summary.as_dict()
    assert summary.row_rounds >= summary.rounds > 0 and d["wasted_row_rounds"] == summary.row_rounds - summary.rounds


def test_stopped_mid_refill_and_resumed(dirs, tmp_path, monkeypatch):
    """A job stopped in its third refill (after some records are written) and run again: every line once, the
    records of an uninterrupted run."""
    eng = _engine(dirs, "ngram")
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(_lines(12)) + b"\n")
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    _run(eng, src, whole, 4)

    step, calls = slots._Batch.step, []

    def stop_in_third(self, *args):
        calls.append(1)
        if len(calls) == 3:
            self._place()  # rows taken into slots, then the process stops before their refill ends
            raise KeyboardInterrupt
        return step(self, *args)

    monkeypatch.setattr(slots._Batch, "step", stop_in_third)
    with pytest.raises(KeyboardInterrupt):
        _run(eng, src, cut, 4)
    monkeypatch.undo()
    written = len(_records(cut))
    assert 0 < written < 12
    summary = _run(eng, src, cut, 4)
    assert summary.skipped == written and _records(cut) == _records(whole)


def _spawn(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jspec.generate", *map(str, args)], cwd=ROOT,
                            env=os.environ | {"JAX_PLATFORMS": "cpu"}, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_killed_mid_job_and_resumed(dirs, tmp_path, cache_dir):
    """SIGKILL once some records are out (the job is then between refills and rounds), then the same command:
    one record per line, equal to an uninterrupted run's."""
    src, dst, whole = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "whole.jsonl"
    src.write_bytes(b"\n".join(_lines(24)) + b"\n")
    flags = ["--model", dirs["target"], "--draft", "none", "--kv", "bf16", "--dtype", "float32", "--lookahead", "0",
             "--batch-size", "4", "--compile-cache", cache_dir, "--input", src]
    p = _spawn(*flags, "--output", dst)
    deadline = time.monotonic() + 240
    while p.poll() is None and time.monotonic() < deadline and (not dst.is_file() or dst.read_bytes().count(b"\n") < 2):
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    killed = dst.read_bytes().count(b"\n")
    assert 2 <= killed < 24
    for out in (dst, whole):
        p = _spawn(*flags, "--output", out)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert _records(dst) == _records(whole) and len(_records(dst)) == 24


def test_acceptance_is_learnt_from_real_rows_only(dirs, tmp_path):
    """Lookahead "auto" learns from the rows a refilled batch finished, never from its empty slots: 3 rows in 4
    slots add exactly their own drafts (K x their rounds) to the engine's acceptance record."""
    eng = _engine(dirs, "ngram")
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"\n".join(_lines(3)) + b"\n")
    _run(eng, src, dst, 4)
    recs = [json.loads(x) for x in dst.read_bytes().split(b"\n") if x]
    [(key, (drafts, _))] = eng._seen.items()
    assert key[1] == 4 and drafts == GEN.lookahead * sum(r["stats"]["rounds"] for r in recs) > 0
