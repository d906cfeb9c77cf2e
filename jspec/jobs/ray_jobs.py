"""A job on a Ray cluster: `python -m jspec.generate --input IN --output OUT --ray [ADDRESS]`, or jspec.ray.run_job.

The driver reads the input, checks and locks the output as a one-process job does (jspec.jobs.batch), answers
what needs no model (a line already answered is skipped, a duplicate id is its error record) and streams the
other lines through Ray Data to a pool of actors, one Engine each (one GPU each where the cluster has GPUs).
An actor answers a block of lines as a job would (batch.read_jobs, then batch.run_rows: rows refilled as
they finish) and returns the records with its stats; the driver writes each block's records as it comes, so
the output is the same resumable file. A block whose actor fails or is killed is run again by another (Ray
Data restarts the actor and retries its task); the driver writes a line's record once, whichever attempt
brings it. Per-actor stats are merged into the job's summary.

Ray is imported only here, and only when a job asks for it (the ray extra: `pip install -e ".[ray]"` in the clone).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from tqdm import tqdm

from jspec.jobs import batch, job_lines
from jspec.config import GenerateConfig, SamplingConfig

# Summary fields an actor's block adds up (the rest are the driver's)
_SUMS = ("prompts", "errors", "new_tokens", "rounds", "accepted", "proposed", "round_tokens", "compile_s", "cache_s",
         "decode_s", "row_rounds")


class _Owners:
    """An engine that lets Format.parse name a line's owner (its id) and nothing else: no model, no check."""

    chat_template = tokenizer = None

    def prompt_ids(self, prompt):
        return [0]

    def check(self, *args, **kwargs):
        pass


def _owner(fmt: batch.Format, raw: bytes, gen: GenerateConfig, base: SamplingConfig):
    try:
        return fmt.parse(raw, _Owners(), gen, base)[0]
    except Exception:  # noqa: BLE001  whatever the stub trips on, the actor's parse names the line
        return None


def pending(lines, done: dict, gen: GenerateConfig, base: SamplingConfig, fmt: batch.Format):
    """(the lines to run as [(number, bytes)], error records of duplicate ids, lines skipped): the
    rules of batch.read_jobs that need no model."""
    keys, owners, todo, errors, skipped = fmt.keys(lines), set(), [], [], 0
    for n, raw in lines:
        if not raw.strip():
            continue
        rid = _owner(fmt, raw, gen, base)
        duplicate = rid is not None and job_lines.resume_key(rid) in owners  # the first line with an id owns it
        if rid is not None:
            owners.add(job_lines.resume_key(rid))
        if keys[n] in done:
            skipped += 1
        elif duplicate:
            job = batch.Job(rid, n, batch.fingerprint(raw), [], 0, base, key=keys[n])
            errors.append(fmt.error(job, f"duplicate {fmt.owner} {rid!r}"))
        else:
            todo.append((n, raw))
    return todo, errors, skipped


class Worker:
    """One actor of the pool: an Engine (jspec.load(**load_args)), answering blocks of lines."""

    def __init__(self, load_args: dict, gen: GenerateConfig, base: SamplingConfig, batch_size: int, fmt_name: str,
                 compile_cache: tuple[str, float] | None = None):
        from jspec.runtime.startup import compile_cache as cc
        from jspec.runtime import engine

        if compile_cache:
            cc.use_compile_cache(compile_cache[0], max_gib=compile_cache[1])
        self.engine = engine.load(**load_args)
        self.gen, self.base, self.batch_size = gen, base, batch_size
        self.fmt = batch.JSPEC if fmt_name == batch.JSPEC.name else _openai()
        self.worker = f"{os.uname().nodename}:{os.getpid()}"

    def __call__(self, block: dict) -> dict:
        lines = [(int(n), bytes(raw)) for n, raw in zip(block["line"], block["raw"])]
        jobs, errors, _ = batch.read_jobs(self.engine, lines, {}, self.gen, self.base, self.fmt)
        summary, built = batch.Summary(errors=len(errors)), dict(self.engine.built)
        records = list(errors)
        for answered, call in batch.run_rows(self.engine, jobs, self.gen, self.batch_size, self.fmt):
            records += [rec for rec, _ in answered]
            summary.add([st for _, st in answered if st is not None], call)
            summary.errors += sum(st is None for _, st in answered)
        summary.count_builds(built, self.engine.built)
        stats = json.dumps({k: getattr(summary, k) for k in _SUMS} | {"kv_bytes": summary.kv_bytes,
                                                                       "worker": self.worker, "block": block_id()})
        return {"record": [json.dumps(r, default=batch.Stats.as_dict) for r in records],
                "stats": [stats] * len(records)}


def block_id() -> str:
    return os.urandom(8).hex()


def _openai():
    from jspec.jobs import openai_batch

    return openai_batch.FORMAT


def run_job(load_args: dict, input_path: str | Path, output_path: str | Path, gen: GenerateConfig,
            base: SamplingConfig, batch_size: int, address: str | None = None, workers: int | None = None,
            restart: bool = False, progress: bool = True, block_lines: int | None = None, compile_cache: tuple[str, float] | None = None,
            worker_cls=Worker) -> Summary:
    """batch.run_job on a Ray cluster (the module docstring). load_args: jspec.load's arguments, for each actor.
    address: the cluster's (None: RAY_ADDRESS, else a local one); workers: actors (default: one per GPU, one
    without GPUs); block_lines: lines per block an actor answers at a time (default 4 x batch_size);
    compile_cache: (directory, GiB) of each actor's persistent compilation cache; worker_cls: the actors' class."""
    import ray

    t0 = time.perf_counter()
    base.validate()
    gen.validate()
    input_path, output_path = Path(input_path), Path(output_path)
    batch.check_paths(input_path, output_path)
    lines = batch.input_lines(input_path.read_bytes())
    fmt = batch.detect_format(lines)
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    workers = workers or max(gpus, 1)
    with batch.open_output(output_path, restart, fmt) as (out, done):
        batch.check_settings(output_path, job_settings(load_args, gen, base), restart)
        batch.check_resume(done, lines, output_path, fmt)
        todo, errors, skipped = pending(lines, done, gen, base, fmt)
        summary = Summary(errors=len(errors), skipped=skipped)
        batch._write(out, errors)
        written = set()  # resume keys answered: a block run twice (its actor died after answering) is written once
        with tqdm(total=len(todo), unit="row", disable=None if progress else True) as bar:
            actor = (load_args, gen, base, batch_size, fmt.name, compile_cache)
            for block in _blocks(ray, todo, worker_cls, actor, workers, gpus, block_lines or 4 * batch_size):
                records = [json.loads(r) for r in block["record"]]
                fresh = [r for r in records if fmt.answered(r)[0] not in written]
                batch._write(out, fresh)
                written.update(fmt.answered(r)[0] for r in fresh)
                if fresh:
                    for stats in set(block["stats"]):  # one entry per block answered
                        summary.merge(json.loads(stats))
                bar.update(len(fresh))
    summary.wall_s = time.perf_counter() - t0
    return summary


def job_settings(load_args: dict, gen: GenerateConfig, base: SamplingConfig) -> dict:
    """batch.job_settings for a job whose engines the actors load: jspec.load's arguments (the model and draft
    paths resolved) and the defaults a line may leave out. A job resumes on Ray only with these."""
    paths = {k: str(Path(v).resolve()) for k, v in load_args.items() if k in ("model", "rotations") and v}
    return {"ray_load": repr(sorted((load_args | paths).items())), "generate": repr(gen), "sampling": repr(base)}


def _blocks(ray, todo, worker_cls, actor: tuple, workers: int, gpus: int, block_lines: int):
    """The answered blocks, each as it completes: {"record", "stats"} arrays (a block's stats repeated per record)."""
    if not todo:
        return
    ds = ray.data.from_items([{"line": n, "raw": raw} for n, raw in todo])
    # Named parameters only (any other keyword is a deprecated ray_remote_args); an actor that dies is restarted and
    # its block retried without limit, Ray Data's default for an actor pool.
    ds = ds.map_batches(worker_cls, fn_constructor_args=actor, batch_size=block_lines, batch_format="numpy",
                        compute=ray.data.ActorPoolStrategy(size=workers), num_gpus=1 if gpus else 0, num_cpus=1)
    yield from ds.iter_batches(batch_size=None, batch_format="numpy")


@dataclasses.dataclass
class Summary(batch.Summary):
    """batch.Summary with each actor's share (workers: {host:pid: its sums})."""

    workers: dict = dataclasses.field(default_factory=dict)

    def merge(self, stats: dict) -> None:
        """Adds one block's stats (Worker.__call__'s) to the totals and to its actor's."""
        who = self.workers.setdefault(stats["worker"], {k: 0 for k in _SUMS})
        for k in _SUMS:
            setattr(self, k, getattr(self, k) + stats[k])
            who[k] += stats[k]
        self.kv_bytes = max(self.kv_bytes, stats["kv_bytes"])

    def as_dict(self) -> dict:
        d = super().as_dict()
        d["workers"] = {w: {k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()}
                        for w, s in self.workers.items()}
        return d
