"""Every maintained benchmark runs end to end in its CPU-sized mode and writes the JSON fields docs/results.md
reads, so that a change of the library cannot break a script unseen until a GPU run of benchmarks/run_gpu.sh.

Each runs in a subprocess (as a user runs it: `python benchmarks/NAME.py`), its output in the test's tmp dir.
kernel_mosaic is GPU-marked: Mosaic GPU has no interpret mode and lowers only for a CUDA device.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SHIPPED = ROOT / "checkpoints"

# The fields docs/results.md (and the README's results table) read from each benchmark's JSON: "" is the top
# level, "a.b" a nested dict, "a[]" every item of a list, "a{}" every value of a dict.
FIELDS = {
    "decode": {"": ["copy_bw_gbs", "floor_bw_gbs", "max_batch", "rows"],
               "rows[]": ["ctx", "batch", "kv", "ms", "tok_s", "floor_ms", "floor_frac"]},
    "speculative": {"": ["device_kind", "config", "grid", "skipped"],
                    "grid[]": ["workload", "kv", "batch", "mode", "lookahead", "K", "tok_s", "tau", "accept_rate",
                               "speedup"]},
    "attention": {"copy": ["copy_GBps", "jax_elementwise_GBps"], "results[]": ["B", "T", "n", "int2"],
                  "results[].int2": ["ms", "GBps", "frac_copy"]},
    "kernel_mosaic": {"copy": ["copy_GBps"], "results[]": ["B", "T", "n", "mosaic", "triton", "speedup"],
                      "results[].mosaic": ["ms", "frac_copy", "kernel_ms", "kernel_frac_copy"]},
    "multi_gpu": {"": ["n_devices", "ctx", "rows"], "rows[]": ["kv", "mesh", "gpus", "batch", "ms", "tok_s"]},
    "startup": {"cases[]": ["case", "process", "import_s", "load_s", "compile_s", "wall_s"]},
    "jobs": {"rows[]": ["mode", "batch_size", "new_tokens", "wasted_fraction", "compile_s", "decode_s",
                        "decode_tokens_per_s", "decode_speedup_vs_static"]},
    "long_context": {"part_a[]": ["ctx", "batch", "drafter", "K"]},  # measured_ms: bar the auto and skipped rows
    "long_context_acceptance": {"rows[]": ["drafter", "dtype", "K", "context", "tokens_per_round", "rounds",
                                           "accepted_histogram", "rejected_token_kinds"]},
    "bf16_agreement": {"results{}": ["identical", "prompts", "mean_common_prefix"]},
    "kv_quality": {"": ["results", "kv_bytes_per_token", "windows_used"], "results.bf16": ["ppl"],
                   "results{}": ["ppl", "top1_agree", "kl"]},
    "kv_quality_real": {"": ["rows", "bits_per_element_history", "searched_clips", "calibration"],
                        "rows.prose[]": ["variant", "rotation", "clip", "sink", "recent", "ppl", "gap_mean_pct",
                                         "gap_sem_pct", "top1_agree"]},
    "kv_long_real": {"": ["slices", "texts"], "slices.prose[]": ["gap_mean_pct", "gap_sem_pct"]},
    "int2_agreement_real": {"": ["common_prefix", "all", "prose", "code"], "all": ["mean", "sem", "identical"]},
    "kv_quality_real_levers": {"": ["levers"], "levers{}": ["prose", "code"]},
    "self_skip": {"acceptance[]": ["drafter", "layers", "text", "tokens_per_round", "alpha"],
                  "costs": ["plain_step_ms", "verify_5_ms"]},
    "draft_auto": {"rows[]": ["workload", "ctx", "batch", "decode_s", "speedup_over_plain", "auto_chose"]},
    "pair_quality": {"rows[]": ["metric", "split", "model", "bpb", "bytes", "tokens", "files"]},
}


def _tiny_val(tmp: Path) -> Path:
    """A corpus folder for kv_quality: 600 random ids of the shipped target's vocabulary as val.npy."""
    vocab = json.loads((SHIPPED / "code-target" / "config.json").read_text())["vocab_size"]
    np.save(tmp / "val.npy", np.random.default_rng(0).integers(0, vocab, 600).astype(np.int32))
    return tmp


def _tiny_texts(tmp: Path) -> Path:
    """A corpus folder for pair_quality: two short code files as val_texts.json."""
    (tmp / "val_texts.json").write_text(json.dumps([Path(ast.__file__).read_text()[:1500],
                                                    Path(json.__file__).read_text()[:1500]]))
    return tmp


# benchmark -> argv of its CPU-sized mode, given (tmp dir, tiny HF model dir); "--out" is added by the test.
REAL = ["--calib-tokens", "512"]
ARGS = {
    "decode": lambda t, m: ["--smoke"],
    "speculative": lambda t, m: ["--small", "--modes", "ngram", "--workloads", "held_out", "--singles", "1"],
    "attention": lambda t, m: ["--smoke"],
    "kernel_mosaic": lambda t, m: ["--smoke"],
    "multi_gpu": lambda t, m: ["--smoke"],
    "startup": lambda t, m: ["--small", "--engine", "--cases", "8b", "--no-readme", "--no-job"],
    "jobs": lambda t, m: ["--model", "tiny", "--small"],
    "long_context": lambda t, m: ["--small", "--parts", "a"],
    "long_context_acceptance": lambda t, m: ["--contexts", "256", "--ks", "2", "--dtypes", "float32", "--drafters",
                                             "ngram", "--prompts", "1", "--new-tokens", "8"],
    "bf16_agreement": lambda t, m: ["--prompts", "2", "--max-new-tokens", "8", "--dtype", "float32", "--kv", "bf16"],
    "kv_quality": lambda t, m: ["--data", str(_tiny_val(t)), "--windows", "1", "--seq-len", "256", "--only", "none",
                                "oscar", "--sr", "16,64", "--clip", "on", "--forward", "blocked"],
    "kv_quality_real": lambda t, m: ["--model", m, *REAL, "--calib-seq-len", "128", "--windows", "1", "--seq-len",
                                     "128", "--sr", "16,64", "--only", "oscar", "--plot", str(t / "plot.png")],
    "kv_long_real": lambda t, m: ["--model", m, *REAL, "--seq-len", "256", "--windows", "1", "--sr", "16,64",
                                  "--slice", "128"],
    "int2_agreement_real": lambda t, m: ["--model", m, *REAL, "--prompts", "2", "--prompt-tokens", "64",
                                         "--max-new-tokens", "8", "--sink", "16", "--recent", "16"],
    "kv_quality_real_levers": lambda t, m: ["--model", m, "--seq-len", "384", "--layer-table", "none"],
    "self_skip": lambda t, m: ["--layers", "6", "--context", "96", "--small", "--cost-layers", "2",
                                "--cost-context", "256"],
    "draft_auto": lambda t, m: ["--contexts", "64", "--batches", "1", "--new-tokens", "8", "--reps", "1"],
    "pair_quality": lambda t, m: ["--target", str(SHIPPED / "code-target"), "--data", str(_tiny_texts(t)), "--only",
                                  "bpb", "--dtype", "float32", "--batch", "2"],
}
OUT_DIR = {"attention", "kernel_mosaic"}  # --out names a folder: NAME.json is written inside
ENV = {"multi_gpu": {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"}}
GPU = {"kernel_mosaic"}
HELPERS = {"kv_blocked", "plots", "scratch", "timing"}  # imported by the benchmarks, not run


def _values(doc, path: str) -> list:
    """The objects at `path` in doc (FIELDS' notation)."""
    found = [doc]
    for part in filter(None, path.split(".")):
        key = part.rstrip("[]{}")
        found = [x[key] for x in found]
        if part.endswith("[]"):
            found = [y for x in found for y in x]
        elif part.endswith("{}"):
            found = [y for x in found for y in x.values()]
    return found


def missing_fields(name: str, doc: dict) -> list[str]:
    out = []
    for path, fields in FIELDS[name].items():
        try:
            objs = _values(doc, path)
        except (KeyError, TypeError):
            return [f"{path} (absent)"]
        if not objs:
            out.append(f"{path} (empty)")
        out += [f"{path}.{f}" for obj in objs for f in fields if f not in obj]
    return sorted(set(out))


def test_every_benchmark_is_listed():
    """A new benchmark file gets its CPU mode and fields here, or it is not maintained."""
    scripts = {p.stem for p in BENCH.glob("*.py")} - HELPERS
    assert scripts == set(FIELDS) == set(ARGS)


def test_no_benchmark_writes_the_landed_results_by_default():
    """The tracked benchmarks/results/ change only when a command names a file there with --out."""
    for path in BENCH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "default":
                assert "results" not in ast.unparse(node.value), f"{path.name}: --out defaults to {node.value}"


def test_run_gpu_names_every_output():
    """run_gpu.sh passes --out to every benchmark it runs."""
    for line in (BENCH / "run_gpu.sh").read_text().splitlines():
        if "python benchmarks/" in line and not line.lstrip().startswith("#"):
            assert "--out" in line, line


def test_missing_fields_sees_a_missing_field():
    doc = {"rows": [{"ctx": 1, "batch": 1, "kv": "int2", "ms": 1.0, "tok_s": 1.0, "floor_ms": 1.0}],
           "copy_bw_gbs": 1.0, "floor_bw_gbs": 1.0, "max_batch": {}}
    assert missing_fields("decode", doc) == ["rows[].floor_frac"]
    assert missing_fields("decode", dict(doc, rows=[])) == ["rows[] (empty)"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.gpu] if n in GPU else []) for n in FIELDS])
def test_benchmark_runs_and_writes_its_fields(name, tmp_path, hf_model_dir):
    if name in GPU and not any(d.platform == "gpu" for d in __import__("jax").devices()):
        pytest.skip("Mosaic GPU has no interpret mode: kernel_mosaic runs on a GPU only")
    model = str(hf_model_dir("llama")) if "--model" in ARGS[name](tmp_path, "m") and name != "jobs" else "-"
    out = tmp_path / "out" if name in OUT_DIR else tmp_path / f"{name}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(BENCH)]), **ENV.get(name, {}))
    if name not in GPU:
        env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, str(BENCH / f"{name}.py"), *ARGS[name](tmp_path, model), "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    doc = json.loads((out / f"{name}.json" if name in OUT_DIR else out).read_text())
    assert missing_fields(name, doc) == []
    if name == "decode":  # judged against the highest bandwidth measured: never a copy figure above it
        assert doc["floor_bw_gbs"] >= doc["copy_bw_gbs"]


def test_long_context_auto_learns_the_workload(tmp_path):
    """long_context's auto row runs the engine's rule call by call: the first call at the priors, the later ones at
    what the earlier calls measured; a workload that accepts more than the prior moves K up to the best; --derive
    recomputes the auto rows of a JSON from its measured costs (lookahead.Costs.from_ms)."""
    sys.path.insert(0, str(BENCH))
    try:
        import long_context as lc
    finally:
        sys.path.remove(str(BENCH))
    from jspec.runtime.lookahead import Costs

    costs = Costs(((1, 10e-3), (5, 16e-3)), ngram=1e-5)  # the verify grows with its tokens
    tau = 4.6  # accepted 3.6 of 4: above the n-gram prior, so the first call's K is below 4
    rows = [dict(ctx=1024, batch=1, drafter="ngram", K=4, costs_ms=costs.as_ms(),
                 derived=dict(speedup_over_plain_int2=tau * 10 / 16.01))]  # ms: verify(5) + lookup
    auto = lc.auto_row(rows, {"ngram": costs}, {"ngram": dict(tau=tau)}, 1024, 1)
    first, last = auto["calls"][0], auto["calls"][-1]
    assert first["chose"] == last["chose"] == "ngram" and first["K"] < last["K"] == 4
    assert auto["derived"]["first_call"] < auto["derived"]["speedup_over_plain_int2"]
    assert auto["derived"]["speedup_over_plain_int2"] == pytest.approx(auto["best_candidate"]["speedup"], rel=1e-9)
    path = tmp_path / "lc.json"
    path.write_text(json.dumps(dict(part_a=rows + [dict(ctx=1024, batch=1, drafter="auto", K=0)])))
    out = tmp_path / "again.json"
    subprocess.run([sys.executable, str(BENCH / "long_context.py"), "--derive", str(path), "--out", str(out)],
                   check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    [again] = [r for r in json.loads(out.read_text())["part_a"] if r["drafter"] == "auto"]
    landed = lc.auto_row(rows, {"ngram": Costs.from_ms(costs.as_ms())}, lc.acceptance(), 1024, 1)  # the landed taus
    assert again["calls"] == json.loads(json.dumps(landed["calls"]))
