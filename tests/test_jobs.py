"""Batch jobs that cannot lose work (issue 15): every fault below costs at most its own line, and after each
one the output holds exactly the expected (id, line) records, once each.

The shipped pair runs with the shapes of test_cli.py (one row, short prompts, MAX_NEW new tokens, lookahead
2), so that the session's compiled program is reused; the sliding-window job uses a tiny Mistral.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import types

import jax
import pytest
from filelock import FileLock

from jspec.cli import generate
from jspec.jobs import batch
from jspec.config import ConfigError, GenerateConfig, KVConfig, SamplingConfig
from jspec.runtime import engine

MAX_NEW = 12
GEN = GenerateConfig(max_new_tokens=MAX_NEW, lookahead=2)
SAMPLING = SamplingConfig()


@pytest.fixture(scope="module")
def shipped(cache_dir):
    """The shipped pair, its batch-1 program compiled once (the lock lets one xdist worker compile while the
    other waits for the persistent cache)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    eng = engine.load()
    with FileLock(str(cache_dir) + ".lock"):
        eng.generate(["def f(x):"], GEN)
    return eng


# An engine whose settings all pass and that has no model: the path checks must refuse before any line is run.
NO_MODEL = types.SimpleNamespace(check=lambda gen: None)


def _run(eng, src, dst, **kw):
    return batch.run_job(eng, src, dst, GEN, SAMPLING, batch_size=1, progress=False, **kw)


def _write(path, lines: list[bytes], end: bytes = b"\n") -> None:
    path.write_bytes(b"".join(line + end for line in lines))


def _line(**rec) -> bytes:
    return json.dumps(rec, ensure_ascii=False).encode()


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


def _pairs(path) -> dict:
    """{(id, line): "text" or the error message}; fails if a line holds two records."""
    recs = _records(path)
    pairs = {(r["id"], r["line"]): r.get("error", "text") for r in recs}
    assert len(pairs) == len(recs), "a line was answered twice"
    return pairs


def test_bad_field_values_are_error_records_for_their_line(shipped, tmp_path, cli_run):
    """Class 1: a value outside what its device dtype holds is that line's error record (and a CLI error),
    never the end of the job; and a row the engine refuses unforeseen costs only that row."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [_line(id="a", prompt="def f1(x):"), _line(id="b", prompt="x", seed=-1),
                 _line(id="c", prompt="x", seed=2**40), _line(id="d", prompt="x", top_k=2**40),
                 _line(id="e", prompt="x", max_new_tokens=2**40), b'{"id": "f", "prompt": "x", "temperature": NaN}',
                 b'{"id": "g", "prompt": "x", "top_p": Infinity}', _line(id="h", prompt="x", temperature=1e-30),
                 _line(id="i", prompt="def f2(x):", seed=2**32 - 1, top_k=2**31 - 1)])  # the limits
    _run(shipped, src, dst)
    pairs = _pairs(dst)
    assert set(pairs) == {(i, n) for n, i in enumerate("abcdefghi", 1)}
    assert [k for k, v in pairs.items() if v == "text"] == [("a", 1), ("i", 9)]
    assert "seed must be in [0, 4294967295], got -1" in pairs["b", 2] and "seed" in pairs["c", 3]
    assert "top_k must be in" in pairs["d", 4] and "max_new_tokens must be in" in pairs["e", 5]
    assert "temperature must be finite" in pairs["f", 6] and "top_p must be finite" in pairs["g", 7]
    assert "temperature must be 0 (greedy) or >=" in pairs["h", 8]

    for flags, message in [(["--seed", "-1"], "seed must be in"), (["--seed", str(2**32)], "seed must be in"),
                           (["--top-k", str(2**40)], "top_k must be in"),
                           (["--max-new-tokens", str(2**40)], "max_new_tokens must be in")]:
        rc, _, err = cli_run("x", *flags)
        assert rc == 2 and err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err

    class Refusing:  # an engine that refuses any batch holding the prompt [666]: the job goes on without it
        def generate_ids(self, ids, rows, max_new, gen, stop=None):
            if [666] in ids:
                raise ConfigError("refused")
            return [(x, types.SimpleNamespace(healed="")) for x in ids]

        tokenizer = type("Tok", (), {"decode": staticmethod(lambda t, **kw: "t")})
        text = staticmethod(lambda t, stop=(), healed="": "t")

    jobs = [batch.Job(i, i + 1, "h", ids, 4, SAMPLING) for i, ids in enumerate([[5], [666], [7]])]
    recs = batch.answer(Refusing(), jobs, GEN, 4)
    assert [(r["line"], r.get("error", "text")) for r in recs] == [(1, "text"), (2, "refused"), (3, "text")]


def test_lines_split_on_newlines_only(shipped, tmp_path):
    """Class 2: JSON strings may hold U+2028, U+2029, U+0085 unescaped; only \\n (or \\r\\n) ends a line."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [_line(id="a", prompt="s = '\u2028'"), _line(id="b", prompt="t = '\u2029\u0085'"),
             b'{"id": "c", "prompt": "\x1c\x1d\x1e\x0b\x0c"}',  # raw control characters: invalid JSON, one line
             _line(id="d", prompt="def g(x):")]
    _write(src, lines, end=b"\r\n")
    _run(shipped, src, dst)
    pairs = _pairs(dst)
    assert set(pairs) == {("a", 1), ("b", 2), (None, 3), ("d", 4)}
    assert pairs[None, 3].startswith("invalid JSON") and [pairs[k] for k in (("a", 1), ("b", 2), ("d", 4))] == [
        "text"] * 3


def test_undecodable_line_is_its_own_error_record(shipped, tmp_path):
    """Class 3: bytes that are not UTF-8 cost their line only (the id is kept where it can be read)."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [_line(id="a", prompt="def f(x):"), b'{"id": "b", "prompt": "caf\xe9"}', b"\xff\xfe\x00",
                 b'{"id": "d", "prompt": "\xc0\xaf"}', _line(id="e", prompt="def h(y):")])
    summary = _run(shipped, src, dst)
    pairs = _pairs(dst)
    assert set(pairs) == {("a", 1), ("b", 2), (None, 3), ("d", 4), ("e", 5)}
    assert pairs["b", 2] == "line is not valid UTF-8 (byte 0xe9 at byte 27)"
    assert all("not valid UTF-8" in pairs[k] for k in ((None, 3), ("d", 4)))
    assert pairs["a", 1] == pairs["e", 5] == "text" and (summary.prompts, summary.errors) == (2, 3)


def test_output_that_is_not_ours_is_never_written(tmp_path):
    """Class 4: --output naming the input (also through a symlink or a hard link), or an existing file that a
    job did not write, is refused before anything is written; the files keep every byte."""
    src = tmp_path / "in.jsonl"
    _write(src, [_line(id="a", prompt="x"), b'{"id": "b", "prompt": "unterminated'], end=b"")
    (tmp_path / "link.jsonl").symlink_to(src)
    os.link(src, tmp_path / "hard.jsonl")
    (tmp_path / "sub").mkdir()
    before = src.read_bytes()
    for out in (src, tmp_path / "link.jsonl", tmp_path / "hard.jsonl", tmp_path / "sub" / ".." / "in.jsonl"):
        with pytest.raises(batch.JobError, match="is the --input file"):
            _run(NO_MODEL, src, out)
    assert src.read_bytes() == before

    foreign = {"notes.txt": b"some notes\nthe last line, unterminated",
               "other.jsonl": b'{"name": "x", "line": 1}\n{"name": "y"',
               "mixed.jsonl": _line(id="a", line=1, line_hash="0", text="t") + b"\nnot a record\n",
               "empty-first.jsonl": b"\n" + _line(id="a", line=1, line_hash="0", text="t") + b"\n"}
    for name, data in foreign.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(batch.JobError, match="is not a jspec results file"):
            _run(NO_MODEL, src, path, restart=True)
        assert path.read_bytes() == data, name


def test_resume_refuses_a_changed_input_and_a_second_writer(shipped, tmp_path):
    """Class 5: results are keyed by line number and fingerprint: a changed input is refused (--restart
    starts over), and a second job on a locked output is refused, never interleaved."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [_line(id="a", prompt="def f(x):"), _line(id="b", prompt="x", seed=-1)])
    _run(shipped, src, dst)
    assert _pairs(dst) == {("a", 1): "text", ("b", 2): "seed must be in [0, 4294967295], got -1"}
    done = dst.read_bytes()

    _write(src, [_line(id="new", prompt="class A:"), _line(id="a", prompt="def f(x):"),
                 _line(id="b", prompt="x", seed=-1)])  # a line inserted at the top
    for check in (lambda: batch.preflight(src, dst), lambda: _run(shipped, src, dst)):
        with pytest.raises(batch.JobError, match="the input has changed .*line 1 differs.*--restart"):
            check()
    assert dst.read_bytes() == done

    with batch.open_output(dst):  # another job holds the output
        for check in (lambda: batch.preflight(src, dst, restart=True), lambda: _run(shipped, src, dst, restart=True)):
            with pytest.raises(batch.JobError, match="another job is writing"):
                check()
    assert dst.read_bytes() == done

    _run(shipped, src, dst, restart=True)
    pairs = _pairs(dst)
    assert set(pairs) == {("new", 1), ("a", 2), ("b", 3)} and pairs["new", 1] == pairs["a", 2] == "text"
    summary = _run(shipped, src, dst)  # unchanged input: a plain resume with nothing left to do
    assert summary.skipped == 3 and set(_pairs(dst)) == set(pairs)


def test_rows_past_a_sliding_window_are_error_records(hf_model_dir, tmp_path):
    """Class 6: a row that does not fit a sliding window is its own error record, and the bucket padding of
    a prompt is not counted as context (a 17-token prompt pads to 32, which would not fit)."""
    model = tmp_path / "mistral"
    shutil.copytree(hf_model_dir("mistral"), model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"sliding_window": 48}))
    eng = engine.load(model, draft=None, kv=KVConfig("bf16"), mesh=None)
    assert eng.cfg.context == 48
    words = lambda n: " ".join(["x"] * n)  # n words of the tiny byte-level tokenizer: 2n - 1 tokens
    assert [len(eng.encode(words(n))) for n in (9, 13, 16)] == [17, 25, 31]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [_line(id="fits", prompt=words(9)), _line(id="long", prompt=words(16)),
                 _line(id="fits-too", prompt=words(13))])
    gen = GenerateConfig(max_new_tokens=20, lookahead=0)
    batch.run_job(eng, src, dst, gen, SAMPLING, batch_size=1, progress=False)
    pairs = _pairs(dst)
    assert set(pairs) == {("fits", 1), ("long", 2), ("fits-too", 3)}
    assert pairs["fits", 1] == pairs["fits-too", 3] == "text"
    assert pairs["long", 2] == ("prompt of 31 tokens + 20 new tokens + lookahead 0 + 1 exceeds the model's "
                                "context of 48 tokens")
    assert all(r["stats"]["new_tokens"] >= 1 for r in _records(dst) if "stats" in r)


def test_bom_unknown_fields_and_no_progress_bar_off_a_terminal(cli_run, tmp_path):
    """Class 12 (jobs): a UTF-8 BOM on the first line is no error; an unknown field (a typo such as
    max_new_token) is an error record, never a silent default; no progress bar when stderr is not a
    terminal; per-row stats name the KV bytes as the batch's."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + _line(id="a", prompt="def f(x):") + b"\r\n"
                    + _line(id="b", prompt="x", max_new_token=3) + b"\n")
    rc, out, err = cli_run("--input", src, "--output", dst)
    assert rc == 0 and out == ""
    pairs = _pairs(dst)
    assert set(pairs) == {("a", 1), ("b", 2)} and pairs["a", 1] == "text"
    assert pairs["b", 2].startswith("unknown field 'max_new_token' (known fields: id, prompt, max_new_tokens")
    assert err.splitlines()[-1].startswith("[summary: 1 prompts, 1 errors") and "row/s" not in err and "%|" not in err
    stats = _records(dst)[-1]["stats"]
    assert stats["batch_kv_bytes"] > 0 and "kv_bytes" not in stats


@pytest.fixture
def cli_run(capsys, cache_dir):
    """cli_run(*args) -> (exit status, stdout, stderr) of jspec.generate.main with the shapes of GEN."""

    def run(*args):
        capsys.readouterr()
        common = ["--max-new-tokens", str(MAX_NEW), "--lookahead", "2", "--batch-size", "1",
                  "--compile-cache", str(cache_dir)]
        rc = generate.main(common + [str(x) for x in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


# Hostile inputs, round three: one test per class.


def test_no_line_ends_the_job_whatever_its_bytes(shipped, tmp_path, cli_run):
    """A lone surrogate (valid JSON), an integer past Python's digit limit, nesting past the recursion limit and
    NaN or Infinity ids are each their line's error record; the job answers every other line. The library and
    the command line refuse a lone surrogate with one ConfigError / error line, not the tokenizer's TypeError."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [_line(id="a", prompt="def f(x):"), b'{"id": "b", "prompt": "x = \\ud800"}',
                 b'{"id": ' + b"7" * 5000 + b', "prompt": "x"}', b"[" * 100_000 + b"]" * 100_000,
                 b'{"id": NaN, "prompt": "x"}', b'{"id": "f", "prompt": "x", "seed": -Infinity}',
                 _line(id="g", prompt="def g(x):")])
    summary = _run(shipped, src, dst)
    pairs = _pairs(dst)
    assert set(pairs) == {("a", 1), ("b", 2), (None, 3), (None, 4), (None, 5), ("f", 6), ("g", 7)}  # no JSON, no id
    assert pairs["a", 1] == pairs["g", 7] == "text" and (summary.prompts, summary.errors) == (2, 5)
    assert "lone surrogate" in pairs["b", 2] and "digits" in pairs[None, 3] and "nested too deeply" in pairs[None, 4]
    assert "id must be standard JSON (no NaN or Infinity)" in pairs[None, 5] and "'seed' has the wrong type" in pairs["f", 6]
    assert all(json.loads(line) for line in dst.read_bytes().splitlines())  # standard JSON, every record
    with pytest.raises(ConfigError, match="lone surrogate"):
        shipped.generate(["\ud800"], GEN)
    rc, _, err = cli_run("x = \udcff")  # a command line argument that was not UTF-8 (surrogateescape)
    errors = [x for x in err.splitlines() if not x.startswith("jspec: ")]  # the loading phase's line aside
    assert rc == 2 and len(errors) == 1 and errors[0].startswith("error: the prompt is not valid Unicode"), err


def test_a_job_resumes_only_with_the_settings_its_output_was_made_with(shipped, tmp_path):
    """The settings a job's records depend on (models, drafter, dtype, KV cache, defaults such as
    max_new_tokens) are kept beside its output: a resume with others stops and names them; --restart starts
    over with the new ones."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [_line(id="a", prompt="def f(x):")])
    _run(shipped, src, dst)
    done = dst.read_bytes()
    other = dataclasses.replace(GEN, max_new_tokens=MAX_NEW + 1)
    run_other = lambda **kw: batch.run_job(shipped, src, dst, other, SAMPLING, batch_size=1, progress=False, **kw)
    with pytest.raises(batch.JobError, match="made with other settings .*generate differ.*--restart"):
        run_other()
    assert dst.read_bytes() == done
    _run(shipped, src, dst)  # the same settings: nothing left to do
    assert dst.read_bytes() == done
    run_other(restart=True)
    assert _pairs(dst) == {("a", 1): "text"} and dst.read_bytes() != done


def test_paths_that_are_not_regular_files_are_named_for_what_they_are(shipped, tmp_path, cli_run):
    """--input may be a pipe (read once); a directory or a device is an error naming it, before the model loads,
    and so is an --output that is a device (it would be read to its end) or in a missing directory; --model and
    --rotations likewise."""
    src = tmp_path / "in.jsonl"
    _write(src, [_line(id="a", prompt="def f(x):")])
    for args, message in [(("--input", "/dev/null", "--output", tmp_path / "o"), "is a character device"),
                          (("--input", tmp_path, "--output", tmp_path / "o"), "is a directory"),
                          (("--input", src, "--output", "/dev/zero"), "--output '/dev/zero' is a character device"),
                          (("--input", src, "--output", tmp_path / "no" / "o"), "--output's directory"),
                          (("x", "--model", "/dev/null"), "model directory '/dev/null' is a character device"),
                          (("x", "--rotations", tmp_path), "is a directory, not a regular file")]:
        rc, _, err = cli_run(*args)
        errors = [x for x in err.splitlines() if not x.startswith("jspec: ")]  # the loading phase's line aside
        assert rc == 2 and len(errors) == 1 and message in errors[0], err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(src.read_bytes()))
    writer.start()
    rc, _, err = cli_run("--input", fifo, "--output", tmp_path / "out.jsonl")
    writer.join()
    assert rc == 0 and "is a pipe, read once" in err and _pairs(tmp_path / "out.jsonl") == {("a", 1): "text"}


def test_a_closed_stdin_and_a_missing_gpu_are_one_error_line(tmp_path):
    """`-` with stdin closed, and JAX_PLATFORMS=cuda where JAX sees no GPU, are one error line each."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    run = lambda *args, **kw: subprocess.run([sys.executable, "-m", "jspec.generate", *args], capture_output=True,
                                             text=True, timeout=300, **kw)
    p = subprocess.run(["sh", "-c", f"exec {sys.executable} -m jspec.generate - <&-"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 2 and p.stderr == "error: '-' reads a prompt from stdin, but stdin is closed\n"
    if jax.default_backend() == "cpu":
        p = run("x", "--compile-cache", "", env=dict(env, JAX_PLATFORMS="cuda"))
        assert p.returncode == 2 and p.stderr.startswith("error: JAX_PLATFORMS=cuda, but JAX sees no GPU")
        assert len(p.stderr.splitlines()) == 1


def _fake_ray(monkeypatch):
    """A `ray` that is already initialised and has no GPUs: enough for a job whose lines are all answered."""
    fake = types.SimpleNamespace(is_initialized=lambda: True, cluster_resources=lambda: {})
    monkeypatch.setitem(sys.modules, "ray", fake)


def test_a_resume_without_its_settings_file_or_on_ray_with_other_settings_is_refused(shipped, tmp_path,
                                                                                      monkeypatch):
    """Class 1: an output whose settings file is missing or not a JSON object cannot be resumed (its records could be
    another run's), only restarted; a --ray job writes its settings and checks them on resume as well."""
    from jspec.jobs import ray_jobs

    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [_line(id="a", prompt="def f(x):")])
    _run(shipped, src, dst)
    done, settings = dst.read_bytes(), batch.settings_path(dst)
    for kept in (None, b"not json", b"[1, 2]"):
        settings.unlink() if kept is None else settings.write_bytes(kept)
        with pytest.raises(batch.JobError, match="holds results, but its settings file .*--restart"):
            _run(shipped, src, dst)
        assert dst.read_bytes() == done
    _run(shipped, src, dst, restart=True)
    assert _pairs(dst) == {("a", 1): "text"}
    _fake_ray(monkeypatch)
    ray_out = tmp_path / "ray.jsonl"
    shutil.copy(dst, ray_out)
    load = dict(model=None, draft="shipped", kv=KVConfig())
    run_ray = lambda load, **kw: ray_jobs.run_job(load, src, ray_out, GEN, SAMPLING, 1, progress=False, **kw)
    with pytest.raises(batch.JobError, match="holds results, but its settings file"):
        run_ray(load)
    block = {"record": [json.dumps(_records(dst)[0])], "stats": []}  # the cluster answers as the first run did
    monkeypatch.setattr(ray_jobs, "_blocks", lambda *args: iter([block]))
    run_ray(load, restart=True)
    assert json.loads(batch.settings_path(ray_out).read_text())["ray_load"]
    ray_out.write_bytes(done)
    run_ray(load)  # the same settings: resumed
    with pytest.raises(batch.JobError, match="made with other settings .*ray_load differ"):
        run_ray(load | {"model": str(tmp_path)})


def test_no_file_a_job_writes_is_its_input_in_any_spelling(tmp_path):
    """Class 2: neither the output nor its settings file (OUT.settings.json) may be the input, named directly, through
    a symbolic link or a hard link: refused before anything is written."""
    src, dst = tmp_path / "r.jsonl", tmp_path / "out.jsonl"
    _write(src, [_line(id="a", prompt="x")])
    (tmp_path / "link").symlink_to(src)
    os.link(src, tmp_path / "hard")
    settings = tmp_path / "s.jsonl.settings.json"
    shutil.copy(src, settings)
    for inp, out in [(src, src), (tmp_path / "link", src), (tmp_path / "hard", src), (src, tmp_path / "link"),
                     (settings, tmp_path / "s.jsonl"), (tmp_path / "sub" / ".." / "r.jsonl", src)]:
        (tmp_path / "sub").mkdir(exist_ok=True)
        before = inp.read_bytes()
        with pytest.raises(batch.JobError, match="is the --input file"):
            _run(NO_MODEL, inp, out)
        assert inp.read_bytes() == before
    (tmp_path / "new.settings.json").symlink_to(src)
    with pytest.raises(batch.JobError, match="settings file .*is the --input file"):
        _run(NO_MODEL, src, tmp_path / "new")


def test_a_batch_whose_caches_do_not_fit_shrinks_or_fails_its_line(hf_model_dir, monkeypatch):
    """Class 4: the KV caches are checked against the free memory before they are allocated (OutOfMemory, a
    ConfigError naming the batch); a job runs the rows of such a batch one at a time, and a row that does not fit
    alone is that line's error record."""
    from jspec.config import OutOfMemory
    from jspec.io import memory

    eng = engine.load(hf_model_dir("llama"), draft=None, kv=KVConfig("bf16"), dtype="float32", mesh=None)
    monkeypatch.setattr(memory, "device_available", lambda: None)
    monkeypatch.setattr(memory, "host_available", lambda: 1024)
    with pytest.raises(OutOfMemory, match="a batch of 1 rows at capacity .* GiB of KV cache"):
        eng.generate(["x"], GEN)

    class Tight:  # an engine where two rows do not fit and one does
        def generate_ids(self, ids, rows, max_new, gen, stop):
            if len(ids) > 1:
                raise OutOfMemory("a batch of 2 rows ...")
            return [([5], "stats")] * len(ids)

        def text(self, tokens, stop, healed=""):
            return "t"

    jobs = [batch.Job(i, i + 1, "h", [1], 2, SAMPLING) for i in range(3)]
    assert [r["text"] for r in batch.answer(Tight(), jobs, GEN, 2)] == ["t"] * 3
    Tight.generate_ids = lambda self, *a: (_ for _ in ()).throw(OutOfMemory("too big"))
    assert [r["error"] for r in batch.answer(Tight(), jobs, GEN, 2)] == ["too big"] * 3


def test_bad_job_paths_are_one_error_line_before_the_model_loads(tmp_path, cli_run):
    """Classes 9 and 10: an input or output that is a symbolic link loop, a settings path that is a directory and an
    output name too long for its settings file are one error line each, named for what they are, before loading."""
    src = tmp_path / "in.jsonl"
    _write(src, [_line(id="a", prompt="x")])
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "o.settings.json").mkdir()
    for args, message in [(("--input", tmp_path / "loop", "--output", tmp_path / "o2"), "is a symbolic link loop"),
                          (("--input", src, "--output", tmp_path / "loop"), "--output '"),
                          (("--input", src, "--output", tmp_path / "o"), "settings file '"),
                          (("--input", src, "--output", tmp_path / ("n" * 250)), "name is too long")]:
        rc, _, err = cli_run(*args, "--model", "/nonexistent")  # a model is never reached
        assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / ("n" * 250)).exists() and not (tmp_path / "o").exists()
