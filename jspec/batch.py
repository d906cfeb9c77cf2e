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

# optional per-line fields and the types they must have
FIELDS = {"max_new_tokens": int, "temperature": (int, float), "top_p": (int, float), "top_k": int, "seed": int}


@dataclasses.dataclass
class Job:
    id: object
    line: int
    ids: list[int]
    max_new: int
    sampling: SamplingConfig


def done_lines(output: Path) -> set[int]:
    """Input lines already answered; a torn last line (killed mid-write) is ignored and redone."""
    done = set()
    if output.is_file():
        for line in output.read_text().splitlines():
            try:
                done.add(int(json.loads(line)["line"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    return done


def _key(x):
    return json.dumps(x, sort_keys=True)


def parse_line(line: str, engine, gen: GenerateConfig, base: SamplingConfig, capacity: int):
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
    if not isinstance(rec.get("prompt"), str):
        return rid, "missing or non-string prompt"
    for name, typ in FIELDS.items():
        if name in rec and (not isinstance(rec[name], typ) or isinstance(rec[name], bool)):
            return rid, f"field {name!r} has the wrong type ({type(rec[name]).__name__})"
    sampling = dataclasses.replace(base, **{k: rec[k] for k in ("temperature", "top_p", "top_k", "seed") if k in rec})
    max_new = rec.get("max_new_tokens", gen.max_new_tokens)
    try:
        sampling.validate()
        GenerateConfig(max_new_tokens=max_new).validate()
    except ConfigError as e:
        return rid, str(e)
    ids = engine.encode(rec["prompt"])
    if not ids:
        return rid, "empty prompt"
    if len(ids) + max_new + engine.lookahead(gen) + 1 > capacity:
        return rid, f"prompt of {len(ids)} tokens + {max_new} new tokens exceeds the context of {capacity}"
    return rid, dict(ids=ids, max_new=max_new, sampling=sampling)


def run_job(engine, input_path: Path, output_path: Path, gen: GenerateConfig, base: SamplingConfig,
            batch_size: int, progress: bool = True) -> dict:
    """Runs a JSONL job; returns the end-of-run summary."""
    done = done_lines(output_path)
    jobs, errors, ids = [], [], set()
    for n, line in enumerate(input_path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        rid, job = parse_line(line, engine, gen, base, engine.cfg.max_position)
        if rid is not None and _key(rid) in ids:
            job = f"duplicate id {rid!r}"  # the first line with an id owns it
        elif rid is not None:
            ids.add(_key(rid))
        if n in done:
            continue
        if isinstance(job, dict):
            jobs.append(Job(rid, n, **job))
        else:
            errors.append({"id": rid, "line": n, "error": job})
    stats = dict(prompts=len(jobs), errors=len(errors), new_tokens=0, accepted=0, rounds=0, proposed=0, kv_bytes=0)
    t0 = time.perf_counter()
    with output_path.open("a") as out:
        _write(out, errors)
        bar = tqdm(total=len(jobs), unit="row", disable=not progress)
        # bucketing by prompt length keeps padding small and shapes (so compiled programs) few
        jobs.sort(key=lambda j: len(j.ids))
        for i in range(0, len(jobs), batch_size):
            chunk = jobs[i : i + batch_size]
            results = engine.generate_ids([j.ids for j in chunk], [j.sampling for j in chunk],
                                          [j.max_new for j in chunk], gen)
            _write(out, [_record(engine, j, t, st) for j, (t, st) in zip(chunk, results)])
            _tally(stats, results)
            bar.update(len(chunk))
            bar.set_postfix(tok_s=f"{stats['new_tokens'] / (time.perf_counter() - t0):.0f}")
        bar.close()
    stats["wall_s"] = round(time.perf_counter() - t0, 2)
    return stats


def _record(engine, job: Job, tokens, stats) -> dict:
    return {"id": job.id, "line": job.line, "text": engine.tokenizer.decode(tokens, skip_special_tokens=True),
            "token_ids": tokens, "stats": stats}


def _write(out, records) -> None:
    for r in records:
        out.write(json.dumps(r) + "\n")
    out.flush()


def _tally(stats: dict, results) -> None:
    for _, st in results:
        stats["new_tokens"] += st["new_tokens"]
        stats["rounds"] += st["rounds"]
        stats["accepted"] += st["accepted"]
        stats["proposed"] += st["lookahead"] * st["rounds"]
        stats["kv_bytes"] = max(stats["kv_bytes"], st["kv_bytes"])
