"""Start-up: weights laid out on the host and put on the device once, capacity buckets that let one
compiled program serve many requests, and a CLI that never imports torch."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import VOCAB
from safetensors import safe_open

from jspec.cache import kvcache
from jspec.jobs import batch
from jspec.config import GenerateConfig, KVConfig, ModelConfig, Options, SamplingConfig, load_model_config
from jspec.decode import loop as decode
from jspec.io import checkpoint, tokenizer
from jspec.model import decoder as model
from jspec.runtime import buckets, engine, programs
from jspec.runtime.startup import compile_cache
from jspec.decode.state import Drafter, DraftMode

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [ROOT / "checkpoints" / "code-target", ROOT / "checkpoints" / "code-draft"]


def _device_loader(model_dir: Path, cfg, dtype):
    """The loader jspec had before host-side loading (safetensors' flax reader and jnp ops, one small device
    program per step), kept as the reference the host-side loader must reproduce bit for bit."""
    tensors = checkpoint.open_tensors(model_dir)
    handles = {}

    def read(name, transpose):
        shard, key = tensors[name]
        if shard not in handles:
            handles[shard] = safe_open(shard, "flax")
        x = handles[shard].get_tensor(key)
        return jnp.asarray(x.T if transpose else x, dtype)

    layers = []
    for i in range(cfg.num_layers):
        fields = {}
        for field in checkpoint.layer_shapes(cfg):
            names, t = checkpoint.LAYER_NAMES[field]
            parts = [read(f"model.layers.{i}.{name}", t) for name in names]
            fuse = {"wqkv": lambda p: model.fuse_qkv(*p, cfg), "bqkv": lambda p: model.fuse_qkv(*p, cfg),
                    "w_gu": lambda p: jnp.stack(p, axis=-2)}.get(field, lambda p: p[0])
            fields[field] = fuse(parts)
        layers.append(model.Layer(**fields))
    head = None if cfg.tie_embeddings else read("lm_head.weight", True)
    embed, norm = read("model.embed_tokens.weight", False), read("model.norm.weight", False)
    return model.Params(embed, model.stack_layers(layers), norm, head)


def _dirs():
    return [(f, False) for f in ("llama", "llama3", "mistral", "qwen2", "qwen3")] + [("llama", True)] + SHIPPED


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("where", _dirs(), ids=lambda w: w.name if isinstance(w, Path) else w[0] + "_sharded" * w[1])
def test_host_loader_is_bitwise_the_device_loader(hf_model_dir, where, dtype):
    path = where if isinstance(where, Path) else hf_model_dir(*where)
    cfg = load_model_config(path)
    got, want = checkpoint.load_params(path, cfg, dtype), _device_loader(path, cfg, dtype)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert isinstance(a, jax.Array) and a.dtype == b.dtype == dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_loading_compiles_no_device_program(hf_model_dir):
    """The whole tree goes to the device in one transfer: no per-weight transpose, cast or concatenate."""
    path = hf_model_dir("qwen2")  # q/k/v biases, tied embeddings: every fusion path
    cfg = load_model_config(path)
    checkpoint.load_params(path, cfg, jnp.bfloat16)  # warm: imports, caches
    with jax.log_compiles(True), _count_compiles() as count:
        checkpoint.load_model(path, jnp.bfloat16)
    assert count() == 0


class _count_compiles:
    """Counts XLA compilations logged while active (jax.log_compiles logs each one)."""

    def __enter__(self):
        import logging

        self.records = []
        handler = logging.Handler()
        handler.emit = lambda r: self.records.append(r) if "Finished XLA compilation" in r.getMessage() else None
        self.handler, self.logger = handler, logging.getLogger("jax")
        self.logger.addHandler(handler)
        return lambda: len(self.records)

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)


# ------------------------------------------------------------------------------------------------
# capacity buckets: one compiled program per bucket


def test_capacity_buckets_bound_the_memory_cost():
    grid = [buckets.capacity_bucket(n, 1 << 20) for n in range(1, 70000)]
    for n, b in enumerate(grid, 1):
        assert b >= n and b % 16 == 0
        assert (b - n <= 15) if n <= 128 else (b / n < 1.125), (n, b)
    assert grid == sorted(grid)
    for lo in (128, 1024, 32768):  # eight buckets per power of two
        assert len({b for n, b in enumerate(grid, 1) if lo < n <= 2 * lo}) == 8
    assert buckets.capacity_bucket(2309, 1 << 20) == 2560 and buckets.capacity_bucket(2309, 2400) == 2400
    assert all(b % 256 == 0 for n, b in enumerate(grid, 1) if n > 2048)  # kvcache.ALIGN


CFG = ModelConfig("llama", VOCAB, 32, 64, 1, 4, 2, 8, max_position=512)  # no EOS: rows run to max_new
DRAFT = ModelConfig("llama", VOCAB, 16, 32, 1, 2, 1, 8, max_position=512)
K = 2


@pytest.fixture
def eng(monkeypatch):
    """A tiny int2 target + draft engine with no compiled program yet. Its generate program's parts are
    compiled without LLVM optimisation, as test_speculative's."""
    from conftest import tiny_tokenizer

    lower = engine.lower_parts

    def fast(args):
        parts = lower(args, jax.jit(decode._start, donate_argnums=(6, 7)), jax.jit(decode._rounds, donate_argnums=4),
                      jax.jit(decode.draft_prefill, donate_argnums=3))
        fast_compile = lambda x, compiler_options=None: x.compile({**(compiler_options or {}),
                                                                   "xla_backend_optimization_level": 0})
        return [types.SimpleNamespace(compile=functools.partial(fast_compile, x)) for x in parts]

    monkeypatch.setattr(engine, "lower_parts", fast)
    tok = tokenizer.Tokenizer(tiny_tokenizer().backend_tokenizer, {"eos_token": "</s>"})
    kv = KVConfig("int2", sink=4, recent=8)
    drafter = Drafter(model.init_params(DRAFT, jax.random.key(1), std=0.3), mode=DraftMode.MODEL, model_cfg=DRAFT)
    return engine.Engine(CFG, model.init_params(CFG, jax.random.key(0), std=0.3), tok, kv, drafter, dtype="float32")


def _run(eng, lengths, max_new):
    ids = [[(7 * n + i) % VOCAB for i in range(n)] for n in lengths]
    return eng.generate_ids(ids, [SamplingConfig()] * len(ids), list(max_new), GenerateConfig(lookahead=K))


def test_one_program_serves_a_bucket(eng):
    first = _run(eng, (5, 9), (6, 3))  # needs 5 + 6 + 3 = 14 and 9 + 3 + 3 = 15: the 16-token bucket
    assert len(eng._compiled) == 1 and first[0][1].compile_s > 0
    again = _run(eng, (2, 7), (10, 4))  # other prompt lengths and max_new, same bucket
    assert len(eng._compiled) == 1 and [st.compile_s for _, st in again] == [0.0, 0.0]
    assert [len(t) for t, _ in again] == [10, 4] and [len(t) for t, _ in first] == [6, 3]
    _run(eng, (12, 1), (3, 1))  # 12 + 3 + 3 = 18: the next bucket, a second program
    assert len(eng._compiled) == 2


def test_a_new_bucket_compiles_its_parts_and_its_caches_only(eng, caplog):
    """Arguments are made on the host and each cache in one program: a call in a new bucket compiles the
    prefill, the rounds, the draft's prefill and one zeros program per new cache shape, no program per buffer
    or argument."""
    # three rows: shapes no other test compiles (this process keeps compiled programs by their module)
    _run(eng, (5, 9, 2), (6, 3, 1))
    jax.config.update("jax_log_compiles", True)  # for every thread (jax.log_compiles() is this thread's only)
    try:
        with caplog.at_level(logging.WARNING):
            _run(eng, (12, 1, 4), (3, 1, 2))  # the next bucket
    finally:
        jax.config.update("jax_log_compiles", False)
    # the draft's BF16 cache keeps its shape (its window is aligned to 256 slots): one zeros program
    assert sorted(re.findall(r"Finished XLA compilation of jit\((\S+?)\)", caplog.text)) == [
        "_rounds", "_start", "_zeros", "draft_prefill"]


def test_the_parts_end_where_the_one_program_ends(eng):
    """Engine.compile's three parts, the draft's prefill, the target's and the rounds from its state, leave the
    one generate program's final state: tokens, counts, rounds and accepted drafts (a draft cache left unfilled
    would change those), greedy and sampled. The draft: the target with its weights scaled, so that some drafts
    are accepted and some are not."""
    drafter = Drafter(jax.tree.map(lambda x: 1.1 * x, eng.params), mode=DraftMode.MODEL, model_cfg=CFG)
    eng = dataclasses.replace(eng, drafter=drafter, _compiled={})
    ids = [[(7 * n + i) % VOCAB for i in range(n)] for n in (5, 9)]
    sampled = [SamplingConfig(temperature=0.8, seed=3), SamplingConfig(temperature=1.0, top_k=5, seed=4)]
    for rows in ([SamplingConfig()] * 2, sampled):
        prepare = lambda: eng.prepare(ids, rows, [6, 3], GenerateConfig(lookahead=K))  # noqa: B023
        two = eng.compile(prepare())[0](*prepare())  # each run donates its caches: fresh arguments
        one = decode.generate_program(*prepare())
        for field in ("tokens", "count", "rounds", "accepted"):
            assert np.array_equal(getattr(two, field), getattr(one, field)), field
        assert int(one.count.sum()) == 9 and 0 < int(one.accepted.sum()) < K * int(one.rounds.sum())


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the program store is on GPUs only")
def test_a_warm_start_loads_the_program_kept_on_disk_without_tracing(eng, tmp_path, monkeypatch):
    """The engine keeps its generate programs on disk by a key known before tracing (jspec.runtime.programs): an
    engine with no program in memory (a new process) loads it from there, traces nothing and gives the same
    tokens."""
    monkeypatch.setattr(programs, "directory", lambda: tmp_path)
    first = _run(eng, (5, 9), (6, 3))
    assert len(list(tmp_path.glob("*.program"))) == 3  # the prefills of the target and the draft, the rounds
    monkeypatch.setattr(engine, "lower_parts", None)  # tracing would fail
    eng._compiled.clear()
    warm = _run(eng, (5, 9), (6, 3))
    assert [t for t, _ in warm] == [t for t, _ in first] and warm[0][1].compile_s > 0


def test_program_keys_and_unreadable_entries(tmp_path, monkeypatch):
    """A key changes with any leaf's shape or dtype and with static fields; an entry that cannot be read back
    is compiled again and replaced. The store is off on the CPU (programs.directory)."""
    assert jax.default_backend() == "gpu" or programs.directory() is None
    monkeypatch.setattr(programs, "directory", lambda: tmp_path)
    x = jnp.arange(4.0)
    cache = lambda sink: kvcache.init_cache(CFG, KVConfig("int2", sink=sink, recent=8), 1, 32)
    keys = {programs.key((x, cache(4))), programs.key((x, cache(2))), programs.key((x.astype(jnp.bfloat16), cache(4))),
            programs.key((x[:3], cache(4)))}
    assert len(keys) == 4 and programs.key((x, cache(4))) in keys
    f = jax.jit(lambda x: x * 2 + 1)
    assert programs.compiled(f, x)(x).tolist() == [1, 3, 5, 7]
    [kept] = tmp_path.glob("*.program")
    kept.write_bytes(b"torn")
    assert programs.compiled(f, x)(x).tolist() == [1, 3, 5, 7] and kept.stat().st_size > 4


def test_capacity_and_prefill_chunks_leave_greedy_tokens_unchanged(eng, f32_matmul, monkeypatch):
    alone = _run(eng, (30,), (5,))  # capacity 48, the prompt in one chunk
    mates = _run(eng, (30, 3), (5, 60))  # capacity 80
    eng.options = Options(prefill_chunk=8)  # ten chunks of 8; the loop stops after the fourth
    chunked = _run(eng, (30, 3), (5, 60))
    assert alone[0][0] == mates[0][0] == chunked[0][0] and len(alone[0][0]) == 5
    assert mates[1][0] == chunked[1][0] and len(mates[1][0]) == 60


def test_prefill_loops_over_chunks_only_when_the_prompt_array_has_several(eng, monkeypatch):
    rows = [SamplingConfig()] * 2
    args = eng.prepare([[1] * 30, [2] * 3], rows, [5, 10], GenerateConfig(lookahead=K))
    whiles = lambda args: decode.generate_program.lower(*args).as_text().count("stablehlo.while")
    one_chunk = whiles(args)  # the 48-token prompt array in one chunk: the decode loop and the codec's loops
    chunked = args._replace(models=args.models.replace(options=Options(prefill_chunk=16)))
    assert whiles(chunked) == one_chunk + 1


def _job_lines(spec):
    return "".join(json.dumps({"id": i, "prompt": "hello world " * n, "max_new_tokens": m}) + "\n"
                   for i, (n, m) in enumerate(spec))


def test_mixed_max_new_job_compiles_once_per_bucket(eng, tmp_path):
    # "hello world " is 7 tokens, + max_new + K + 1: needs from 11 to 31, in the 16 and 32 token buckets
    spec = [(1, 1), (1, 2), (2, 14), (1, 7), (2, 9), (1, 5), (2, 1), (1, 20), (1, 8), (2, 3), (1, 4)]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(_job_lines(spec))
    summary = batch.run_job(eng, src, dst, GenerateConfig(lookahead=K), SamplingConfig(), batch_size=4,
                            progress=False, refill=False)  # static batches (refilled ones: test_refill.py)
    records = [json.loads(line) for line in dst.read_text().splitlines()]
    assert summary.prompts == len(spec) and summary.errors == 0
    assert sorted(len(r["token_ids"]) for r in records) == sorted(m for _, m in spec)
    needs = {len(eng.encode("hello world " * n)) + m + K + 1 for n, m in spec}
    assert {buckets.capacity_bucket(n, 512) for n in needs} == {16, 32}
    assert len(eng._compiled) == 2  # three batches of four rows (the last padded), two programs
    compiled_by = [r["stats"]["compile_s"] > 0 for r in records]
    assert sum(compiled_by) == 8  # the rows of the two batches that compiled; the third reused one


def test_chunks_group_rows_by_capacity_bucket():
    job = lambda i, n, m: batch.Job(i, i + 1, "", [0] * n, m, SamplingConfig())
    jobs = [job(0, 10, 3), job(1, 3, 40), job(2, 5, 2), job(3, 30, 2), job(4, 2, 1), job(5, 9, 4)]
    capacity = lambda j: buckets.capacity_bucket(len(j.ids) + j.max_new + K + 1, 512)
    got = [[j.id for j in c] for c in batch.chunks(jobs, 2, capacity)]
    # needs (+ K + 1 = 3): 16, 46, 10, 35, 6, 16 -> buckets 16: 4, 2, 0, 5 (by max_new), 48: 3, 1
    assert got == [[4, 2], [0, 5], [3, 1]]
    assert batch.batch_rows(8, 3) == 4 and batch.batch_rows(8, 30) == 8 and batch.batch_rows(1, 5) == 1


# ------------------------------------------------------------------------------------------------
# the CLI never imports torch (nor transformers, nor flax)


def test_cli_never_imports_torch(hf_model_dir, tmp_path):
    """A whole CLI run in a fresh interpreter: which modules are loaded at its end."""
    args = ["--model", str(hf_model_dir("qwen2")), "--draft", "none", "--kv", "bf16", "--max-new-tokens", "3",
            "--json", "--compile-cache", str(tmp_path / "xla"), "hello world"]
    unwanted = ("flax", "torch", "transformers")
    code = (f"import sys; from jspec.cli import generate; rc = generate.main({args!r}); "
            f"print('loaded:', sorted(m for m in {unwanted!r} if m in sys.modules)); sys.exit(rc)")
    env = os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    record, loaded = out.stdout.strip().splitlines()
    assert json.loads(record)["stats"]["new_tokens"] >= 1 and loaded == "loaded: []"


def test_a_warm_run_says_it_read_the_program_back(hf_model_dir, tmp_path):
    """Two CLI runs on one new compilation cache: the first says it compiles, the second that it reads the program
    from the cache, and its stats say so (compile_cached); -v logs one line per phase, silent without it. A job run
    twice: the second's summary counts its program builds as cache hits, not compiles."""
    args = ["-m", "jspec.generate", "--model", str(hf_model_dir("qwen2")), "--draft", "none", "--kv", "bf16",
            "--max-new-tokens", "3", "--json", "--compile-cache", str(tmp_path / "xla")]
    env = os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    run = lambda *flags: subprocess.run([sys.executable, *args, *flags], cwd=tmp_path, env=env, capture_output=True,
                                        text=True, timeout=600)
    cold, warm = run("hello world"), run("-v", "hello world")
    assert cold.returncode == warm.returncode == 0, cold.stderr + warm.stderr
    assert "jspec: compiling the generate program" in cold.stderr and "decoded" not in cold.stderr
    assert "compiling" not in warm.stderr and "jspec: reading the generate program" in warm.stderr
    assert not json.loads(cold.stdout)["stats"]["compile_cached"] and json.loads(warm.stdout)["stats"]["compile_cached"]
    logged = [line for line in warm.stderr.splitlines() if line.startswith("jspec: ") and not line.endswith(" ...")]
    assert [line.split()[1] for line in logged] == ["rotations:", "loaded", "the", "decoded"], warm.stderr
    assert "read from the compilation cache in" in logged[2]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i, "prompt": "hello " * i}) + "\n" for i in (1, 2, 3)))
    jobs = [run("--input", "in.jsonl", "--output", f"out{n}.jsonl", "--batch-size", "2") for n in (1, 2)]
    assert [j.returncode for j in jobs] == [0, 0], jobs[0].stderr + jobs[1].stderr
    (cold, warm) = (json.loads(j.stderr.strip().splitlines()[-1]) for j in jobs)  # the job's summary
    assert cold["compile_s"] > 0 == cold["cache_s"] and warm["cache_s"] > 0 == warm["compile_s"], (cold, warm)


def test_unreadable_tokenizer_is_one_clear_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(FileNotFoundError, match="no usable tokenizer .* unreadable tokenizer.json"):
        checkpoint.load_tokenizer(tmp_path)


def test_jax_is_patched_only_when_a_compile_cache_is_turned_on(tmp_path):
    """Importing the engine and the kernels leaves JAX's internals as they are; use_compile_cache installs both
    patches (jax_cache's store, jax_patch's Mosaic GPU kernel names)."""
    pytest.importorskip("jax.experimental.mosaic.gpu")
    code = ("from jax._src import compilation_cache as cc\nfrom jax.experimental.mosaic.gpu import core\n"
            "import jspec.kernels.hopper.attention, jspec.runtime.engine\n"
            "from jspec.runtime.startup import compile_cache, jax_cache\n"
            "patched = lambda: (cc.get_file_cache is jax_cache._file_cache,\n"
            "                   getattr(core._mosaic_gpu_lowering_rule, 'names_kernels', False))\n"
            "assert patched() == (False, False), patched()\n"
            f"compile_cache.use_compile_cache({str(tmp_path)!r})\nassert patched() == (True, True), patched()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert p.returncode == 0, p.stderr[-2000:]


def test_compile_cache_writes_beside_entries_an_unbounded_cache_left(tmp_path):
    """JAX's bounded (evicting) cache fails every write in a directory holding an entry without an access
    time, as an unbounded cache (earlier jspec, or another tool) leaves them: use_compile_cache stamps
    those entries, so a new program is still written, and warns about nothing."""
    (tmp_path / "jit_old-0123-cache").write_bytes(b"an entry an unbounded cache wrote")
    code = ("import warnings, jax, jax.numpy as jnp\nfrom jspec.runtime.startup import compile_cache\n"
            f"compile_cache.use_compile_cache({str(tmp_path)!r})\nwarnings.simplefilter('error')\n"
            "jax.jit(lambda x: x * 3 + 1)(jnp.arange(5)).block_until_ready()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert p.returncode == 0, p.stderr[-2000:]
    entries = {f.name for f in tmp_path.iterdir()}
    assert "jit_old-0123-atime" in entries
    assert any(n.startswith("jit__lambda") and n.endswith("-cache") for n in entries), entries


def test_shipped_autotune_results_seed_a_new_compile_cache(tmp_path):
    """use_compile_cache writes the shipped autotuning results of this jaxlib into the cache's per-fusion
    autotune folder (where JAX points XLA's autotuner), byte for byte, keeping files that are there already."""
    import base64

    import jaxlib

    pack = lambda files: json.dumps({k: base64.b64encode(v).decode() for k, v in files.items()})
    source = tmp_path / "shipped.json"
    source.write_text(pack({"gpu-kind/a.pb": b"\x00shipped a\xff", "gpu-kind/b.pb": b"shipped b"}))
    tuned = tmp_path / "cache" / compile_cache.PER_FUSION / "gpu-kind"  # XLA's layout: a subfolder per GPU kind
    tuned.mkdir(parents=True)
    (tuned / "b.pb").write_bytes(b"tuned here")
    assert compile_cache.seed_autotune(tmp_path / "cache", source) == 1
    assert (tuned / "a.pb").read_bytes() == b"\x00shipped a\xff" and (tuned / "b.pb").read_bytes() == b"tuned here"
    assert compile_cache.seed_autotune(tmp_path / "cache", source) == 0
    assert compile_cache.seed_autotune(tmp_path / "cache", tmp_path / "absent.json") == 0
    # use_compile_cache seeds from the file of this jaxlib's version, not another's
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / f"jaxlib-{jaxlib.__version__}.json").write_text(pack({"gpu-kind/c.pb": b"ours"}))
    (ours / "jaxlib-0.0.1.json").write_text(pack({"gpu-kind/d.pb": b"another jaxlib's"}))
    code = (f"from pathlib import Path\nfrom jspec.runtime.startup import compile_cache\ncompile_cache.AUTOTUNE_DIR = Path({str(ours)!r})\n"
            f"compile_cache.use_compile_cache({str(tmp_path / 'new')!r})\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert [str(f.relative_to(tmp_path / "new" / compile_cache.PER_FUSION)) for f in (tmp_path / "new").rglob("*.pb")] \
        == ["gpu-kind/c.pb"]


def test_shipped_autotune_results_are_xla_files():
    """The shipped pack holds XLA's per-fusion files as it names them: <GPU kind>/<32 hex digits>.pb, each a
    small proto naming its GPU kind (the H200's, as written on the device)."""
    import base64

    packs = sorted(compile_cache.AUTOTUNE_DIR.glob("jaxlib-*.json"))
    assert packs
    for pack in packs:
        files = json.loads(pack.read_text())
        assert len(files) > 100
        for name, data in files.items():
            kind, leaf = name.split("/")
            assert re.fullmatch(r"[0-9a-f]{16}", kind) and re.fullmatch(r"[0-9a-f]{32}\.pb", leaf), name
            assert kind.encode() in base64.b64decode(data) and len(base64.b64decode(data)) < 1024
