"""What draft "auto" learns, kept on disk, so that a new process on the same model pair starts from what earlier ones
measured rather than from the priors (a one-shot `jspec generate --draft auto` only ever has a first call).

The learned state is the engine's: the acceptance seen per (drafter, batch bucket) (lookahead.observe_batch), the
bench of each (lookahead.after_call) and the calls per bucket its probes count from. One small JSON file per model
pair, cache_root()/lookahead/learned-KEY.json, read when jspec.load builds the engine and written whole
(files.atomic_write) after each call it learns from: processes that share a file each continue from the last one
written (the last writer wins; a reader never sees half a file). A file that cannot be read, is not JSON, is of
another FORMAT or holds values out of range is ignored with one warning: the engine starts from the priors.

KEY is a sha256 of what acceptance depends on: the checkpoints load read (Engine.source: the target's path, the
draft argument, the rotations), the target's and the draft models' configs (as the cost files name their models),
the draft models' cache window, the target's KV layout (KVConfig: INT2 or BF16, the windows, clips) and the dtype.
Not the device, the attention kernel or the mesh: acceptance is a property of the models, their numerics and the
prompts, not of the hardware, so estimates learnt on one GPU serve another. Not jspec's code either: the estimate
is an online mean that moves with every call (PRIOR_WEIGHT) and a drafter benched by a stale record is probed again
(PROBE_EVERY), so a change of code costs at most a few calls; FORMAT changes with the file's layout. The prompts are
not in the key: a process continues from whatever workloads earlier ones ran.

Opting out: jspec.load(..., learn="memory"), or JSPEC_LEARN=memory in the environment (the CLI, jobs); the estimates
then live in the engine only. Forgetting: delete the file (or cache_root()/lookahead/learned-*.json for every pair).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
from pathlib import Path

from jspec.config import ConfigError
from jspec.files import atomic_write
from jspec.paths import cache_root
from jspec.runtime.lookahead import Bench

FORMAT = 1  # the file's layout: a file of another is ignored
MODES = ("disk", "memory")
log = logging.getLogger("jspec")


def mode(learn: str | None) -> str:
    """load's learn, checked: "disk" or "memory"; None: $JSPEC_LEARN, else "disk"."""
    if learn is None:
        learn = os.environ.get("JSPEC_LEARN") or "disk"
    if learn not in MODES:
        raise ConfigError(f"learn must be one of {', '.join(MODES)} (or JSPEC_LEARN), got {learn!r}")
    return learn


@dataclasses.dataclass(frozen=True)
class Store:
    """The file one model pair's learned state is kept in (store), and what it was learnt for (written with it, for
    a reader: the key's record)."""

    path: Path
    what: dict

    def read(self) -> tuple[dict, dict, dict]:
        """(seen, bench, calls) as Engine holds them, from the file; empty where there is none or it is ignored."""
        try:
            return _parse(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return {}, {}, {}
        except (OSError, ValueError, TypeError, KeyError) as e:  # unreadable, not JSON, other format, out of range
            log.warning("ignored draft auto's learned estimates in %s (%s): starting from the priors", self.path, e)
            return {}, {}, {}

    def write(self, seen: dict, bench: dict, calls: dict) -> None:
        """The whole state, atomically; a cache that cannot be written is skipped (the engine keeps it in memory)."""
        record = dict(format=FORMAT, what=self.what,
                      seen=[[str(m), int(b), float(n), float(w)] for (m, b), (n, w) in seen.items()],
                      bench=[[str(m), int(b), float(x.last), x.probe_at, int(x.wait)] for (m, b), x in bench.items()],
                      calls=[[int(b), int(n)] for b, n in calls.items()])
        try:
            atomic_write(self.path, json.dumps(record, default=str))
        except OSError:
            pass


def store(source: str, cfg, candidates, kv, dtype: str) -> Store:
    """The Store of an engine loaded from `source` (Engine.source) with these drafters (see the module docstring)."""
    drafts = [dict(mode=d.mode, model=d.model_cfg, window=d.window) for d in candidates if d.model_cfg is not None]
    what = json.loads(json.dumps(dict(source=source, target=cfg, drafts=drafts, kv=kv, dtype=dtype), default=str))
    key = hashlib.sha256(json.dumps(dict(what, format=FORMAT), sort_keys=True).encode()).hexdigest()[:32]
    return Store(cache_root() / "lookahead" / f"learned-{key}.json", what)


def _parse(record) -> tuple[dict, dict, dict]:
    """A file's record as (seen, bench, calls); ValueError or TypeError where any value is not one the engine could
    have written (a negative count, an acceptance outside [0, 1])."""
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"not format {FORMAT}")
    seen, bench, calls = {}, {}, {}
    for m, b, n, w in record["seen"]:
        if not 0 <= _number(w) <= _number(n):
            raise ValueError(f"{w!r} accepted-weighted drafts of {n!r}")
        seen[_name(m), _bucket(b)] = (n, w)
    for m, b, last, probe_at, wait in record["bench"]:
        if not 0 <= _number(last) <= 1:
            raise ValueError(f"an acceptance of {last!r}")
        bench[_name(m), _bucket(b)] = Bench(last, None if probe_at is None else _count(probe_at), _count(wait))
    for b, n in record["calls"]:
        calls[_bucket(b)] = _count(n)
    return seen, bench, calls


def _number(x) -> float:
    """x where it is a finite number (not a bool) at or above 0, else TypeError or ValueError."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{x!r} is not a number")
    if not 0 <= x < math.inf:
        raise ValueError(f"{x!r} is not a finite count")
    return x


def _count(x) -> int:
    if not isinstance(_number(x), int):
        raise TypeError(f"{x!r} is not a whole count")
    return x


def _bucket(b) -> int:
    if _count(b) < 1 or b & (b - 1):
        raise ValueError(f"{b!r} is not a batch bucket (a power of two)")
    return b


def _name(m) -> str:
    if not isinstance(m, str):
        raise TypeError(f"{m!r} is not a drafter's name")
    return m
