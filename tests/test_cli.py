"""The generate CLI and batch jobs on the shipped pair (CPU): output formats, stdin, streaming, JSONL jobs
with malformed lines, kill/Ctrl-C and resume, --help, and one-line errors for bad flags.

Compiling the decode program costs tens of seconds on two CPU cores, so every run here has the same shapes
(one row, short prompts, MAX_NEW new tokens, lookahead 2: the 32-token capacity bucket): the first compile is
reused in process (JAX's in-memory cache) and, through one persistent compilation cache per test session, by the
subprocesses and by the other xdist worker (a file lock lets one worker compile while the other waits).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from jspec.cli import generate
from jspec.jobs import batch
from jspec.config import GenerateConfig, SamplingConfig

ROOT = Path(__file__).resolve().parents[1]
MAX_NEW = 12
SHAPES = ["--max-new-tokens", str(MAX_NEW), "--lookahead", "2"]  # K = 2 compiles faster than 4
PROMPT = "def fibonacci(n):"
STATS = {"new_tokens", "rounds", "accept_length", "accept_rate", "kv_mode", "batch_kv_bytes", "compile_s",
         "decode_s"}


@pytest.fixture
def cli(capsys, cache_dir):
    """cli(*args) -> (exit status, stdout, stderr) of jspec.generate.main, run in this process."""

    def run(*args):
        capsys.readouterr()
        # the shared settings come first, so that a test's own flags override them
        common = [*SHAPES, "--batch-size", "1", "--compile-cache", str(cache_dir)]
        rc = generate.main(common + [str(x) for x in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture(scope="session")
def reference(cache_dir):
    """The --json record for PROMPT, compiled once per session (the lock serializes xdist workers)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    with FileLock(str(cache_dir) + ".lock"), contextlib.redirect_stdout(out):
        rc = generate.main(["--json", PROMPT, *SHAPES, "--compile-cache", str(cache_dir)])
    assert rc == 0
    return json.loads(out.getvalue())


def _spawn(cache_dir, *args, **kw) -> subprocess.Popen:
    # XLA_FLAGS (conftest's) kept: it is part of the persistent cache's key, which this process's programs share
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "jspec.generate", *SHAPES, "--batch-size", "1", "--compile-cache", str(cache_dir),
           *map(str, args)]
    # A shell's background job inherits SIGINT ignored, and so would the child (Ctrl-C test): a handler here
    # becomes the default disposition in the child, where Python then raises KeyboardInterrupt.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                **kw)
    finally:
        signal.signal(signal.SIGINT, previous)


def _records(path: Path) -> list[dict]:
    """Every line of a job's output; fails if one is not valid JSON."""
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------------
# prompts, output formats, streaming


def test_json_record(reference):
    r = reference
    assert set(r) == {"prompt", "text", "token_ids", "stats"} and r["prompt"] == PROMPT
    s = r["stats"]
    assert STATS <= set(s)
    assert 1 <= s["new_tokens"] == len(r["token_ids"]) <= MAX_NEW and r["text"]
    assert s["rounds"] >= 1 and s["lookahead"] == 2  # the shipped draft speculates
    assert 1.0 <= s["accept_length"] <= 3.0 and 0.0 <= s["accept_rate"] <= 1.0
    assert s["kv_mode"] in ("bf16", "int2") and s["batch_kv_bytes"] > 0 and "kv_bytes" not in s
    assert s["compile_s"] >= 0 and s["decode_s"] > 0


def test_text_output(cli, reference):
    rc, out, err = cli(PROMPT)
    assert rc == 0
    body, stats = out.removesuffix("\n").rsplit("\n", 1)
    assert body == PROMPT + reference["text"]  # greedy: the same continuation as --json
    assert stats.startswith(f"[{reference['stats']['new_tokens']} tokens, ") and "accept_rate" in stats
    assert f"kv {reference['stats']['kv_mode']}" in stats and "compile" in stats and "decode" in stats
    assert "Traceback" not in err


def test_stream_equals_generate(cli, reference):
    rc, out, _ = cli("--stream", PROMPT)
    assert rc == 0 and out == PROMPT + reference["text"] + "\n"


def test_several_prompts_and_summary(cli, reference):
    rc, out, err = cli("--json", PROMPT, "--prompt", PROMPT)
    assert rc == 0
    recs = [json.loads(x) for x in out.splitlines()]
    assert [r["text"] for r in recs] == [reference["text"]] * 2
    summary = json.loads(err.strip().splitlines()[-1])  # --json: the summary is JSON too, on stderr
    assert summary["prompts"] == 2 and summary["errors"] == 0
    assert summary["new_tokens"] == 2 * reference["stats"]["new_tokens"]
    assert {"wall_s", "tokens_per_s", "accept_length", "accept_rate", "kv_bytes", "compile_s"} <= set(summary)

    rc, out, err = cli(PROMPT, PROMPT)
    line = err.strip().splitlines()[-1]
    assert rc == 0 and line.startswith("[summary: 2 prompts, 0 errors,") and "tok/s" in line and "kv" in line


def test_stdin(cache_dir, reference):
    p = _spawn(cache_dir, "--json", "-", stdin=subprocess.PIPE)
    out, err = p.communicate(PROMPT + "\n", timeout=300)
    assert p.returncode == 0, err
    assert json.loads(out)["text"] == reference["text"]


# ------------------------------------------------------------------------------------------------
# batch jobs


def test_job_with_malformed_lines(cli, reference, tmp_path):
    lines = [
        json.dumps({"id": "a", "prompt": PROMPT}),
        '{"id": "b", "prompt": ',  # invalid JSON
        json.dumps({"id": "c"}),
        json.dumps({"id": "d", "prompt": 42}),
        json.dumps({"id": "e", "prompt": PROMPT, "max_new_tokens": "8"}),
        json.dumps({"id": "f", "prompt": "x = 1\n" * 5000}),  # longer than the 4096-token context
        "",  # empty lines get no record
        json.dumps({"id": "a", "prompt": PROMPT}),  # duplicate id
        json.dumps({"id": 7, "prompt": PROMPT, "max_new_tokens": MAX_NEW, "seed": 3}),
        json.dumps({"prompt": PROMPT}),  # no id
    ]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    rc, out, err = cli("--input", src, "--output", dst)
    assert rc == 0 and out == ""
    recs = {r["line"]: r for r in _records(dst)}
    assert len(recs) == len(_records(dst)) == 9 and 7 not in recs  # one record per non-empty line
    errors = {n: r["error"] for n, r in recs.items() if "error" in r}
    assert errors[2].startswith("invalid JSON") and errors[3] == "missing prompt"
    assert "prompt must be a string" in errors[4] and "'max_new_tokens' has the wrong type" in errors[5]
    assert "exceeds the model's context" in errors[6] and errors[8] == "duplicate id 'a'" and errors[10] == "missing id"
    assert [recs[n]["id"] for n in (1, 9)] == ["a", 7] and set(errors) == {2, 3, 4, 5, 6, 8, 10}
    for n in (1, 9):
        assert recs[n]["text"] == reference["text"] and recs[n]["token_ids"] == reference["token_ids"]
        assert STATS <= set(recs[n]["stats"])
    assert min(recs[n]["stats"]["compile_s"] for n in (1, 9)) == 0.0  # the second batch reused the program
    summary = err.strip().splitlines()[-1]
    assert summary.startswith("[summary: 2 prompts, 7 errors,") and "accept_length" in summary

    rc, _, err = cli("--input", src, "--output", dst, "--json")  # a re-run finds everything done
    assert rc == 0 and len(_records(dst)) == 9
    summary = json.loads(err.strip().splitlines()[-1])
    assert (summary["prompts"], summary["errors"], summary["skipped"]) == (0, 0, 9)


def _job(i, n_ids, max_new=MAX_NEW):
    return batch.Job(i, i + 1, "", list(range(n_ids)), max_new, SamplingConfig())


def test_partial_batch_is_padded_to_the_job_batch_size():
    class Engine:
        def generate_ids(self, ids, rows, max_new, gen, stop=None):
            self.shape = (len(ids), len(rows), max_new)
            return [(list(x), {}) for x in ids]

    eng, chunk = Engine(), [_job(0, 3), _job(1, 4), _job(2, 5)]
    assert [t for t, _ in batch.run_chunk(eng, chunk, GenerateConfig(), 8)] == [j.ids for j in chunk]
    assert eng.shape == (8, 8, [MAX_NEW] * 3 + [0] * 5)  # dummy rows, max_new 0: done at once
    batch.run_chunk(eng, chunk, GenerateConfig(), 3)
    assert eng.shape[0] == 3


def test_torn_last_record_is_cut_and_redone(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": "a", "line": 1, "line_hash": "h1", "text": "x"}) + "\n" + '{"id": "b", "li')
    with batch.open_output(out) as (_, done):
        assert done == {1: "h1"}
    assert out.read_text().endswith("\n") and len(_records(out)) == 1


def _wait_for_records(path: Path, n: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file() and path.read_text().count("\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} records before the job ended or timed out: {proc.poll()}")


def test_job_killed_interrupted_and_resumed(cli, cache_dir, reference, tmp_path):
    ids = [f"p{i}" for i in range(8)]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": f"def f{n}(x):"}) + "\n" for n, i in enumerate(ids)))

    p = _spawn(cache_dir, "--input", src, "--output", dst)
    _wait_for_records(dst, 1, p)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    killed = len(_records(dst))
    assert 1 <= killed < len(ids)

    p = _spawn(cache_dir, "--input", src, "--output", dst)  # resumes, then gets a Ctrl-C
    _wait_for_records(dst, killed + 1, p)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted; the output holds every finished record")
    interrupted = _records(dst)  # whole records only
    assert killed < len(interrupted) < len(ids)

    rc, _, _ = cli("--input", src, "--output", dst)
    recs = _records(dst)
    assert rc == 0 and sorted(r["id"] for r in recs) == ids  # exactly one record per id
    assert all("text" in r and r["stats"]["new_tokens"] >= 1 for r in recs)


def test_sigterm_ends_a_job_with_the_resume_hint(cache_dir, reference, tmp_path):
    """SIGTERM (kill, a scheduler's stop) says what Ctrl-C says, with status 143, and leaves whole records."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{n}", "prompt": f"def f{n}(x):"}) + "\n" for n in range(8)))
    p = _spawn(cache_dir, "--input", src, "--output", dst)
    _wait_for_records(dst, 1, p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted; the output holds every finished record")
    assert 1 <= len(_records(dst)) < 8


def test_phase_notes_and_the_log_go_above_the_progress_bar(capsys):
    """A note printed while a job's bar is drawn starts on a line of its own (tqdm.write clears the bar first),
    and so does a line of the library's log under -v."""
    import logging

    from tqdm import tqdm

    from jspec.cli import notes

    log = logging.getLogger("jspec")
    with tqdm(total=4, unit="row", file=sys.stderr) as bar:
        bar.update(1)
        notes.say("compiling")
        notes.verbose()
        try:
            log.info("decoded 3 tokens")
        finally:
            log.handlers.clear()
            log.setLevel(logging.NOTSET)
    err = capsys.readouterr().err
    for line in ("jspec: compiling ...\n", "jspec: decoded 3 tokens\n"):
        before = err[: err.index(line)]
        assert before.endswith("\r") and "/4 [" in before, err  # the bar drawn, cleared, then the note


def test_cli_and_library_names_agree():
    """--attn-impl and --rotation-mode (the library's attn_impl, rotation_mode) are --attn's and --rotation's."""
    a = generate.parser().parse_args(["--attn-impl", "reference", "--rotation-mode", "hadamard", "x"])
    b = generate.parser().parse_args(["--attn", "reference", "--rotation", "hadamard", "x"])
    assert (a.attn, a.rotation) == (b.attn, b.rotation) == ("reference", "hadamard")


# ------------------------------------------------------------------------------------------------
# --help and bad flags


def test_scan_layers_gives_the_same_tokens_in_float32(cli):
    """--scan-layers (the layer loop rolled; the CPU's default too, so here it checks the flag's plumbing) on the
    shipped pair: the default run's tokens (unrolled against rolled: test_layer_loop.py)."""
    runs = [cli("--json", "--dtype", "float32", *flag, PROMPT) for flag in ([], ["--scan-layers"])]
    assert [rc for rc, *_ in runs] == [0, 0]
    plain, scanned = (json.loads(out) for _, out, _ in runs)
    assert scanned["token_ids"] == plain["token_ids"] and len(plain["token_ids"]) == MAX_NEW


def test_help_lists_every_flag(cli):
    rc, out, _ = cli("--help")
    assert rc == 0
    flags = [s for action in generate.parser()._actions for s in action.option_strings]
    assert len(flags) > 25
    for action in generate.parser()._actions:
        assert action.help, f"{action.option_strings} is undocumented"
    for flag in flags + ["PROMPT"]:
        assert flag in out, flag
    design = ("--model --draft --kv --rotations --sink --recent --group-size --lookahead --max-new-tokens "
              "--temperature --top-k --top-p --seed --dtype --input --output --batch-size --json --stream "
              "--prompt --compile-cache")
    assert set(design.split()) <= set(flags)


def _imported(*argv) -> tuple[set[str], str]:
    """(top-level packages imported, stderr) of `python -X importtime -m ...argv` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", *argv], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in p.stderr.splitlines()
             if line.startswith("import time:")}
    return names, "\n".join(x for x in p.stderr.splitlines() if not x.startswith("import time:"))


def test_help_imports_neither_jax_nor_torch():
    names, _ = _imported("jspec.generate", "--help")
    assert "jspec" in names and not names & {"jax", "torch", "transformers"}


def test_calibrate_runs_without_a_runpy_warning():
    _, err = _imported("jspec.calibrate", "--help")
    assert "RuntimeWarning" not in err, err


def test_calibrate_on_a_terminal_says_each_phase(hf_model_dir, tmp_path):
    """On a terminal, jspec calibrate says what it loads and reads before its per-layer bar (off a terminal: only
    the bar's absence and the final line, as test_hostile's one-line errors need)."""
    import pty

    text = tmp_path / "a.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 20)
    master, terminal = pty.openpty()
    p = subprocess.run([sys.executable, "-m", "jspec.calibrate", "--model", str(hf_model_dir("llama")), "--data",
                        str(text), "--tokens", "64", "--seq-len", "32", "--out", str(tmp_path / "rot.safetensors")],
                       cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE, stderr=terminal,
                       timeout=300)
    os.close(terminal)
    err = b""
    with contextlib.suppress(OSError):  # EIO once the terminal's other end is closed and read out
        while chunk := os.read(master, 4096):
            err += chunk
    os.close(master)
    err = err.decode()
    assert p.returncode == 0, err
    assert "jspec: loading" in err and "jspec: reading up to 64 tokens from 1 file(s)" in err
    assert "calibrate" in err and "layer" in err and "wrote " in err


@pytest.fixture(scope="module")
def foreign_draft(tmp_path_factory):
    """The shipped draft with another (tiny) tokenizer."""
    from conftest import tiny_tokenizer

    path = tmp_path_factory.mktemp("foreign-draft")
    shutil.copytree(ROOT / "checkpoints" / "code-draft", path, dirs_exist_ok=True)
    for f in path.glob("tokenizer*"):
        f.unlink()
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def misfit_head(tmp_path_factory):
    """An EAGLE-3 head directory (recognised by its config) whose hidden size is not the shipped target's."""
    path = tmp_path_factory.mktemp("misfit-head")
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 8192}))
    return path


BAD = {
    "negative max-new-tokens": (["--max-new-tokens", "-3"], "max_new_tokens must be in [1, 2147483647], got -3"),
    "negative lookahead": (["--lookahead", "-1"], "lookahead must be 'auto' or in [0, 16], got -1"),
    "lookahead too large": (["--lookahead", "17"], "lookahead must be 'auto' or in [0, 16], got 17"),
    "lookahead not a number": (["--lookahead", "four"], "argument --lookahead: expected auto or an integer"),
    "ngram+ without a model": (["--draft", "ngram+"], "needs a draft model after the '+'"),
    "negative sink": (["--sink", "-1"], "sink must be in [0, 2147483647], got -1"),
    "zero recent": (["--recent", "0"], "recent must be in [1, 2147483647], got 0"),
    "zero batch size": (["--batch-size", "0"], "--batch-size must be >= 1"),
    "non-integer length": (["--max-new-tokens", "ten"], "argument --max-new-tokens: invalid int value"),
    "unknown kv mode": (["--kv", "int3"], "argument --kv: invalid choice: 'int3'"),
    "unknown flag": (["--speed", "9"], "unrecognized arguments: --speed 9"),
    "recent within lookahead": (["--kv", "int2", "--recent", "2"], "recent window 2 must exceed the lookahead 2"),
    "windows beyond the context": (["--kv", "int2", "--sink", "4000", "--recent", "512"],
                                   "sink 4000 + recent 512 exceed the model's context of 4096"),
    "group size": (["--kv", "int2", "--group-size", "48"], "group size 48 must divide head_dim 128"),
    "too many new tokens": (["--max-new-tokens", "5000"], "exceeds the model's context of 4096"),
    "bad top-p": (["--top-p", "0"], "top_p must be in (0, 1]"),
    "missing model directory": (["--model", "/nonexistent/model"], "/nonexistent/model"),
    "missing draft directory": (["--draft", "/nonexistent/draft"], "/nonexistent/draft"),
    "draft with another tokenizer": (["--draft", "FOREIGN"], "tokenizer differs from the target's"),
    "head that does not fit": (["--draft", "MISFIT"], "hidden_size 64 does not fit the target's hidden_size"),
    "input without output": (["--input", "in.jsonl"], "--input and --output go together"),
    "stream with json": (["--stream", "--json"], "does not combine with --json"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_flags_one_line_error(cli, foreign_draft, misfit_head, case):
    args, message = BAD[case]
    args = [{"FOREIGN": foreign_draft, "MISFIT": misfit_head}.get(a, a) for a in args]
    rc, out, err = cli(PROMPT, *args)
    assert rc == 2 and out == ""
    lines = [x for x in err.splitlines() if not x.startswith(("note:", "jspec: "))]  # notes and phases aside
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert "Traceback" not in err


def test_no_prompt_and_missing_input(cli, tmp_path):
    rc, _, err = cli()
    assert rc == 2 and err.startswith("error: give a prompt")
    rc, _, err = cli("--input", tmp_path / "none.jsonl", "--output", tmp_path / "out.jsonl")
    assert rc == 2 and err.strip().splitlines()[-1].startswith("error: ") and "none.jsonl" in err


def test_bad_flag_in_a_fresh_process(cache_dir):
    p = _spawn(cache_dir, PROMPT, "--kv", "int3")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and err.splitlines() == [
        "error: argument --kv: invalid choice: 'int3' (choose from 'auto', 'bf16', 'int2') (see --help)"]
