"""Hostile inputs to configs, checkpoints, rotation and cache files and the calibration CLI: one test per class
(numbered as in the issue). Each bad input is refused with one clear error naming the problem, or handled
correctly; never a traceback and never silently wrong output.

Tiny models (conftest.hf_model_dir) and, but for the mesh test (class 14: every draft mode on 4 fake devices, about
two minutes), no compiled decoding loop: these run in seconds on a CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import _BASE, VOCAB, _randomize, tiny_tokenizer
from safetensors.numpy import load_file, save_file

from jspec.config import ConfigError, GenerateConfig, KVConfig, ModelConfig, SamplingConfig, model_config_from_hf
from jspec.io import checkpoint, memory
from jspec.io.checkpoint import CheckpointError
from jspec.model import decoder as model, rotation
from jspec.runtime.buckets import capacity_bucket
from jspec.cli import calibrate
from jspec.model.calibrate import token_windows


def test_numpy_scalars_in_run_configs_become_python_numbers():
    """Class 15: np.int64(2) and friends pass validation and then behave as ints and floats everywhere."""
    gen = GenerateConfig(max_new_tokens=np.int32(8), lookahead=np.int64(2), stop_at_eos=True)
    sampling = SamplingConfig(temperature=np.float32(0.5), top_k=np.uint8(3), top_p=np.float64(0.9),
                              seed=np.int64(7))
    kv = KVConfig(sink=np.int16(4), recent=np.int64(32), group_size=np.int64(8), clip_k=np.float32(0.5))
    for cfg in (gen, sampling, kv):
        for name, value in vars(cfg).items():
            assert type(value) in (int, float, str, bool, tuple, type(None)), (name, type(value))
    gen.validate(), sampling.validate(), kv.validate(head_dim=16, lookahead=2)
    assert capacity_bucket(gen.max_new_tokens + gen.lookahead + 1, 256) == 16
    assert hash(gen) == hash(GenerateConfig(max_new_tokens=8, lookahead=2))


def _save_llama(path: Path, seed: int = 0, **kwargs):
    """A tiny random transformers Llama (float32) with config kwargs, saved with the tiny tokenizer at path."""
    torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")
    import transformers

    size = {"hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 2, "num_hidden_layers": 2}
    cfg = transformers.LlamaConfig(**_BASE | size | kwargs)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _randomize(hf, seed)
    hf.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return hf


def _hf_logits(hf, ids):
    torch = pytest.importorskip("torch", reason="needs PyTorch: install its CPU build (README, Tests)")

    with torch.no_grad():
        return hf(torch.tensor(ids)).logits.numpy()


def _edit_config(path: Path, **fields) -> Path:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | fields))
    return path


def test_configs_jspec_does_not_compute_are_refused_and_biases_are_computed(tmp_path, f32_matmul):
    """Class 2: attention_bias (q, k, v and o) and mlp_bias give transformers' logits; another hidden_act, or a
    tied model whose file holds a different lm_head.weight, is one error naming the field."""
    hf = _save_llama(tmp_path / "biased", attention_bias=True, mlp_bias=True)
    cfg, params, _ = checkpoint.load_model(tmp_path / "biased", jnp.float32, tokenizer=False)
    assert cfg.qkv_bias and cfg.o_bias and cfg.mlp_bias and params.layers.b_gu.shape[1:] == (2, 64)
    ids = np.random.default_rng(0).integers(4, VOCAB, (2, 12))
    got, _ = model.forward(params, cfg, jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(got), _hf_logits(hf, ids), atol=1e-4, rtol=0)
    saved = tmp_path / "saved"  # and back: save_hf writes what transformers reads as the same model
    checkpoint.save_hf(saved, params, cfg)
    assert checkpoint.load_model_config(saved) == cfg
    with pytest.raises(ConfigError, match="biases q, k, v and o together"):  # not expressible in config.json
        checkpoint.hf_config(dataclasses.replace(cfg, o_bias=False))

    for act in ("gelu", "relu", 3):
        with pytest.raises(ConfigError, match=f"field 'hidden_act' is {act!r}: jspec implements silu only"):
            model_config_from_hf(json.loads((tmp_path / "biased" / "config.json").read_text()) | {"hidden_act": act})
    with pytest.raises(ConfigError, match="field 'mlp_bias' must be true or false"):
        model_config_from_hf(json.loads((tmp_path / "biased" / "config.json").read_text()) | {"mlp_bias": "yes"})

    tied = tmp_path / "tied"
    _save_llama(tied, tie_word_embeddings=True)
    checkpoint.load_model(tied, jnp.float32, tokenizer=False)  # the file has no lm_head.weight: fine
    weights = load_file(tied / "model.safetensors")
    save_file(weights | {"lm_head.weight": weights["model.embed_tokens.weight"]}, tied / "model.safetensors")
    checkpoint.load_model(tied, jnp.float32, tokenizer=False)  # the same tensor twice: fine
    save_file(weights | {"lm_head.weight": weights["model.embed_tokens.weight"] + 1}, tied / "model.safetensors")
    with pytest.raises(CheckpointError, match="tie_word_embeddings but the checkpoint's lm_head.weight differs"):
        checkpoint.load_model(tied, jnp.float32, tokenizer=False)


def test_rope_scaling_is_applied_or_refused_whichever_key_holds_it(tmp_path, f32_matmul):
    """Class 3: linear rope scaling gives transformers' logits under either key; yarn, dynamic, longrope, su and
    mrope are refused naming the kind, wherever the block sits (transformers 5 writes a default rope_parameters
    into every config, beside which a rope_scaling was ignored); two blocks that disagree are refused."""
    hf = _save_llama(tmp_path / "linear", rope_scaling={"rope_type": "linear", "factor": 4.0})
    saved = json.loads((tmp_path / "linear" / "config.json").read_text())
    ids = np.random.default_rng(1).integers(4, VOCAB, (2, 40))
    ref = _hf_logits(hf, ids)
    theta = saved["rope_parameters"]["rope_theta"]
    spellings = {"rope_parameters": saved["rope_parameters"],  # as transformers 5 saved it
                 "rope_scaling": {"type": "linear", "factor": 4.0},  # 4.x, alone
                 "both": {"type": "linear", "factor": 4.0, "rope_theta": theta}}  # two blocks that agree
    for name, block in spellings.items():
        beside = {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": theta}} if name == "both" \
            else {"rope_parameters": None} if name == "rope_scaling" else {}
        _edit_config(tmp_path / "linear", **{"rope_scaling": block if name != "rope_parameters" else None} | beside)
        cfg, params, _ = checkpoint.load_model(tmp_path / "linear", jnp.float32, tokenizer=False)
        assert cfg.rope_linear == 4.0, name
        got, _ = model.forward(params, cfg, jnp.asarray(ids))
        np.testing.assert_allclose(np.asarray(got), ref, atol=1e-4, rtol=0, err_msg=name)

    default = {"rope_type": "default", "rope_theta": 10000.0}
    for kind in ("yarn", "dynamic", "longrope", "su", "mrope"):
        block = {"factor": 4.0, "original_max_position_embeddings": 64}
        for key, other in (("rope_scaling", default), ("rope_parameters", None), ("rope_scaling", None)):
            for spelling in ("type", "rope_type"):
                hf_cfg = saved | {key: block | {spelling: kind}}
                hf_cfg |= {"rope_parameters" if key == "rope_scaling" else "rope_scaling": other}
                with pytest.raises(ConfigError, match=f"field '{key}' asks for rope scaling '{kind}', which jspec "
                                                      "does not implement"):
                    model_config_from_hf(hf_cfg)
    with pytest.raises(ConfigError, match="'rope_scaling' and 'rope_parameters' disagree on rope_type"):
        model_config_from_hf(saved | {"rope_parameters": default, "rope_scaling": {"type": "linear", "factor": 2.0}})
    with pytest.raises(ConfigError, match="disagree on factor"):
        model_config_from_hf(saved | {"rope_scaling": saved["rope_parameters"] | {"factor": 2.0}})
    with pytest.raises(ConfigError, match="'rope_parameters.partial_rotary_factor' is 0.5"):
        model_config_from_hf(saved | {"rope_parameters": default | {"partial_rotary_factor": 0.5}})
    with pytest.raises(ConfigError, match="'partial_rotary_factor' is 0.25"):
        model_config_from_hf(saved | {"partial_rotary_factor": 0.25})


TINY = ModelConfig("llama", VOCAB, 32, 64, 2, 4, 2, 8)


def test_rotation_files_are_checked_at_load(tmp_path):
    """Class 5: a --rotations file that is garbage, truncated, or holds NaN, all-zero or non-orthogonal matrices
    is one error naming the file and the problem."""
    rot_k, rot_v = rotation.data_free_rotations(TINY, "hadamard")
    meta = rotation.make_meta(TINY, "hadamard", True, 0)
    good = tmp_path / "good.safetensors"
    rotation.save_rotations(good, rot_k, rot_v, meta)
    assert len(rotation.load_rotations(good, TINY)[0]) == 2
    blob = good.read_bytes()
    skewed = rot_k[1].copy()
    skewed[0, 0] *= 1.01
    cases = {"garbage": (b"not a safetensors file" * 9, "not a readable rotation file"),
             "truncated": (blob[: len(blob) // 2], "not a readable rotation file"),
             "empty": (b"", "not a readable rotation file"),
             "nan": ([r.copy() for r in rot_k[:1]] + [np.full_like(rot_k[1], np.nan)], "rot_k.1 holds NaN"),
             "zero": ([np.zeros_like(rot_k[0]), rot_k[1]], r"rot_k.0 is not orthogonal \(max \|R R\^T - I\| = 1 "),
             "skewed": ([rot_k[0], skewed], "rot_k.1 is not orthogonal")}
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            rotation.save_rotations(path, content, rot_v, meta)
        with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: {message}"):
            rotation.load_rotations(path, TINY)


def test_token_ids_past_the_vocabulary_load_and_only_their_use_is_refused(hf_model_dir, tmp_path, capsys):
    """Class 6: a tokenizer with an added token beyond the embedding loads (transformers runs such models: the id
    is never fed to the model); a prompt or stop string that uses it is one error line. An eos/bos id of
    config.json past vocab_size is one error at load."""
    import shutil

    import jspec
    from jspec.cli import generate

    path = tmp_path / "added"
    shutil.copytree(hf_model_dir("llama"), path)
    tok = copy.deepcopy(tiny_tokenizer())  # the cached one is shared by the session's models
    tok.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    tok.save_pretrained(path)
    eng = jspec.load(path, draft="none", kv=KVConfig("bf16"), dtype="float32")
    assert checkpoint.tokens_past_vocabulary(eng.tokenizer, eng.cfg.vocab_size) == {"<extra>": 300}
    gen = GenerateConfig(max_new_tokens=2)
    assert len(eng.generate(["hello"], gen)[0].token_ids) == 2
    with pytest.raises(ConfigError, match=re.escape("the prompt holds token '<extra>' (id 300), past the model's "
                                                    "vocabulary (vocab_size 300)")):
        eng.generate(["hello <extra>"], gen)
    with pytest.raises(ConfigError, match=re.escape("stop string '<extra>' is token id 300, past the model's")):
        eng.generate(["hello"], dataclasses.replace(gen, stop=("<extra>",)))
    args = ["--model", str(path), "--draft", "none", "--kv", "bf16", "--compile-cache", "", "--max-new-tokens", "2"]
    assert generate.main([*args, "hello <extra>"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the prompt holds token '<extra>' (id 300)")
    assert not any("Traceback" in line for line in err)
    good = json.loads((hf_model_dir("llama") / "config.json").read_text())
    for field, value in (("eos_token_id", 300), ("eos_token_id", [2, 301]), ("bos_token_id", 999)):
        with pytest.raises(ConfigError, match=f"field '{field}' holds {np.max(value)}, past the vocabulary"):
            model_config_from_hf(good | {field: value})


def _calibrate_error(capsys, *args) -> str:
    """The one `error:` line of a jspec.calibrate run that must fail with status 2."""
    capsys.readouterr()
    rc = calibrate.main([str(x) for x in args])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith("error: "), (rc, err)
    return err.strip()


def test_calibrate_overwrites_only_rotation_files_it_wrote(hf_model_dir, tmp_path, capsys):
    """Class 7: --out refuses any existing file that is not a jspec rotation file (the model's own weights
    first of all) and a directory; a rotation file is replaced, a new path written."""
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(hf_model_dir("llama"), model_dir)
    (tmp_path / "notes.txt").write_text("keep me")
    for out in (model_dir / "model.safetensors", model_dir / "config.json", tmp_path / "notes.txt", tmp_path):
        before = out.read_bytes() if out.is_file() else None
        line = _calibrate_error(capsys, "--model", model_dir, "--mode", "hadamard", "--out", out)
        assert str(out) in line and ("not a rotation file jspec wrote" in line or "is a directory" in line), line
        assert before is None or out.read_bytes() == before
    out = tmp_path / "new" / "rot.safetensors"
    for _ in range(2):  # written, then replaced
        assert calibrate.main(["--model", str(model_dir), "--mode", "hadamard", "--out", str(out)]) == 0
        assert rotation.is_rotation_file(out)


def test_calibrate_arguments_and_data_are_validated(hf_model_dir, tmp_path, capsys):
    """Class 10: non-positive sizes, data that is not UTF-8 and a glob that matches a directory are each one
    error naming the flag or the file (no traceback; --tokens -5 calibrated on a slice of the text)."""
    model = hf_model_dir("llama")
    text = tmp_path / "a.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 20)
    (tmp_path / "b.bin").write_bytes(b"\xff\xfe\x00 binary \x80")
    (tmp_path / "dir.txt").mkdir()
    out = tmp_path / "rot.safetensors"
    cases = [(("--tokens", "-5"), "--tokens must be in [1, "), (("--tokens", "0"), "--tokens must be in [1, "),
             (("--seq-len", "-1"), "--seq-len must be in [1, "), (("--batch-size", "0"), "--batch-size must be in"),
             (("--data", tmp_path / "b.bin"), "b.bin' is not UTF-8 text (invalid start byte at byte 0)"),
             (("--data", tmp_path / "*.txt"), "dir.txt', which is not a file"),
             (("--data", tmp_path / "dir.txt"), "dir.txt', which is not a file")]
    for flags, message in cases:
        line = _calibrate_error(capsys, "--model", model, "--out", out, "--data", text, *flags)
        assert message in line, (flags, line)
    assert not out.exists()
    with pytest.raises(ConfigError, match="seq_len must be in"):
        token_windows(None, [text], 100, 0, 1)
    assert calibrate.main(["--model", str(model), "--out", str(out), "--data", str(text), "--tokens", "64",
                           "--seq-len", "32"]) == 0
    assert rotation.load_rotations(out, checkpoint.load_model_config(model))[2]["calibration_tokens"] == "64"


def test_eagle3_head_configs_jspec_does_not_implement_are_refused():
    """Class 16: head config fields that jspec would ignore (layer ids of the wrong type loaded the default
    layers; num_hidden_layers 2 loaded one layer) are one error naming the field."""
    from jspec.io import eagle3
    from jspec.model.head import HeadConfig

    target = dataclasses.replace(TINY, num_layers=8)
    good = eagle3.hf_head_config(HeadConfig(dataclasses.replace(TINY, num_layers=1), VOCAB, (1, 4, 7)), target)
    assert eagle3.head_config_from_hf(good, target).taps == (1, 4, 7)
    top = {k: v for k, v in good.items() if k != "eagle_config"} | {"eagle_aux_hidden_state_layer_ids": [2, 3, 5]}
    assert eagle3.head_config_from_hf(top, target).taps == (2, 3, 5)
    ids = "eagle_aux_hidden_state_layer_ids"
    cases = [({"num_hidden_layers": 2}, "field 'num_hidden_layers' is 2: jspec's EAGLE-3 head has exactly one"),
             ({"eagle_config": {ids: "1,4,7"}}, f"field 'eagle_config.{ids}' must be a list of layer indices"),
             ({"eagle_config": {ids: 5}}, f"field 'eagle_config.{ids}' must be a list"),
             ({"eagle_config": {ids: [1.0, 4, 7]}}, f"field 'eagle_config.{ids}' must be a list"),
             ({"eagle_config": None, ids: {"a": 1}}, f"field '{ids}' must be a list"),
             ({"eagle_config": [1, 4, 7]}, "field 'eagle_config' must be an object"),
             ({"eagle_config": {ids: [1, 4, 7], "use_aux_hidden_state": False}}, "use_aux_hidden_state' is False"),
             ({"eagle_config": {ids: [1, 4, 9]}}, "must be 3 distinct indices in [0, 8]"),
             ({"attention_bias": True}, "field 'attention_bias' is true: jspec's EAGLE-3 head reads no biases"),
             ({"mlp_bias": True}, "field 'mlp_bias' is true"), ({"hidden_act": "gelu"}, "field 'hidden_act'")]
    for edit, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            eagle3.head_config_from_hf(good | edit, target)


def _header_file(path: Path, header: dict, data: bytes = b"\0" * 64) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_checkpoint_files_and_cache_paths_are_checked(hf_model_dir, tmp_path, monkeypatch):
    """Class 18: a safetensors header with float (or negative, or boolean) dimensions, and an index naming shards
    outside the model directory, are one CheckpointError naming the file; an empty or relative HOME or
    XDG_CACHE_HOME counts as unset (HOME="" put the cache at /.cache)."""
    import shutil

    bad = tmp_path / "bad.safetensors"
    for shape, offsets in (([2.0, 4], [0, 32]), ([-2, -4], [0, 32]), ([True, 4], [0, 16]), ("24", [0, 24]),
                           ([2, 4], [0.0, 32]), ([2, 4], [0])):
        _header_file(bad, {"w": {"dtype": "F32", "shape": shape, "data_offsets": offsets}})
        with pytest.raises(CheckpointError, match=f"{re.escape(str(bad))}: not a readable safetensors file .*must be "
                                                  "lists of non-negative integers"):
            checkpoint._shard(bad)

    sharded = tmp_path / "sharded"
    shutil.copytree(hf_model_dir("llama", sharded=True), sharded)
    index = sharded / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    name = next(iter(good["weight_map"]))
    for shard in ("/etc/passwd", "../llama/model.safetensors", "sub/../../x.safetensors", ""):
        index.write_text(json.dumps(good | {"weight_map": good["weight_map"] | {name: shard}}))
        with pytest.raises(CheckpointError, match=f"shard {re.escape(repr(shard))} is not a file inside the model"):
            checkpoint.load_model(sharded, tokenizer=False)

    import pwd

    from jspec.paths import cache_home, cache_root

    monkeypatch.delenv("JSPEC_CACHE_DIR", raising=False)
    own = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache"
    for home, xdg in (("", ""), ("", "relative/cache"), ("relative", None)):
        monkeypatch.setenv("HOME", home)
        monkeypatch.setenv("XDG_CACHE_HOME", xdg) if xdg is not None else monkeypatch.delenv("XDG_CACHE_HOME")
        assert cache_home() == own and cache_root() == own / "jspec"
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    assert cache_home().parent == Path(tempfile.gettempdir())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_home() == tmp_path
    env = os.environ | {"HOME": "", "XDG_CACHE_HOME": "", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", "from jspec.cli import generate; print(generate.cache_root())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(own / "jspec")


def test_malformed_lookahead_cost_files_are_measured_again(tmp_path, monkeypatch, capsys):
    """Class 11: a cost file that parses as JSON but does not hold the part's positive finite times (null, a string,
    a list, negative or zero costs, the wrong count) is treated as absent: measured again and replaced, with one
    warning line however many files are bad (negative costs chose K = 16)."""
    from types import SimpleNamespace

    from jspec.runtime import lookahead

    monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(lookahead.programs, "compile_all", lambda lowered, options: [None] * len(lowered))
    timed = []
    monkeypatch.setattr(lookahead, "_time", lambda run, loop: timed.append(loop) or 0.25)
    loops = lambda n: lambda: [SimpleNamespace(lowered="a timed loop", options=None) for _ in range(n)]
    parts = {"verify": ({"part": "verify", "probe": "hostile"}, 3, loops(3)),
             "draft": ({"part": "draft", "probe": "hostile"}, 1, loops(1))}
    assert lookahead._cached({}, parts) == {"verify": [0.25] * 3, "draft": [0.25]} and len(timed) == 4
    files = {f.name.partition("-")[0]: f for f in (tmp_path / "lookahead").glob("*.json")}
    assert sorted(files) == ["draft", "verify"]
    capsys.readouterr()
    for content in ('{"value": null}', '"abc"', "[]", '{"value": [-1.0, -1.0, -1.0]}', '{"value": [0, 0, 0]}',
                    '{"value": [0.1, 0.2]}', '{"value": [NaN, 1, 1]}', '{"value": [true, 1, 1]}', "{", "\udcff"):
        for f in files.values():
            f.write_text(content, errors="surrogateescape")
        timed.clear()
        assert lookahead._cached({}, parts) == {"verify": [0.25] * 3, "draft": [0.25]}, content
        assert len(timed) == 4, content  # measured again
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("warning: ignored 2 malformed lookahead cost file(s)"), err
        assert json.loads(files["verify"].read_text())["value"] == [0.25] * 3  # replaced
    timed.clear()
    assert lookahead._cached({}, parts)["verify"] == [0.25] * 3 and not timed and capsys.readouterr().err == ""


def test_program_store_reads_only_entries_no_one_else_can_write(tmp_path, monkeypatch, capsys):
    """Class 17: a store entry (a pickle: reading it runs code) is read only when it and its directory are this
    user's and writable by no one else, as ssh treats keys; else it is compiled again, with one warning line."""
    import pickle

    from jspec.runtime import programs

    class Payload:  # what a crafted entry does when unpickled: here, make a directory
        def __reduce__(self):
            return os.mkdir, (str(tmp_path / "ran"),)

    store = tmp_path / "jspec-programs"
    store.mkdir(mode=0o700)
    store.chmod(0o700)
    entry = store / f"crafted{programs.SUFFIX}"
    entry.write_bytes(pickle.dumps(Payload()))
    warned = f"warning: not reading compiled programs from {store}: "
    for file_mode, dir_mode, message in ((0o666, 0o700, f"file {entry} is writable by other users"),
                                         (0o620, 0o700, None),  # the same problem: warned once
                                         (0o600, 0o777, f"directory {store} is writable by other users")):
        entry.chmod(file_mode)
        store.chmod(dir_mode)
        assert programs._read(entry) is None and not (tmp_path / "ran").exists()
        err = capsys.readouterr().err
        assert err == "" if message is None else err.startswith(warned + message) and err.count("\n") == 1, err
    store.chmod(0o700)
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    assert programs.untrusted(entry) == f"file {entry} is owned by another user"
    monkeypatch.setattr(os, "getuid", lambda: uid)
    link = store / f"link{programs.SUFFIX}"
    link.symlink_to(entry)
    assert programs.untrusted(link) == f"{link} is not a regular file"
    assert programs.untrusted(entry) is None  # owner-only: unpickled (the payload runs: what the checks prevent)
    assert programs._read(entry) is None and (tmp_path / "ran").is_dir()

    programs._write(tmp_path / "new" / f"x{programs.SUFFIX}", b"blob")  # the store is written owner-only
    assert (tmp_path / "new").stat().st_mode & 0o077 == 0
    assert (tmp_path / "new" / f"x{programs.SUFFIX}").stat().st_mode & 0o077 == 0


def test_a_model_larger_than_memory_is_refused_before_it_is_read(hf_model_dir, monkeypatch):
    """Class 9: weights larger than the free host or device memory are one error saying what would fit, before a
    byte of them is read (read anyway, they took memory until the process was killed)."""
    GiB = 2**30
    memory.check_memory(8 * GiB, 9 * GiB, None, jnp.bfloat16, "m")  # fits; unknown device memory
    memory.check_memory(8 * GiB, None, None, jnp.bfloat16, "m")
    with pytest.raises(CheckpointError, match=re.escape("m: its weights take 16.0 GiB in bfloat16, more than the "
                                                        "8.0 GiB of host memory available: a model of at most 4.29B "
                                                        "parameters fits")):
        memory.check_memory(16 * GiB, 8 * GiB, 80 * GiB, jnp.bfloat16, "m")
    with pytest.raises(CheckpointError, match=re.escape("in float32 (--dtype bfloat16 halves it), more than the 4.0 "
                                                        "GiB of device memory available")):
        memory.check_memory(8 * GiB, 64 * GiB, 4 * GiB, jnp.float32, "m")
    assert memory.host_available() is None or memory.host_available() > 0

    model = hf_model_dir("llama")
    cfg = checkpoint.load_model_config(model)
    need = checkpoint.weight_bytes(checkpoint.open_tensors(model), jnp.float32)
    assert need == 4 * sum(x.size for x in jax.tree.leaves(checkpoint.host_params(model, cfg, jnp.float32)))
    monkeypatch.setattr(memory, "host_available", lambda: need - 1)
    monkeypatch.setattr(checkpoint, "host_params", None)  # reading would fail
    with pytest.raises(CheckpointError, match=f"{re.escape(str(model))}: its weights take .* of host memory"):
        checkpoint.load_model(model, jnp.float32)


# A process that turns on the compilation cache at argv[1] and runs a tiny program there (one more with argv[2]
# "ro": a program the cache lacks), seeing argv[1] as read-only when argv[2] is "ro" and it runs as root (root may
# write anywhere, so os.access, which jspec asks, is told otherwise). Prints its cache hits and compile requests.
_CACHED_RUN = """
import json, os, sys
import jax, numpy as np
ro = sys.argv[2:] == ["ro"]
if ro and os.getuid() == 0:
    real = os.access
    os.access = lambda p, mode, **k: not (mode & os.W_OK and str(p).startswith(sys.argv[1])) and real(p, mode, **k)
seen = []
jax.monitoring.register_event_listener(lambda event, **_: seen.append(event.rsplit("/", 1)[-1]))
from jspec.runtime.startup import compile_cache
compile_cache.use_compile_cache(sys.argv[1])
jax.jit(lambda x: np.float32(3) * x + 1)(np.arange(4, dtype=np.float32)).block_until_ready()
counts = dict(hits=seen.count("cache_hits"), requests=seen.count("compile_requests_use_cache"))
if ro:
    jax.jit(lambda x: x * 7)(np.arange(3)).block_until_ready()
print(json.dumps(counts))
"""


def test_a_torn_compile_cache_entry_is_replaced_and_a_read_only_cache_is_read(tmp_path):
    """Class 8: JAX writes a cache entry in place, and skips a key whose file exists: an entry torn by a killed
    process was read, warned about and compiled again at every run. The next run replaces it (one warning line) and
    the run after reads it, silently. A warm cache this process cannot write (os.access) is read, every program a
    hit, without writing a byte (a bounded JAX cache takes a write lock to read, which fails there), with one line
    for a program it lacks. jspec's own program store (GPU only) overwrites a torn entry."""
    import stat

    cache = tmp_path / "xla"
    env = dict(os.environ, JAX_PLATFORMS="cpu")

    def run(*args):
        p = subprocess.run([sys.executable, "-c", _CACHED_RUN, str(cache), *args], env=env, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout), p.stderr.splitlines()

    first, err = run()
    assert first["hits"] == 0 and first["requests"] > 0 and err == []
    [entry] = [f for f in cache.glob("jit__lambda-*-cache")]
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2])  # a write cut short
    counts, err = run()
    assert len(err) == 1 and re.fullmatch(r"warning: the compile cache .* held a damaged entry \(jit__lambda-.*\): "
                                          "compiled again and replaced", err[0]), err
    assert len(entry.read_bytes()) == len(whole)
    assert run() == (dict(hits=first["requests"], requests=first["requests"]), [])

    files = lambda: {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in cache.iterdir()}
    before = files()
    for f in (*cache.iterdir(), cache):
        f.chmod(f.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        counts, err = run("ro")
    finally:
        for f in (cache, *cache.iterdir()):
            f.chmod(f.stat().st_mode | stat.S_IWUSR)
    assert counts == dict(hits=first["requests"], requests=first["requests"]) and files() == before
    assert err == [(f"warning: the compile cache {cache} is read-only: compiling the programs it lacks without "
                    "keeping them")]

    from jspec.runtime import programs

    kept = tmp_path / "programs" / f"torn{programs.SUFFIX}"
    programs._write(kept, b"a program cut short")
    kept.write_bytes(kept.read_bytes()[:7])
    assert programs._read(kept) is None  # compiled again, then kept whole over it:
    programs._write(kept, b"the program")
    assert kept.read_bytes() == b"the program"


def test_every_draft_mode_runs_on_a_mesh_with_fixed_and_auto_lookahead(tmp_path):
    """Class 14: on a ("dp", "tp") mesh of 4 devices, every draft mode (none, model, ngram, ngram+model, head) decodes
    with a fixed K and with "auto", and gives plain decoding's greedy tokens. (auto's cost measurement fed a timed
    loop's carry back to it, and a BF16 cache's zero-size INT2 arrays came back replicated, not split over "dp": the
    next call refused them.) 4 fake CPU devices need a process of their own (XLA_FLAGS before jax starts)."""
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu", JSPEC_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, __file__, "mesh"], env=env, capture_output=True, text=True, timeout=900,
                       cwd=Path(__file__).parent)
    assert p.returncode == 0, p.stderr[-4000:]
    tokens = json.loads(p.stdout.strip().splitlines()[-1])
    plain = tokens.pop("none/0")
    assert len(tokens) == 8 and all(got == plain for got in tokens.values()), (plain, tokens)


def _draft_modes_on_a_mesh() -> dict:
    """{"mode/K": greedy tokens of a 3-row batch} on a tp=2,dp=2 mesh (tests/test_sharding.py's tiny models, an INT2
    target cache and a random EAGLE-3 head); K "auto" is chosen from costs measured here."""
    from test_sharding import _models

    from jspec.config import GenerateConfig, KVConfig, SamplingConfig
    from jspec.decode.state import Drafter, DraftMode
    from jspec.model import head
    from jspec.runtime import sharding
    from jspec.runtime.startup import compile_cache
    from jspec.runtime.engine import Engine

    assert jax.device_count() == 4, jax.devices()
    compile_cache.use_compile_cache(Path(os.environ["JSPEC_CACHE_DIR"]) / "xla")  # programs the modes share
    cfg, _, rotated, draft_cfg, draft = _models()
    hcfg = head.HeadConfig(head.layer_config(cfg, 2, 1, 48), cfg.vocab_size, (0, 1, 2))
    drafters = {DraftMode.NONE: Drafter(), DraftMode.NGRAM: Drafter(mode=DraftMode.NGRAM),
                DraftMode.HEAD: Drafter(head=head.init_head(hcfg, jax.random.key(3), std=0.3), mode=DraftMode.HEAD,
                                        head_cfg=hcfg)}
    for mode in (DraftMode.MODEL, DraftMode.NGRAM_MODEL):
        drafters[mode] = Drafter(draft, mode=mode, model_cfg=draft_cfg)
    rng = np.random.default_rng(0)
    ids = [rng.integers(3, 96, n).tolist() for n in (5, 12, 3)]  # 3 rows: dp=2 pads a fourth
    mesh, tokens = sharding.make_mesh("tp=2,dp=2", cfg), {}
    for mode, drafter in drafters.items():
        eng = Engine(cfg=cfg, params=rotated, tokenizer=None, kv=KVConfig("int2", sink=4, recent=4), drafter=drafter,
                     dtype="float32", attn_impl="reference", mesh=mesh)
        for K in (0,) if mode == DraftMode.NONE else (2, "auto"):
            gen = GenerateConfig(max_new_tokens=10, lookahead=K)
            tokens[f"{mode}/{K}"] = [t for t, _ in eng.generate_ids(ids, [SamplingConfig()] * 3, [10] * 3, gen)]
    return tokens


if __name__ == "__main__" and sys.argv[1:] == ["mesh"]:
    print(json.dumps(_draft_modes_on_a_mesh()))
