"""Sharded decoding (jspec.runtime.sharding) on 8 fake CPU devices: same greedy tokens as one device, arrays
split as declared, bad meshes refused.

XLA_FLAGS must be set before jax starts its backend, and other test files of this pytest process may
already have started it, so the checks run in one subprocess (this file run as a script, which prints
a JSON report) and the tests below read that report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("sharding")  # one worker: the module's fixture runs the subprocesses once
MESHES = ("tp=2,dp=4", "tp=1,dp=8")
CASES = [(kv, draft) for kv in ("bf16", "int2") for draft in (False, True)]


@pytest.fixture(scope="module")
def report():
    # conftest's XLA_FLAGS (no LLVM optimization) kept: the 8-device programs compile three times faster
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")
    # two halves in parallel: compiling is single-threaded and the budget is two cores
    procs = [subprocess.Popen([sys.executable, __file__, part], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent)
             for part in ("bf16", "int2")]
    merged = {}
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
        for key, value in json.loads(out.strip().splitlines()[-1]).items():
            merged.setdefault(key, {}).update(value)
    return merged


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("kv,draft", CASES)
def test_sharded_tokens_equal_unsharded(report, kv, draft, mesh):
    r = report["tokens"][f"{kv}/{draft}/{mesh}"]
    assert r["sharded"] == r["single"]
    assert [len(t) for t in r["single"]] == r["max_new"]  # every row, none of the padding rows


def test_rolled_layer_loop_sharded_gives_the_same_tokens(report):
    r = report["tokens"]["int2/True/tp=2,dp=4/rolled"]
    assert r["sharded"] == r["single"]


def test_arrays_sharded_as_declared(report):
    bad = {name: why for name, why in report["placement"].items() if why != "ok"}
    assert not bad, bad
    assert len(report["placement"]) > 20


def test_bad_meshes_raise_config_error(report):
    assert all(v == "ConfigError" for v in report["errors"].values()), report["errors"]


def test_per_shard_attention(report):
    assert set(report["per_shard"]) == {"reference", "pallas"}
    for name, (err, placed) in report["per_shard"].items():
        assert err < 1e-5 and placed == "ok", (name, err, placed)


def test_cli_mesh_flag(report):
    assert report["cli"]["sharded"] == report["cli"]["single"]
    assert report["cli"]["bad_mesh_rc"] == 2


def test_parse_mesh():
    from jspec.config import ConfigError
    from jspec.runtime.sharding import parse_mesh

    assert parse_mesh(None, 8) == (8, 1)
    assert parse_mesh("tp=2,dp=4", 8) == (4, 2)
    assert parse_mesh("dp=2", 8) == (2, 4)
    assert parse_mesh(" tp=8 ", 8) == (1, 8)
    for spec in ("tp=3", "tp=2,dp=2", "pp=2", "tp=two", "tp=0,dp=8", "tp=1,tp=8"):
        with pytest.raises(ConfigError):
            parse_mesh(spec, 8)


# ------------------------------------------------------------------------------------------------
# The subprocess (8 fake CPU devices)
# ------------------------------------------------------------------------------------------------


def _models():
    import jax

    from jspec.config import ModelConfig
    from jspec.model import rotation
    from jspec.model.decoder import Params, init_params

    # GQA (4 query heads on 2 KV heads), q/k/v biases and q/k norms: every kind of weight gets placed.
    cfg = ModelConfig("qwen3", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, max_position=256, qkv_bias=True, qk_norm=True)
    params = init_params(cfg, jax.random.key(0), std=0.2)  # large weights: greedy argmaxes far from ties
    rotated = rotation.apply_rotations(params, cfg, *rotation.hadamard_rotations(cfg))
    # The draft: the target's first layer, so it agrees with the target on some tokens and not others.
    draft_cfg = ModelConfig(**{**cfg.__dict__, "num_layers": 1})
    draft = Params(params.embed, jax.tree.map(lambda x: x[:1], params.layers), params.norm, params.lm_head)
    return cfg, params, rotated, draft_cfg, draft


def _engine(kv_mode, with_draft, mesh, unroll=True):
    from jspec.config import KVConfig, Options
    from jspec.decode.state import Drafter, DraftMode
    from jspec.runtime.engine import Engine

    cfg, params, rotated, draft_cfg, draft = _models()
    kv = KVConfig(kv_mode, sink=4, recent=8)  # small windows: most of each row is read as INT2
    tgt = rotated if kv.int2 else params
    drafter = Drafter(draft, mode=DraftMode.MODEL, model_cfg=draft_cfg) if with_draft else Drafter()
    return Engine(cfg=cfg, params=tgt, tokenizer=None, kv=kv, drafter=drafter, dtype="float32", attn_impl="reference",
                  mesh=mesh, options=Options(layer_unroll=unroll))


def _batch():
    import numpy as np

    from jspec.config import GenerateConfig, SamplingConfig

    rng = np.random.default_rng(0)
    ids = [rng.integers(3, 96, n).tolist() for n in (5, 19, 9, 14, 3)]  # 5 rows: dp=4 and dp=8 pad
    max_new = [12, 12, 7, 12, 10]
    return ids, [SamplingConfig()] * len(ids), max_new, GenerateConfig(max_new_tokens=12, lookahead=2)


def _placed(x, mesh, spec) -> str:
    """"ok" when x is laid out as NamedSharding(mesh, spec) (each device holding its block), else why not."""
    from jax.sharding import NamedSharding

    want = NamedSharding(mesh, spec)
    shard = x.addressable_shards[0].data.shape
    if x.sharding.is_equivalent_to(want, x.ndim) and shard == want.shard_shape(x.shape):
        return "ok"
    return f"{x.sharding} (shard {shard}), expected {spec} (shard {want.shard_shape(x.shape)})"


def _check_placement(eng, mesh):
    """Places the arguments of one speculative INT2 run, runs it, checks inputs and outputs."""
    from jax.sharding import PartitionSpec as P

    import jax

    ids, rows, max_new, gen = _batch()
    args = eng.prepare(ids, rows, max_new, gen)
    m, prompts, cache, draft_cache = args.models, args.prompts, args.cache, args.draft_cache
    placement = {}
    put = lambda name, x, spec: placement.__setitem__(name, _placed(x, mesh, spec))
    lp = m.target.layers  # [L, ...] stacks, the layer axis whole
    for name, spec in (("wqkv", P(None, None, "tp")), ("bqkv", P(None, "tp")), ("wo", P(None, "tp", None)),
                       ("w_gu", P(None, None, None, "tp")), ("w_down", P(None, "tp", None)), ("rot_k", P(None, "tp")),
                       ("attn_norm", P()), ("q_norm", P())):
        put(f"target.{name}", getattr(lp, name), spec)
    put("target.lm_head", m.target.lm_head, P(None, "tp"))
    put("target.embed", m.target.embed, P())
    put("draft.wqkv", m.drafter.model.layers.wqkv, P())
    put("prompts", prompts, P("dp"))

    def caches(prefix, c, dc):
        for name in ("k", "v", "codes", "qparams"):
            put(f"{prefix}cache.{name}", getattr(c.layers, name), P(None, "dp", "tp"))
        put(f"{prefix}cache.length", c.length, P("dp"))
        put(f"{prefix}draft_cache.k", dc.layers.k, P(None, "dp"))

    caches("in.", cache, draft_cache)
    program, _ = eng.compile(args)
    state = jax.block_until_ready(program(*args))
    caches("out.", state.cache, state.draft)  # the draft model's state: its cache
    return placement


def _errors(cfg):
    from jspec.config import ModelConfig
    from jspec.runtime import sharding

    wide = ModelConfig(**{**cfg.__dict__, "num_kv_heads": 4, "intermediate_size": 90})
    bad = {"tp=4 on 2 KV heads": ("tp=4", cfg), "tp=4 on intermediate 90": ("tp=4", wide),
           "tp=3": ("tp=3", cfg), "tp*dp != 8": ("tp=2,dp=2", cfg), "typo": ("tp:2", cfg)}
    errors = {}
    for what, (spec, c) in bad.items():
        try:
            sharding.make_mesh(spec, c)
            errors[what] = "no error"
        except Exception as e:  # noqa: BLE001 -- the test reports the exception type
            errors[what] = type(e).__name__
    return errors


def _cli(tmp):
    """The CLI with --mesh on a saved tiny model, against --mesh none; and a refused mesh."""
    import contextlib
    import io

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import tiny_tokenizer

    from jspec.cli import generate
    from jspec.config import ModelConfig
    from jspec.io import checkpoint
    from jspec.model.decoder import init_params

    import jax

    cfg = ModelConfig("llama", vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, max_position=256)
    checkpoint.save_hf(tmp, init_params(cfg, jax.random.key(1), std=0.2), cfg)
    tiny_tokenizer().save_pretrained(tmp)

    def run(mesh):
        buf = io.StringIO()
        argv = ["--model", str(tmp), "--draft", "none", "--kv", "bf16", "--dtype", "float32", "--json",
                "--max-new-tokens", "6", "--compile-cache", "", "--mesh", mesh, "hello", "the fox", "a b c"]
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            rc = generate.main(argv)
        return rc, [json.loads(line)["token_ids"] for line in buf.getvalue().splitlines() if line]

    (rc1, single), (rc2, sharded), (bad_rc, _) = run("none"), run("tp=2,dp=4"), run("tp=4")
    assert rc1 == rc2 == 0, (rc1, rc2)
    return dict(single=single, sharded=sharded, bad_mesh_rc=bad_rc)


def _per_shard():
    """attention_split.per_shard (shard_map per (dp, tp) block) around attention == the unsharded call,
    for the reference path and the split path (the Pallas kernel in interpret mode on CPU)."""
    import jax
    import jax.numpy as jnp

    from jspec.attention import rule as attention
    from jspec.attention.split import attend_split, per_shard
    from jspec.cache import kvcache
    from jspec.config import KVConfig, ModelConfig
    from jspec.runtime import sharding

    fns = {"reference": attention.attend_reference, "pallas": attend_split}
    cfg = ModelConfig("llama", 96, 128, 128, 1, num_heads=4, num_kv_heads=2, head_dim=64)  # kernel: D >= 64
    kv = KVConfig("int2", sink=4, recent=8)
    B, n = 4, 4
    keys = jax.random.split(jax.random.key(2), 5)
    rows = lambda i, h: jax.random.normal(keys[i], (B, n if i > 1 else 36, h, 64))
    cache = kvcache.init_cache(cfg, kv, B, 48, jnp.float32, 3)
    cache = kvcache.commit(cache, rows(0, 2)[None], rows(1, 2)[None], jnp.array([36, 20, 30, 11]))
    q, k, v = rows(2, 4), rows(3, 2), rows(4, 2)
    mesh = sharding.make_mesh("tp=2,dp=4")
    heads = lambda x: jax.device_put(x, jax.NamedSharding(mesh, jax.P("dp", None, "tp", None)))
    placed = sharding.shard_cache(cache, mesh)
    errors = {}
    for name, fn in fns.items():
        want = jax.jit(lambda q, k, v, layer, length: fn(q, k, v, layer, length, kv))(q, k, v, cache.layer(0),
                                                                                     cache.length)
        with sharding.context(mesh):
            run = jax.jit(lambda q, k, v, layer, length: per_shard(fn)(q, k, v, layer, length, kv))
            got = run(heads(q), heads(k), heads(v), placed.layer(0), placed.length)
        errors[name] = [float(jnp.abs(got - want).max()), _placed(got, mesh, jax.P("dp", None, "tp", None))]
    return errors


def _main(part: str):
    """One half of the checks (two subprocesses share the work)."""
    import tempfile

    import jax

    from jspec.runtime import sharding

    assert jax.device_count() == 8, jax.devices()
    ids, rows, max_new, gen = _batch()
    tokens, engines = {}, {}
    for kv, draft in CASES:
        if kv != part:
            continue
        single = [t for t, _ in _engine(kv, draft, None).generate_ids(ids, rows, max_new, gen)]
        for spec in MESHES:
            eng = engines[kv, draft, spec] = _engine(kv, draft, sharding.make_mesh(spec))
            sharded = [t for t, _ in eng.generate_ids(ids, rows, max_new, gen)]
            tokens[f"{kv}/{draft}/{spec}"] = dict(single=single, sharded=sharded, max_new=max_new)
    report = dict(tokens=tokens)
    if part == "int2":  # also the layer loop rolled (Options.layer_unroll = 1) on the mesh
        rolled = _engine("int2", True, sharding.make_mesh("tp=2,dp=4"), unroll=1)
        got = [t for t, _ in rolled.generate_ids(ids, rows, max_new, gen)]
        tokens["int2/True/tp=2,dp=4/rolled"] = dict(tokens["int2/True/tp=2,dp=4"], sharded=got)
        eng = engines["int2", True, "tp=2,dp=4"]  # its program is compiled already
        report.update(placement=_check_placement(eng, eng.mesh), errors=_errors(_models()[0]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            report.update(cli=_cli(Path(tmp)), per_shard=_per_shard())
    print(json.dumps(report))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    _main(sys.argv[1])
