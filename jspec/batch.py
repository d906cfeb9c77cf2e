"""Offline batch jobs: JSONL in, JSONL out, resumable, one result or error record per input line.

Input lines: {"id": ..., "prompt": str, optional "max_new_tokens", "temperature", "top_p", "top_k",
"seed"}. Output lines: {"id", "line", "text", "token_ids", "stats"} or {"id", "line", "error": message},
where line is the 1-based input line number: exactly one record per non-empty input line. Results are
appended and flushed batch by batch, so a killed job loses at most the batch in flight, and a re-run
skips every line already in the output.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from tqdm import tqdm

from jspec.config import ConfigError, GenerateConfig, SamplingConfig
from jspec.engine import bucket, pad_rows

# optional per-line fields and the types they must have
FIELDS = {"max_new_tokens": int, "temperature": (int, float), "top_p": (int, float), "top_k": int, "seed": int}


@dataclasses.dataclass
class Job:
    id: object
    line: int
    ids: list[int]
    max_new: int
    sampling: SamplingConfig


@dataclasses.dataclass
class Summary:
    """End-of-run totals of a job or a multi-prompt run."""

    prompts: int = 0
    errors: int = 0
    skipped: int = 0  # lines answered by an earlier run of the same job
    new_tokens: int = 0
    rounds: int = 0
    accepted: int = 0
    proposed: int = 0
    round_tokens: int = 0  # tokens emitted by rounds (each row's first token comes from the prefill)
    kv_bytes: int = 0  # the largest batch's KV caches
    compile_s: float = 0.0
    decode_s: float = 0.0
    wall_s: float = 0.0

    def add(self, stats: list[dict]) -> None:
        """Adds one batch: the per-row stats of one compiled call."""
        for st in stats:
            self.prompts += 1
            self.new_tokens += st["new_tokens"]
            self.rounds += st["rounds"]
            self.accepted += st["accepted"]
            self.proposed += st["lookahead"] * st["rounds"]
            self.round_tokens += max(st["new_tokens"] - 1, 0)
            self.kv_bytes = max(self.kv_bytes, st["kv_bytes"])
        if stats:  # compile and decode time are per batch, repeated in each row
            self.compile_s += stats[0]["compile_s"]
            self.decode_s += stats[0]["decode_s"]

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        del d["round_tokens"]
        d.update(compile_s=round(self.compile_s, 3), decode_s=round(self.decode_s, 3), wall_s=round(self.wall_s, 3),
                 tokens_per_s=round(_ratio(self.new_tokens, self.wall_s), 1),
                 decode_tokens_per_s=round(_ratio(self.new_tokens, self.decode_s), 1),
                 accept_length=round(_ratio(self.round_tokens, self.rounds), 3),
                 accept_rate=round(_ratio(self.accepted, self.proposed), 3))
        return d

    def line(self) -> str:
        d = self.as_dict()
        skipped = f" ({self.skipped} done before)" if self.skipped else ""
        spec = f", accept_length {d['accept_length']:.2f}, accept_rate {d['accept_rate']:.2f}" if self.proposed else ""
        return (f"[summary: {self.prompts} prompts{skipped}, {self.errors} errors, {self.new_tokens} new tokens "
                f"in {self.wall_s:.1f}s ({d['tokens_per_s']:.1f} tok/s; compile {self.compile_s:.1f}s, decode "
                f"{self.decode_s:.1f}s at {d['decode_tokens_per_s']:.1f} tok/s){spec}, "
                f"kv {self.kv_bytes / 2**20:.1f} MiB]")


def _ratio(a, b) -> float:
    return a / b if b else 0.0


def done_lines(output: Path) -> set[int]:
    """Input lines already answered. A torn last line (killed mid-write) is cut off first, so that the
    file stays valid JSONL and the line is redone."""
    done = set()
    if not output.is_file():
        return done
    text = output.read_bytes()
    if text and not text.endswith(b"\n"):
        with output.open("r+b") as f:
            f.truncate(text.rfind(b"\n") + 1)
    for line in text.decode(errors="replace").splitlines():
        try:
            done.add(int(json.loads(line)["line"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return done


def _key(x):
    return json.dumps(x, sort_keys=True)


def parse_line(line: str, engine, gen: GenerateConfig, base: SamplingConfig):
    """-> (id, Job fields or an error message)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg} at column {e.colno}"
    if not isinstance(rec, dict):
        return None, "a line must be a JSON object"
    rid = rec.get("id")
    if rid is None:
        return None, "missing id"
    if "prompt" not in rec:
        return rid, "missing prompt"
    if not isinstance(rec["prompt"], str):
        return rid, f"prompt must be a string, got {type(rec['prompt']).__name__}"
    for name, typ in FIELDS.items():
        if name in rec and (not isinstance(rec[name], typ) or isinstance(rec[name], bool)):
            return rid, f"field {name!r} has the wrong type ({type(rec[name]).__name__})"
    sampling = dataclasses.replace(base, **{k: rec[k] for k in ("temperature", "top_p", "top_k", "seed") if k in rec})
    max_new = rec.get("max_new_tokens", gen.max_new_tokens)
    ids = engine.encode(rec["prompt"])
    try:
        sampling.validate()
        engine.check(dataclasses.replace(gen, max_new_tokens=max_new), [len(ids)])
    except ConfigError as e:
        return rid, str(e)
    return rid, dict(ids=ids, max_new=max_new, sampling=sampling)


def read_jobs(engine, input_path: Path, done: set[int], gen: GenerateConfig, base: SamplingConfig):
    """-> (jobs to run, error records to write, number of lines already done)."""
    jobs, errors, ids, skipped = [], [], set(), 0
    for n, line in enumerate(input_path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        rid, job = parse_line(line, engine, gen, base)
        if rid is not None and _key(rid) in ids:
            job = f"duplicate id {rid!r}"  # the first line with an id owns it
        elif rid is not None:
            ids.add(_key(rid))
        if n in done:
            skipped += 1
        elif isinstance(job, dict):
            jobs.append(Job(rid, n, **job))
        else:
            errors.append({"id": rid, "line": n, "error": job})
    return jobs, errors, skipped


def chunks(jobs: list[Job], size: int, room: int):
    """Batches of at most `size` jobs, bucketed by prompt length and max_new (the shapes of the compiled
    program), whose longest prompt + largest max_new fit in `room` tokens."""
    jobs = sorted(jobs, key=lambda j: (bucket(len(j.ids)), j.max_new, len(j.ids)))
    chunk = []
    for j in jobs:
        trial = chunk + [j]
        if len(trial) > size or max(len(x.ids) for x in trial) + max(x.max_new for x in trial) > room:
            yield chunk
            trial = [j]
        chunk = trial
    if chunk:
        yield chunk


def run_chunk(engine, chunk: list[Job], gen: GenerateConfig, batch_size: int):
    """Generates one batch, padded with dummy rows (max_new 0: done at once) to a power of two <= batch_size,
    so that a job's last, partial batch reuses a compiled program instead of compiling a new one."""
    size = min(batch_size, 1 << (len(chunk) - 1).bit_length())
    padded = pad_rows([j.ids for j in chunk], [j.sampling for j in chunk], [j.max_new for j in chunk], size)
    return engine.generate_ids(*padded, gen)[: len(chunk)]


def run_job(engine, input_path: Path, output_path: Path, gen: GenerateConfig, base: SamplingConfig,
            batch_size: int, progress: bool = True) -> Summary:
    """Runs a JSONL job; returns the end-of-run summary. Interrupted (Ctrl-C, kill), the output holds whole
    records only, and the same command resumes it."""
    t0 = time.perf_counter()
    base.validate()
    engine.check(gen)  # the run's own settings: an error here stops the job before it reads a line
    jobs, errors, skipped = read_jobs(engine, input_path, done_lines(output_path), gen, base)
    summary = Summary(errors=len(errors), skipped=skipped)
    with output_path.open("a") as out, tqdm(total=len(jobs), unit="row", disable=not progress) as bar:
        _write(out, errors)
        for chunk in chunks(jobs, batch_size, engine.room(gen)):
            results = run_chunk(engine, chunk, gen, batch_size)
            _write(out, [_record(engine, j, t, st) for j, (t, st) in zip(chunk, results)])
            summary.add([st for _, st in results])
            bar.update(len(chunk))
            bar.set_postfix(tok_s=f"{summary.new_tokens / (time.perf_counter() - t0):.0f}")
    summary.wall_s = time.perf_counter() - t0
    return summary


def _record(engine, job: Job, tokens, stats) -> dict:
    return {"id": job.id, "line": job.line, "text": engine.tokenizer.decode(tokens, skip_special_tokens=True),
            "token_ids": tokens, "stats": stats}


def _write(out, records) -> None:
    if records:  # one write per batch, so an interrupt almost never tears a record (done_lines cuts one off)
        out.write("".join(json.dumps(r) + "\n" for r in records))
        out.flush()
