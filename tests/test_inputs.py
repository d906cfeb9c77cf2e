"""Hostile inputs to the CLI and the library (issue 15): each gets a one-line `error:` (status 2), a clear
ConfigError/ValueError, or a correct answer; never a traceback, a silent fallback or damaged output.

Most checks fail before any compile: on a tiny llama, or on flags checked before the model load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.cli import generate
from jspec.jobs import batch
from jspec.config import ConfigError, GenerateConfig, KVConfig, SamplingConfig
from jspec.model.sampling import Sampler, warp
from jspec.runtime import engine

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli_error(capsys):
    """cli_error(*args) -> the one-line message of a CLI run that must fail with status 2."""

    def run(*args):
        capsys.readouterr()
        rc = generate.main(["--compile-cache", ""] + [str(x) for x in args])  # a test's own flags come last
        out, err = capsys.readouterr()
        lines = [x for x in err.splitlines() if not x.startswith(("note:", "jspec: "))]  # notes and phases aside
        assert rc == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), (rc, err)
        return lines[0]

    return run


@pytest.fixture(scope="module")
def tiny(hf_model_dir):
    """An engine on the tiny llama (no draft, BF16 cache); nothing here compiles."""
    return engine.load(hf_model_dir("llama"), draft=None, kv=KVConfig("bf16"), mesh=None)


def _spawn(*args, env: dict | None = None) -> subprocess.Popen:
    env = os.environ | {"JAX_PLATFORMS": "cpu"} | (env or {})  # conftest's XLA_FLAGS: the persistent cache's key
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the child must not inherit SIG_IGN
    try:
        return subprocess.Popen([sys.executable, "-m", "jspec.generate", *map(str, args)], cwd=ROOT, env=env,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_stream_holds_back_incomplete_characters():
    """Class 7: a character whose bytes come in two rounds is shown once complete, never as U+FFFD."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "code-target")
    for text in ("s = 'é€😀'", "t = '\ufffd' + 'é'"):  # a real U+FFFD in the text is shown too
        ids = tok(text)["input_ids"]
        assert any(tok.decode(ids[:n]).endswith("\ufffd") for n in range(1, len(ids)))  # bytes do straddle
        for step in (1, 2, 3):  # rounds of 1, 2 or 3 tokens
            cuts = list(range(step, len(ids), step)) + [len(ids)]
            pieces = list(engine.text_pieces(tok, [(ids[:n], n == len(ids)) for n in cuts]))
            assert "".join(pieces) == text
            assert all(not p.endswith("\ufffd") for p in pieces)


def test_floats_are_finite_and_in_range(cli_error):
    """Class 8: NaN, infinite and out-of-range floats are refused (CLI: before the model load); a top_p that
    float32 flushes to zero keeps the top token instead of returning garbage."""
    bad = [(SamplingConfig(temperature=float("nan")), "temperature must be finite"),
           (SamplingConfig(temperature=float("inf")), "temperature must be finite"),
           (SamplingConfig(temperature=1e39), "temperature must be in"),
           (SamplingConfig(temperature=-0.5), "temperature must be in"),
           (SamplingConfig(temperature=1e-30), "temperature must be 0 (greedy) or >="),
           (SamplingConfig(top_p=float("nan")), "top_p must be finite"),
           (SamplingConfig(top_p=0.0), "top_p must be in (0, 1]"), (SamplingConfig(top_p=1.5), "top_p must be in"),
           (KVConfig(clip_k=float("nan")), "clip_k must be finite"), (KVConfig(clip_v=1.5), "clip_v must be in"),
           (KVConfig("bf16", clip_k=float("-inf")), "clip_k must be finite")]
    for cfg, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)):
            cfg.validate() if isinstance(cfg, SamplingConfig) else cfg.validate(head_dim=128)
    SamplingConfig(temperature=1e-4, top_p=1e-50).validate()

    logits = jnp.asarray([[1.0, 3.0, 2.0, 0.5], [0.0, 0.0, 5.0, 0.0]])
    probs = warp(logits, Sampler.make(2, 1.0, 0, 1e-50))  # 1e-50 is 0 in float32
    np.testing.assert_array_equal(np.asarray(probs), np.eye(4)[[1, 2]])

    for flag, value, message in [("--temperature", "nan", "temperature must be finite"),
                                 ("--temperature", "inf", "temperature must be finite"),
                                 ("--top-p", "nan", "top_p must be finite"), ("--clip-k", "nan", "clip_k must be"),
                                 ("--clip-v", "2", "clip_v must be in"),
                                 ("--compile-cache-gib", "nan", "--compile-cache-gib must be a positive size")]:
        assert message in cli_error("x", flag, value, "--model", "/nonexistent"), flag


def _edit_json(path: Path, fn) -> None:
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


def test_malformed_model_directories(hf_model_dir, tmp_path, cli_error):
    """Class 9: every malformed model directory is one `error:` line naming the file and the field."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    weights = lambda p: p / "model.safetensors"
    cases = {  # name -> (edit of a copy of the tiny llama, what the message must say)
        "config not an object": (lambda p: (p / "config.json").write_text("[1, 2]"),
                                 "config.json: must be a JSON object, got list"),
        "config not JSON": (lambda p: (p / "config.json").write_text('{"model_type": '),
                            "config.json: not valid JSON"),
        "missing field": (lambda p: _edit_json(p / "config.json", lambda c: _without(c, "hidden_size")),
                          "config.json: missing field 'hidden_size'"),
        "wrong type": (lambda p: _edit_json(p / "config.json", lambda c: c | {"num_hidden_layers": "2"}),
                       "config.json: field 'num_hidden_layers' must be a positive integer, got '2'"),
        "zero layers": (lambda p: _edit_json(p / "config.json", lambda c: c | {"num_hidden_layers": 0}),
                        "field 'num_hidden_layers' must be a positive integer, got 0"),
        "zero heads": (lambda p: _edit_json(p / "config.json", lambda c: c | {"num_attention_heads": 0}),
                       "field 'num_attention_heads' must be a positive integer"),
        "incomplete rope scaling": (
            lambda p: _edit_json(p / "config.json", lambda c: c | {"rope_parameters": llama3}),
            "config.json: missing field 'rope_parameters.low_freq_factor'"),
        "rope scaling not an object": (
            lambda p: _edit_json(p / "config.json", lambda c: _without(c, "rope_parameters") | {"rope_scaling": 8}),
            "field 'rope_scaling' must be an object"),
        "truncated weights": (lambda p: weights(p).write_bytes(weights(p).read_bytes()[:5000]),
                              "model.safetensors: not a readable safetensors file"),
        "garbage weights": (lambda p: weights(p).write_bytes(b"not safetensors at all" * 10),
                            "model.safetensors: not a readable safetensors file"),
        "garbage index": (lambda p: (p / "model.safetensors.index.json").write_text("[]"),
                          "model.safetensors.index.json: not a safetensors index"),
        "no tokenizer": (lambda p: [f.unlink() for f in p.glob("tokenizer*")], "no tokenizer files"),
    }
    for name, (edit, message) in cases.items():
        path = tmp_path / name.replace(" ", "-")
        shutil.copytree(hf_model_dir("llama"), path)
        edit(path)
        line = cli_error("x", "--model", path, "--draft", "none", "--compile-cache", "")
        assert message in line and str(path) in line, (name, line)
    for kv in ("bf16", "int2", "auto"):  # a named rotation file must exist, whatever the cache
        line = cli_error("x", "--model", hf_model_dir("llama"), "--kv", kv, "--rotations", tmp_path / "nope")
        assert "rotation file" in line and "does not exist" in line


def test_lookahead_bound_and_sigint_during_compile(hf_model_dir, cli_error):
    """Class 10: --lookahead is bounded (with the reason); Ctrl-C ends the process at once even while XLA
    compiles (here the K = 16 program's rounds, which take tens of seconds to compile on CPU beside its
    prefill; JAX's compile log says when the XLA compile starts)."""
    line = cli_error("x", "--lookahead", "17", "--model", "/nonexistent")
    assert "lookahead must be 'auto' or in [0, 16], got 17" in line and "compile time grows with K" in line

    model = hf_model_dir("llama")
    p = _spawn("--model", model, "--draft", model, "--lookahead", "16", "--max-new-tokens", "4",
               "--compile-cache", "", "x", env={"JAX_LOG_COMPILES": "1", "XLA_FLAGS": ""})  # LLVM optimizing: a long compile
    while not p.stderr.readline().startswith("Finished jaxpr to MLIR module conversion jit(_rounds)"):
        assert p.poll() is None
    time.sleep(1)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    elapsed = time.monotonic() - t0
    assert p.returncode == 130 and err.splitlines()[-1] == "interrupted" and out == "", (p.returncode, err)
    assert "Traceback" not in err
    assert elapsed < 5, f"the process took {elapsed:.1f}s to end after Ctrl-C"


def test_library_inputs(tiny, cli_error):
    """Class 11: prompts and per-row lists are checked, with a clear error; an empty prompt is an error in
    the library, the CLI and jobs alike."""
    assert tiny.generate([]) == []
    bad = [(("x",), {}, "prompts must be a list"), ((b"x",), {}, "prompts must be a list"),
           (([b"x"],), {}, "not bytes"), (([3.5],), {}, "not float"), (([None],), {}, "not NoneType"),
           (([[1, 2, 300]],), {}, "token ids must be integers in [0, 300), got 300"),
           (([[-1]],), {}, "got -1"), (([[1, 2.0]],), {}, "got 2.0"), (([[1, True]],), {}, "got True"),
           (([""],), {}, "empty prompt"), (([[]],), {}, "empty prompt"),
           ((["x"], GenerateConfig(max_new_tokens=-1)), {}, "max_new_tokens must be in"),
           ((["x"],), {"max_new_tokens": [-1]}, "max_new_tokens must be in"),
           ((["x"],), {"max_new_tokens": [4, 4]}, "max_new_tokens has 2 entries for 1 prompts"),
           ((["x"],), {"max_new_tokens": []}, "max_new_tokens has 0 entries for 1 prompts"),
           ((["x", "y"],), {"sampling": [SamplingConfig()]}, "sampling has 1 entries for 2 prompts"),
           ((["x"],), {"sampling": [None]}, "sampling must be a SamplingConfig"),
           ((["x"],), {"sampling": SamplingConfig(seed=-1)}, "seed must be in")]
    for args, kw, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            tiny.generate(*args, **kw)
    for prompt in (b"x", "", [999]):
        with pytest.raises(ConfigError):
            next(tiny.stream(prompt))
    assert tiny.prompt_ids(np.array([5, 6])) == [5, 6]

    assert cli_error("") == "error: empty prompt: give at least one token"
    _, message = batch.parse_line(b'{"id": 1, "prompt": ""}', tiny, GenerateConfig(), SamplingConfig())
    assert message == "empty prompt: give at least one token"


def test_broken_pipe_ends_quietly(cache_dir):
    """Class 12 (output): `| head` closing the pipe ends the process quietly, status 141."""
    p = _spawn("--json", "--max-new-tokens", "12", "--lookahead", "2", "--batch-size", "1",
               "--compile-cache", cache_dir, "def fibonacci(n):")
    p.stdout.close()  # the reader is gone before anything is written
    _, err = p.communicate(timeout=300)
    assert p.returncode == 141 and all(x.startswith("jspec: ") for x in err.splitlines()), err  # phases only


def test_compile_cache_is_bounded(cli_error, cache_dir):
    """Class 12 (disk): the persistent compilation cache gets a size bound (JAX evicts the least recently
    used programs past it)."""
    before = jax.config.jax_compilation_cache_max_size
    try:
        cli_error("x", "--model", "/nonexistent", "--compile-cache", cache_dir, "--compile-cache-gib", "3")
        assert jax.config.jax_compilation_cache_max_size == 3 * 2**30
    finally:
        jax.config.update("jax_compilation_cache_max_size", before)
