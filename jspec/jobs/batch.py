"""Offline batch jobs: JSONL in, JSONL out, resumable, one result or error record per input line.

Input lines: {"id": ..., "prompt": str, optional "max_new_tokens", "temperature", "top_p", "top_k",
"seed", "stop" (a string or a list of them)}. Output lines: {"id", "line", "line_hash", "text", "token_ids", "stats"} or {"id", "line",
"line_hash", "error": message}, where line is the 1-based input line number and line_hash a fingerprint
of that line's bytes: exactly one record per non-empty input line. Anything wrong with one line (bad
JSON or UTF-8, an unknown field, a value out of range, a prompt that does not fit) is that line's error
record, never the end of the job. Results are appended and flushed batch by batch, so a killed job loses
at most the rows in flight; a re-run skips every line already answered, after checking that those
lines have not changed. The output is locked while a job writes it, and a file that is not a jspec
results file is never written to.

An input whose first valid line has "custom_id" and "body" is an OpenAI batch file, read and answered in
OpenAI's format (jspec.jobs.openai_batch: a Format); resume then keys lines by custom_id.

Rows are refilled as they finish (jspec.runtime.slots): the lines of a capacity bucket (small buckets joined
to the next) run in one batch of --batch-size slots, and a slot whose row is done is written out and takes the
group's next line, longest first, so no row waits for the slowest of its batch. The summary's wasted_row_rounds
counts the rounds in which a slot was done or empty. refill=False, or an engine on a mesh: static batches,
each run until its last row is done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from jspec import files
from jspec.jobs import openai_batch
from jspec.jobs.job_lines import Format, Job, JobError, fingerprint, line_id, loads, resume_key, stop_strings
from jspec.config import ConfigError, GenerateConfig, OutOfMemory, SamplingConfig, check_stops
from jspec.runtime import slots
from jspec.runtime.buckets import pad_rows
from jspec.runtime.engine import Stats

# optional per-line fields and the types they must have
FIELDS = {"max_new_tokens": int, "temperature": (int, float), "top_p": (int, float), "top_k": int, "seed": int,
          "stop": (str, list)}
KNOWN_FIELDS = ("id", "prompt", *FIELDS)
RECORD_START = b'{"id": '  # every record the job writes starts so (json.dumps, "id" first)
BOM = b"\xef\xbb\xbf"


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
    row_rounds: int = 0  # jobs: the rounds the batches ran, times their rows (done and padding rows included)
    compile_s: float = 0.0
    cache_s: float = 0.0  # tracing programs and reading them back from a compilation cache (a warm run's builds)
    measure_s: float = 0.0  # measuring (or reading back) lookahead costs (--lookahead auto)
    decode_s: float = 0.0
    wall_s: float = 0.0

    def add(self, stats: list[Stats], call: tuple[float, float, int] | None = None) -> None:
        """Adds one batch: the per-row stats of one compiled call; or, with call = (compile s, decode s,
        row-rounds), the rows that one step of a refilled batch finished and what the step cost."""
        for st in stats:
            self.prompts += 1
            self.new_tokens += st.new_tokens
            self.rounds += st.rounds
            self.accepted += st.accepted
            self.proposed += st.lookahead * st.rounds
            self.round_tokens += max(st.new_tokens - 1, 0)
            self.kv_bytes = max(self.kv_bytes, st.batch_kv_bytes)
        if call is not None:
            self.compile_s += call[0]
            self.decode_s += call[1]
            self.row_rounds += call[2]
        elif stats:  # compile and decode time are per batch, repeated in each row
            if getattr(stats[0], "compile_cached", False):
                self.cache_s += stats[0].compile_s
            else:
                self.compile_s += stats[0].compile_s
            self.decode_s += stats[0].decode_s
            self.measure_s += (stats[0].lookahead_auto or {}).get("measure_s", 0.0)

    def count_builds(self, before: dict, after: dict) -> None:
        """compile_s and cache_s from an engine's build seconds (Engine.built) before and after the run, which tell a
        compile from a cache hit (a call's own compile_s does not)."""
        if before and after:
            self.compile_s, self.cache_s = (after[k] - before[k] for k in ("compile_s", "cache_s"))

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        del d["round_tokens"]
        d.update(compile_s=round(self.compile_s, 3), cache_s=round(self.cache_s, 3),
                 measure_s=round(self.measure_s, 3), decode_s=round(self.decode_s, 3), wall_s=round(self.wall_s, 3),
                 tokens_per_s=round(_ratio(self.new_tokens, self.wall_s), 1),
                 decode_tokens_per_s=round(_ratio(self.new_tokens, self.decode_s), 1),
                 accept_length=round(_ratio(self.round_tokens, self.rounds), 3),
                 accept_rate=round(_ratio(self.accepted, self.proposed), 3))
        if self.row_rounds:
            d.update(wasted_row_rounds=self.row_rounds - self.rounds,
                     wasted_fraction=round(_ratio(self.row_rounds - self.rounds, self.row_rounds), 4))
        return d

    def line(self) -> str:
        d = self.as_dict()
        skipped = f" ({self.skipped} done before)" if self.skipped else ""
        spec = f", accept_length {d['accept_length']:.2f}, accept_rate {d['accept_rate']:.2f}" if self.proposed else ""
        spec += f", wasted row-rounds {d['wasted_fraction']:.1%}" if self.row_rounds else ""
        return (f"[summary: {self.prompts} prompts{skipped}, {self.errors} errors, {self.new_tokens} new tokens "
                f"in {self.wall_s:.1f}s ({d['tokens_per_s']:.1f} tok/s; compile {self.compile_s:.1f}s"
                + (f", compile cache hits {self.cache_s:.1f}s" if self.cache_s else "") + ", costs "
                f"{self.measure_s:.1f}s, decode "
                f"{self.decode_s:.1f}s at {d['decode_tokens_per_s']:.1f} tok/s){spec}, "
                f"kv {self.kv_bytes / 2**20:.1f} MiB]")


def _ratio(a, b) -> float:
    return a / b if b else 0.0


def input_lines(data: bytes) -> list[tuple[int, bytes]]:
    """(1-based number, bytes) of each input line. Split on newlines only: JSON strings may hold U+2028,
    U+0085 and other characters that str.splitlines() would also split at. A CR before the newline
    and a UTF-8 byte order mark at the start are dropped."""
    lines = data.removeprefix(BOM).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [(n, line.removesuffix(b"\r")) for n, line in enumerate(lines, 1)]


def _decode(raw: bytes):
    """-> (the line's JSON object, None) or (its id or None, error message)."""
    rec, error = loads(raw)
    if error and error.startswith("line is not valid UTF-8"):
        rec, _ = loads(raw.decode("utf-8", "replace"))  # for the id of the error record only
        return (rec.get("id") if isinstance(rec, dict) else None), error
    if error or not isinstance(rec, dict):
        return None, error or "a line must be a JSON object"
    return rec, None


def _check_fields(rec: dict) -> str | None:
    """The first problem with a line's fields (unknown, missing or of the wrong type), or None."""
    unknown = sorted(set(rec) - set(KNOWN_FIELDS))
    if unknown:  # a typo such as max_new_token must not fall back to the default silently
        return f"unknown field {unknown[0]!r} (known fields: {', '.join(KNOWN_FIELDS)})"
    if "prompt" not in rec:
        return "missing prompt"
    if not isinstance(rec["prompt"], str):
        return f"prompt must be a string, got {type(rec['prompt']).__name__}"
    for name, typ in FIELDS.items():
        if name in rec and (not isinstance(rec[name], typ) or isinstance(rec[name], bool)):
            return f"field {name!r} has the wrong type ({type(rec[name]).__name__})"
    return None


def parse_line(raw: bytes, engine, gen: GenerateConfig, base: SamplingConfig):
    """-> (id, Job fields or an error message)."""
    rec, error = _decode(raw)
    if error:
        return rec, error
    rid, error = line_id(rec.get("id"))
    if error:
        return None, error
    if rid is None:
        return None, "missing id"
    error = _check_fields(rec)
    if error:
        return rid, error
    sampling = dataclasses.replace(base, **{k: rec[k] for k in ("temperature", "top_p", "top_k", "seed") if k in rec})
    max_new = rec.get("max_new_tokens", gen.max_new_tokens)
    stop = stop_strings(rec["stop"]) if "stop" in rec else gen.stop
    try:
        check_stops(stop)
        sampling.validate()
        ids = engine.prompt_ids(rec["prompt"])
        engine.check(dataclasses.replace(gen, max_new_tokens=max_new), [len(ids)])
    except ConfigError as e:
        return rid, str(e)
    return rid, dict(ids=ids, max_new=max_new, sampling=sampling, stop=stop)


def read_jobs(engine, lines: list[tuple[int, bytes]], done: dict, gen: GenerateConfig, base: SamplingConfig,
              fmt: Format | None = None):
    """-> (jobs to run, error records to write, number of lines already done)."""
    fmt = fmt or JSPEC
    jobs, errors, ids, skipped = [], [], set(), 0
    keys = fmt.keys(lines)
    for n, raw in lines:
        if not raw.strip():
            continue
        rid, job = fmt.parse(raw, engine, gen, base)
        if rid is not None and resume_key(rid) in ids:
            job = f"duplicate {fmt.owner} {rid!r}"  # the first line with an id owns it
        elif rid is not None:
            ids.add(resume_key(rid))
        if keys[n] in done:
            skipped += 1
        elif isinstance(job, dict):
            jobs.append(Job(rid, n, fingerprint(raw), key=keys[n], **job))
        else:
            errors.append(fmt.error(Job(rid, n, fingerprint(raw), [], 0, base, key=keys[n]), job))
    return jobs, errors, skipped


def check_paths(input_path: Path, output_path: Path) -> None:
    """The input is a regular file or a pipe (`<(cmd)`: read once); the output a regular file or a new path in an
    existing directory (a device would be read to its end, /dev/zero without one), and so is its settings file
    (settings_path), whose name fits the file system; neither file jspec writes is the input, in any spelling."""
    files.require(input_path, "--input", "a regular file", "a pipe")
    settings = settings_path(output_path)
    for path, what in ((output_path, "--output"), (settings, "--output's settings file")):
        if files.kind(path) == "missing":
            files.require(path.parent, f"{what}'s directory", "a directory")
        else:
            files.require(path, what, "a regular file")
        if files.same(input_path, path):  # a symlink or a hard link to the input included
            raise JobError(f"{what} {str(path)!r} is the --input file: give another --output for the results")
    limit = os.pathconf(output_path.parent, "PC_NAME_MAX")
    if len(os.fsencode(settings.name)) > limit:
        raise JobError(f"--output's name is too long: jspec keeps its settings beside it in {settings.name!r}, "
                       f"longer than the {limit} bytes a name may have here; give a shorter --output")


def _result_record_of(rec: dict) -> dict | None:
    """rec, if it is a record a jspec job writes, else None."""
    ok = (isinstance(rec, dict) and "id" in rec and isinstance(rec.get("line"), int)
          and isinstance(rec.get("line_hash"), str) and ("text" in rec or "error" in rec))
    return rec if ok else None


def answered_lines(data: bytes, path: Path, fmt: Format | None = None) -> tuple[dict, int]:
    """({input line: its fingerprint}, bytes of whole records) of an output file's content; a torn last
    record (killed mid-write) is not counted. JobError if anything else is in it: a file that a job did not
    write is never written to."""
    fmt = fmt or JSPEC
    complete, _, _ = data.rpartition(b"\n")
    records = [_read_record(line, fmt) for line in complete.split(b"\n")] if complete else []
    if data and (not data.startswith(RECORD_START) or None in records):
        bad = records.index(None) + 1 if None in records else 1
        raise JobError(f"{str(path)!r} is not {fmt.name} (line {bad} is not a result record): "
                       "refusing to write to it; give another --output")
    return dict(records), len(complete) + bool(complete)


def _read_record(line: bytes, fmt: Format):
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return fmt.answered(rec) if isinstance(rec, dict) else None


def check_resume(done: dict, lines: list[tuple[int, bytes]], output_path: Path, fmt: Format | None = None) -> None:
    """The lines answered in the output must be the input's lines: else its results belong to another input."""
    fmt = fmt or JSPEC
    keys = fmt.keys(lines)
    now = {keys[n]: fingerprint(raw) for n, raw in lines if n in keys}
    changed = [k for k, h in sorted(done.items(), key=lambda kv: resume_key(kv[0])) if now.get(k) != h]
    if changed:
        raise JobError(f"the input has changed since {str(output_path)!r} was written ({fmt.where(changed[0])} "
                       f"differs from the line answered there): run again with --restart to discard those results and "
                       f"start over, or give another --output")


def _lock(f, path: Path) -> None:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when f is closed, or the process dies
    except BlockingIOError:
        raise JobError(f"another job is writing {str(path)!r} (it holds the file's lock): wait for it to "
                       "finish, or give another --output") from None


@contextlib.contextmanager
def open_output(path: Path, restart: bool = False, fmt: Format | None = None):
    """Yields (the output opened for appending, {answered line: fingerprint}) and holds an exclusive lock on
    it meanwhile: a second job on the same output is refused, never interleaved. A torn last record is
    cut off, so that the file stays valid JSONL and the line is redone; restart empties the file."""
    with path.open("a+b") as f:
        _lock(f, path)
        f.seek(0)
        data = f.read()
        done, whole = answered_lines(data, path, fmt)
        if restart or whole < len(data):
            f.truncate(0 if restart else whole)
        yield f, {} if restart else done


def read_input(input_path: Path) -> bytes:
    """The job's input, read once (a pipe cannot be read again: say so, since the same lines must be fed again to
    resume the job)."""
    if files.kind(input_path) == "a pipe":
        print(f"note: --input {str(input_path)!r} is a pipe, read once: to resume this job, feed it the same lines",
              file=sys.stderr)
    return input_path.read_bytes()


def preflight(input_path: Path, output_path: Path, restart: bool = False) -> bytes:
    """run_job's checks of its files, writing nothing: the CLI runs them before it loads a model. Returns the
    input's bytes, for run_job (read once)."""
    check_paths(input_path, output_path)
    data = read_input(input_path)
    if output_path.is_file():
        lines = input_lines(data)
        fmt = detect_format(lines)
        with output_path.open("rb") as f:
            _lock(f, output_path)
            done, _ = answered_lines(f.read(), output_path, fmt)
        if not restart:
            check_resume(done, lines, output_path, fmt)
    return data


def job_settings(engine, gen: GenerateConfig, base: SamplingConfig) -> dict:
    """What a job's records depend on besides their lines: the models (engine.source: the paths it loaded), the
    drafter, dtype, KV cache, the build options and the defaults a line may leave out (sampling, max_new_tokens,
    stop, lookahead)."""
    return {"models": engine.source, "drafter": str(engine.draft_mode), "dtype": engine.dtype, "kv": repr(engine.kv),
            "model": repr(engine.cfg), "options": repr(engine.options), "generate": repr(gen), "sampling": repr(base)}


def settings_path(output_path: Path) -> Path:
    return output_path.with_name(output_path.name + ".settings.json")


def check_settings(output_path: Path, settings: dict, restart: bool = False) -> None:
    """A resumed job runs with the settings its output was made with (kept beside it, settings_path), or stops and
    says which differ: its records would otherwise mix two runs' results. A new (or restarted) output records them."""
    path = settings_path(output_path)
    kept, _ = loads(path.read_bytes()) if path.is_file() else (None, None)
    if not restart and output_path.stat().st_size:
        if not isinstance(kept, dict):  # the records could be any run's: never mix them with this one's
            raise JobError(f"{str(output_path)!r} holds results, but its settings file {str(path)!r} is "
                           f"{'missing' if not path.is_file() else 'not a JSON object'}: the run that made them "
                           "cannot be checked against this one; --restart to start over, or give another --output")
        changed = sorted(k for k in settings.keys() | kept.keys() if settings.get(k) != kept.get(k))
        if changed:
            raise JobError(f"{str(output_path)!r} was made with other settings ({', '.join(changed)} differ: "
                           f"{', '.join(f'{k} was {kept.get(k)!r}' for k in changed)}): run with those settings, or "
                           "--restart to start over")
    files.atomic_write(path, json.dumps(settings, indent=1))


def detect_format(lines: list[tuple[int, bytes]]) -> Format:
    """OpenAI's batch format where the first line that is a JSON object has "custom_id" and "body", else
    jspec's own."""

    return openai_batch.FORMAT if openai_batch.is_openai(lines) else JSPEC


def chunks(jobs: list[Job], size: int, capacity):
    """Batches of at most `size` jobs, grouped by the compiled program they need: sorted by the cache
    capacity of each row alone (capacity(job), engine.capacity's bucket), then by max_new (a batch decodes
    until its last row is done), then cut. Only a batch that straddles two buckets takes the larger: a
    job compiles at most one program per bucket (all its batches have one size, see batch_rows)."""
    jobs = sorted(jobs, key=lambda j: (capacity(j), j.max_new, len(j.ids)))
    return [jobs[i : i + size] for i in range(0, len(jobs), size)]


def batch_rows(batch_size: int, n_jobs: int) -> int:
    """Rows per compiled batch of a job: batch_size, or the power of two that holds a smaller job."""
    return min(batch_size, 1 << max(n_jobs - 1, 0).bit_length())


def run_chunk(engine, chunk: list[Job], gen: GenerateConfig, size: int):
    """Generates one batch, padded to `size` rows with dummy rows (max_new 0: done at once), so that every
    batch of a job, the last partial one included, runs a program of the same batch size."""
    padded = pad_rows([j.ids for j in chunk], [j.sampling for j in chunk], [j.max_new for j in chunk], size)
    stop = [j.stop for j in chunk] + [()] * (size - len(chunk))
    return engine.generate_ids(*padded, gen, stop)[: len(chunk)]


def answer(engine, chunk: list[Job], gen: GenerateConfig, size: int, fmt: Format | None = None) -> list[dict]:
    """The records of one batch (a row's stats as engine.Stats until written). A row the engine refuses for a
    reason parse_line did not foresee (a
    ConfigError, or a value that overflows a device dtype) costs only that row: the batch is retried
    row by row, and the row that fails alone gets an error record. A batch whose caches do not fit in memory
    (OutOfMemory) runs its rows one at a time."""
    return [rec for rec, _ in _answer(engine, chunk, gen, size, fmt or JSPEC)]


def _answer(engine, chunk: list[Job], gen: GenerateConfig, size: int, fmt: Format) -> list[tuple[dict, Stats | None]]:
    """answer's (record, the row's stats or None for an error) pairs."""
    try:
        results = run_chunk(engine, chunk, gen, size)
    except OutOfMemory as e:  # the batch shrinks to one row; a row that does not fit alone is its error record
        if size > 1:
            return [r for j in chunk for r in _answer(engine, [j], gen, 1, fmt)]
        return [(fmt.error(chunk[0], str(e)), None)]
    except (ConfigError, OverflowError) as e:
        if len(chunk) == 1:
            return [(fmt.error(chunk[0], str(e)), None)]
        return [r for j in chunk for r in _answer(engine, [j], gen, size, fmt)]
    return [(fmt.record(engine, j, t, st), st) for j, (t, st) in zip(chunk, results)]


def run_job(engine, input_path: str | Path, output_path: str | Path, gen: GenerateConfig, base: SamplingConfig,
            batch_size: int, progress: bool = True, restart: bool = False, data: bytes | None = None,
            refill: bool = True) -> Summary:
    """Runs a JSONL job; returns the end-of-run summary. Interrupted (Ctrl-C, kill), the output holds whole
    records only, and the same command resumes it. restart discards the output's records first. The
    progress bar shows only when stderr is a terminal. data: the input's bytes when the caller read them
    (preflight), else the input is read here. refill: rows refilled as they finish (the module docstring);
    False: static batches."""
    t0, built = time.perf_counter(), dict(getattr(engine, "built", {}))
    base.validate()
    engine.check(gen)  # the run's own settings: an error here stops the job before it reads a line
    input_path, output_path = Path(input_path), Path(output_path)
    check_paths(input_path, output_path)
    lines = input_lines(read_input(input_path) if data is None else data)
    fmt = detect_format(lines)
    with open_output(output_path, restart, fmt) as (out, done):
        check_settings(output_path, job_settings(engine, gen, base), restart)
        check_resume(done, lines, output_path, fmt)
        jobs, errors, skipped = read_jobs(engine, lines, done, gen, base, fmt)
        summary = Summary(errors=len(errors), skipped=skipped)
        with tqdm(total=len(jobs), unit="row", disable=None if progress else True) as bar:  # None: off if no tty
            _write(out, errors)
            for answered, call in run_rows(engine, jobs, gen, batch_size, fmt, refill):
                _write(out, [rec for rec, _ in answered])
                summary.add([st for _, st in answered if st is not None], call)
                summary.errors += sum(st is None for _, st in answered)
                bar.update(len(answered))
                bar.set_postfix(tok_s=f"{summary.new_tokens / (time.perf_counter() - t0):.0f}")
    summary.wall_s = time.perf_counter() - t0
    summary.count_builds(built, getattr(engine, "built", {}))
    return summary


def _static(engine, jobs: list[Job], gen: GenerateConfig, batch_size: int, fmt: Format):
    """Static batches (chunks): yields (answered, (compile s, decode s, row-rounds)) per batch."""
    size = batch_rows(batch_size, len(jobs))
    capacity = lambda j: engine.capacity(gen, [len(j.ids)], [j.max_new])
    for chunk in chunks(jobs, size, capacity):
        answered = _answer(engine, chunk, gen, size, fmt)
        stats = [st for _, st in answered if st is not None]
        # the batch ran until its slowest row was done: every row slot ran that row's rounds
        call = (stats[0].compile_s, stats[0].decode_s, size * max(st.rounds for st in stats)) if stats else None
        yield answered, call


def run_rows(engine, jobs: list[Job], gen: GenerateConfig, batch_size: int, fmt: Format | None = None,
             refill: bool = True, refill_at: int | None = None, fills: int = slots.FILLS):
    """The jobs' (record, stats or None) pairs as they are answered: yields (answered, (compile s, decode s,
    row-rounds)) per batch, or per step of a refilled batch (refill_at: slots.refilled's; fills: slots.groups')."""
    fmt = fmt or JSPEC
    if refill and engine.mesh is None:
        yield from _refilled(engine, jobs, gen, batch_size, fmt, refill_at, fills)
    else:
        yield from _static(engine, jobs, gen, batch_size, fmt)


def _refilled(engine, jobs: list[Job], gen: GenerateConfig, batch_size: int, fmt: Format, refill_at=None,
              fills: int = slots.FILLS):
    """The jobs in batches whose rows are refilled as they finish, one per group of capacity buckets
    (runtime.slots.groups): yields (answered, (compile s, decode s, row-rounds)) per step. A group of one row, or
    one the engine refuses (ConfigError, OverflowError: a value parse_line did not foresee), runs in static
    batches (_static), where a refused row costs only itself."""
    capacity = lambda j: engine.capacity(gen, [len(j.ids)], [j.max_new])
    for group in slots.groups(jobs, batch_rows(batch_size, len(jobs)), capacity, fills):
        size = batch_rows(batch_size, len(group))
        if size == 1:
            yield from _static(engine, group, gen, 1, fmt)
            continue
        left = {id(j): j for j in group}
        try:
            for f in slots.refilled(engine, group, gen, size, refill_at):
                for job, _, _ in f.done:
                    del left[id(job)]
                yield [(fmt.record(engine, j, t, st), st) for j, t, st in f.done], (f.compile_s, f.decode_s,
                                                                                       f.row_rounds)
        except (ConfigError, OverflowError):
            yield from _static(engine, list(left.values()), gen, size, fmt)


def _record(engine, job: Job, tokens, stats) -> dict:
    return {"id": job.id, "line": job.line, "line_hash": job.line_hash,
            "text": engine.text(tokens, job.stop, getattr(stats, "healed", "")), "token_ids": tokens, "stats": stats}


def _error(job: Job, message: str) -> dict:
    return {"id": job.id, "line": job.line, "line_hash": job.line_hash, "error": message}


def _answered(rec: dict):
    """(line, fingerprint) of a jspec record, or None."""
    rec = _result_record_of(rec)
    return None if rec is None else (rec["line"], rec["line_hash"])


JSPEC = Format("a jspec results file", "id", parse_line, lambda lines: {n: n for n, _ in lines}, _record, _error,
               _answered, lambda n: f"line {n}")


def _write(out, records) -> None:
    if records:  # one write per batch, so an interrupt almost never tears a record (answered_lines cuts one off)
        out.write("".join(json.dumps(r, default=Stats.as_dict) + "\n" for r in records).encode())
        out.flush()
