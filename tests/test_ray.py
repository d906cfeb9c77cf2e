"""Jobs on a Ray cluster (jspec/jobs/ray_jobs.py): on a local CPU cluster of two actors the output equals the
one-process job's, and an actor killed mid-job loses and duplicates no line. Without --ray, nothing imports ray.

The Ray tests carry the `ray` marker and are skipped where ray[data] is not installed (in the clone:
pip install -e ".[ray]").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_refill import _lines, _records

from jspec.jobs import batch
from jspec.config import GenerateConfig, KVConfig, SamplingConfig
from jspec.runtime import engine

ROOT = Path(__file__).resolve().parents[1]
GEN = GenerateConfig(max_new_tokens=16, lookahead=0)


def _load_args(hf_model_dir) -> dict:
    return dict(model=hf_model_dir("qwen3"), draft=None, kv=KVConfig("bf16"), dtype="float32", mesh=None)


def test_no_ray_without_the_flag(hf_model_dir, tmp_path):
    """Importing the CLI and running a job on one machine import no ray."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"\n".join(_lines(3)) + b"\n")
    code = ("import sys; from jspec.cli import generate; assert 'ray' not in sys.modules; "
            f"rc = generate.main(['--model', {str(hf_model_dir('qwen3'))!r}, '--draft', 'none', '--kv', 'bf16', "
            f"'--compile-cache', '', '--batch-size', '2', '--input', {str(src)!r}, '--output', {str(dst)!r}]); "
            "print(rc, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=os.environ | {"JAX_PLATFORMS": "cpu"},
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["0", "False"], out.stderr
    assert len(_records(dst)) == 3


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="ray[data] is not installed (pip install -e '.[ray]')")
    pytest.importorskip("ray.data", reason="ray[data] is not installed (pip install -e '.[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def single(hf_model_dir, tmp_path_factory):
    """The job (24 lines) and its one-process output."""
    root = tmp_path_factory.mktemp("ray")
    src, dst = root / "in.jsonl", root / "single.jsonl"
    src.write_bytes(b"\n".join(_lines(24)) + b"\n")
    eng = engine.load(**_load_args(hf_model_dir))
    batch.run_job(eng, src, dst, GEN, SamplingConfig(), 4, progress=False)
    return src, _records(dst)


@pytest.mark.ray
def test_two_actors_give_the_single_process_output(cluster, single, hf_model_dir, tmp_path):
    from jspec.jobs import ray_jobs

    src, expected = single
    dst = tmp_path / "out.jsonl"
    summary = ray_jobs.run_job(_load_args(hf_model_dir), src, dst, GEN, SamplingConfig(), 4, workers=2,
                               block_lines=4, progress=False)
    assert _records(dst) == expected
    d = summary.as_dict()
    assert d["prompts"] == 24 and len(d["workers"]) == 2 and sum(w["prompts"] for w in d["workers"].values()) == 24
    summary = ray_jobs.run_job(_load_args(hf_model_dir), src, dst, GEN, SamplingConfig(), 4, workers=2,
                               progress=False)
    assert summary.skipped == 24 and _records(dst) == expected  # a resume with nothing left to do


@pytest.mark.ray
def test_a_killed_actor_loses_and_duplicates_no_line(cluster, single, hf_model_dir, tmp_path):
    from jspec.jobs import ray_jobs

    src, expected = single
    marker = tmp_path / "killed"

    class Dying(ray_jobs.Worker):  # defined here: Ray ships it by value
        """Dies (the process, at once) in its second block, once in the whole job."""

        def __init__(self, *args):
            super().__init__(*args)
            self.blocks = 0

        def __call__(self, block):
            self.blocks += 1
            if self.blocks == 2 and not marker.exists():
                marker.touch()
                os._exit(1)
            return super().__call__(block)

    dst = tmp_path / "out.jsonl"
    summary = ray_jobs.run_job(_load_args(hf_model_dir), src, dst, GEN, SamplingConfig(), 4, workers=2,
                               block_lines=4, progress=False, worker_cls=Dying)
    assert marker.exists() and _records(dst) == expected and summary.prompts == 24


def test_the_pool_is_asked_with_named_parameters_only():
    """Every keyword jspec gives Ray Data's map_batches is one of its named parameters: any other is a deprecated
    ray_remote_args (RayDeprecationWarning under --ray)."""
    import inspect
    import types

    pytest.importorskip("ray.data", reason="ray[data] is not installed (pip install -e '.[ray]')")
    import ray.data

    from jspec.jobs import ray_jobs

    asked = {}

    class Data:
        def map_batches(self, fn, **kwargs):
            asked.update(kwargs)
            return self

        def iter_batches(self, **kwargs):
            return iter(())

    fake = types.SimpleNamespace(data=types.SimpleNamespace(from_items=lambda items: Data(),
                                                            ActorPoolStrategy=lambda size: size))
    list(ray_jobs._blocks(fake, [(1, b"{}")], ray_jobs.Worker, (), 2, 0, 4))
    named = {n for n, p in inspect.signature(ray.data.Dataset.map_batches).parameters.items()
             if p.kind == p.KEYWORD_ONLY}
    assert asked and set(asked) <= named, set(asked) - named
