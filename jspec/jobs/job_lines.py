"""What every job format shares: a job's row, the line fingerprint and resume key, and the Format that reads and
answers lines (jspec's own in jobs.batch, OpenAI's in jobs.openai_batch)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Callable

from jspec.config import SamplingConfig, stop_tuple


class JobError(ValueError):
    """A job that cannot run without damaging a file or mixing two inputs' results."""


@dataclasses.dataclass
class Job:
    id: object
    line: int
    line_hash: str
    ids: list[int]
    max_new: int
    sampling: SamplingConfig
    stop: tuple[str, ...] = ()
    key: object = None  # the line's resume key (Format.keys)
    meta: dict = dataclasses.field(default_factory=dict)  # what the line's format answers with


@dataclasses.dataclass(frozen=True)
class Format:
    """How a job's lines are read and answered: jspec's own (JSPEC) or OpenAI's batch format
    (jspec.jobs.openai_batch.FORMAT)."""

    name: str  # in messages: "a jspec results file"
    owner: str  # the field that names a line: "id"
    parse: Callable  # (raw, engine, gen, base) -> (owner or None, Job fields or an error message)
    keys: Callable  # (lines) -> {line number: resume key}
    record: Callable  # (engine, job, tokens, stats) -> the result record
    error: Callable  # (job, message) -> the error record
    answered: Callable  # (a record read back) -> (resume key, line fingerprint), None if not one of this format
    where: Callable  # (resume key) -> how a message names the line: "line 3"


def fingerprint(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()[:16]


def resume_key(x):
    """A JSON value (a line's id) as a hashable, order-independent key."""
    return json.dumps(x, sort_keys=True)


def stop_strings(value) -> tuple:
    """A line's "stop": a string, a list of them, or null/absent -> a tuple (check_stops checks it)."""
    return () if value is None else stop_tuple(value)


def loads(text: str | bytes):
    """-> (a line's JSON value, None) or (None, why not): every way a line can fail to parse (not UTF-8, not JSON,
    nesting too deep to recurse, an integer of more digits than Python converts) is that line's error, never the end
    of the job. NaN and Infinity parse (a field's own check names them); an id holding one is refused (line_id)."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg} at column {e.colno}"
    except UnicodeDecodeError as e:
        return None, f"line is not valid UTF-8 (byte 0x{e.object[e.start]:02x} at byte {e.start + 1})"
    except RecursionError:
        return None, "invalid JSON: nested too deeply"
    except ValueError as e:  # Python's limit on the digits of an integer
        return None, f"invalid JSON: {e}"


def line_id(value, field: str = "id"):
    """-> (a line's id, None), or (None, why not) for an id a record could not give back as standard JSON (NaN,
    Infinity)."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return None, f"{field} must be standard JSON (no NaN or Infinity), got {value!r}"
    return value, None
