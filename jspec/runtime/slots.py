"""A job's rows refilled as they finish: one batch of slots per capacity bucket, each slot taking the bucket's
next waiting row as soon as its row is done (decode.refill's programs, compiled once per bucket).

    for flush in refilled(engine, rows, gen, size=16):
        for row, token_ids, stats in flush.done: ...

The loop on the host: place waiting rows into the free slots (refill_program: the prefill of `refill_at` rows
at a time, scattered into their slots), run rounds until `refill_at` more rows are done (rounds_until_program),
hand the finished rows out, repeat. A row is any
object with ids, sampling, max_new and stop (jobs.batch.Job). Waiting rows are taken longest first (max_new):
the batch's tail, when no row is left to place, is then its shortest rows. A row's output equals what it gives
in a batch of its own (greedy; sampled rows draw from their own seed's keys, as in generate).

A slot that is done (or empty: nothing left to place) still runs each round with the others: `row_rounds` counts
every slot's rounds, so that row_rounds less the rows' own rounds is what the batch wasted.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from jspec.config import INT32_MAX, GenerateConfig, SamplingConfig
from jspec.decode import fallback, refill, stops
from jspec.decode.state import DecodeState
from jspec.model.sampling import Sampler
from jspec.runtime.buckets import capacity_bucket


@dataclasses.dataclass
class Flush:
    """What one step (a refill and its rounds) finished, and what it cost."""

    done: list  # [(row, token ids, engine.Stats)] the rows that finished
    compile_s: float  # compiling this bucket's programs (the first step only)
    decode_s: float  # the step's device time, refill included
    row_rounds: int  # slots x rounds run: every slot's rounds, done and empty ones included


def default_refill_at(size: int) -> int:
    """Rows that must be done before the rounds stop for a refill: an eighth of the batch, at least one (each
    stop is a host sync and a refill program; benchmarks/jobs.py measures the choices)."""
    return max(1, size // 8)


FILLS = 8  # a refilled batch takes at least this many times its slots in rows (groups; benchmarks/jobs.py)


def groups(rows: list, size: int, capacity, fills: int = FILLS) -> list[list]:
    """The rows by capacity bucket (capacity(row): its own bucket), smallest first, one refilled batch each; a
    bucket of fewer than `fills` x size rows joins the next one up (its rows fit the larger cache), so that a
    batch's tail, the rounds once no row is left to place, is a small part of its rounds."""
    by_bucket: dict[int, list] = {}
    for r in rows:
        by_bucket.setdefault(capacity(r), []).append(r)
    out, group = [], []
    for _, bucket in sorted(by_bucket.items()):
        group += bucket
        if len(group) >= fills * size:
            out, group = out + [group], []
    if group and out and len(group) < fills * size:  # the last rows join the largest group: they fit its cache
        out[-1] += group
    elif group:
        out.append(group)
    return out


def refilled(engine, rows: list, gen: GenerateConfig, size: int, refill_at: int | None = None,
             limit: int = INT32_MAX):
    """Yields a Flush per step until every row is done; rows: one capacity bucket's (see the module docstring),
    each checked (engine.check) before. refill_at: rows done before a refill (default_refill_at); limit: at
    most this many rounds per step."""
    if not rows:
        return
    batch = _Batch(engine, rows, gen, size, min(refill_at or default_refill_at(size), size))
    while True:
        flush = batch.step(limit)
        if flush is None:
            return
        yield flush


class _Batch:
    """The slots, their rows and the device state of one bucket's batch."""

    def __init__(self, engine, rows: list, gen: GenerateConfig, size: int, refill_at: int):
        # refill_at: rows done before the rounds stop, and the rows one refill prefills (R: padded, or several
        # refills where more slots are free)
        self.engine, self.size, self.refill_at = engine, size, refill_at
        self.queue = sorted(rows, key=lambda r: -r.max_new)
        lengths, max_new = [len(r.ids) for r in rows], [r.max_new for r in rows]
        need = max(zip(lengths, max_new), key=sum)  # "auto" K: planned for the most demanding row in every slot
        self.gen, self.choice = engine.plan(gen, [need[0]] * size, [need[1]] * size)
        self.engine = engine = engine.using(self.choice)  # draft "auto": the drafter chosen for the whole batch
        capacity = engine.capacity(self.gen, lengths, max_new)
        self.width = capacity_bucket(max(lengths), capacity)  # prompt array: the prefill reads no wider
        has_stops = any(r.stop for r in rows) and engine.token_bytes() is not None
        self.stop_shape = stops.pack_shape([r.stop for r in rows]) if has_stops else None
        self.greedy = all(r.sampling.temperature == 0 for r in rows)  # static: one program for the whole bucket
        self.heal = gen.heal and engine.token_bytes() is not None  # static too: the first token's mask or none
        self.healing: dict = {}  # id(row) -> (ids, removed text, allowed [V] or None): _healed
        args = engine.prepare([[0]] * size, [SamplingConfig()] * size, [0] * size, self.gen, [()] * size,
                              capacity=capacity, choice=self.choice)
        self.models, self.eos_ids, self.K = args.models, args.eos_ids, args.models.lookahead
        self.kv_bytes = engine.kv_bytes(args)
        self.slots: list = [None] * size
        self.life: list = [None] * size  # per slot: (device s, compile s, batch tokens) when its row was placed
        self.clock = dict(decode_s=0.0, compile_s=0.0, tokens=0)
        host = self._args(self.slots)
        self.compile_s = 0.0
        empty = self._program("empty", refill.empty_program, args.models, host["prompts"], host["prompt_lens"],
                              host["max_new"], host["seeds"], args.cache, args.draft_cache, args.eos_ids,
                              host["stops"])
        self.state: DecodeState = empty(args.models, host["prompts"], host["prompt_lens"], host["max_new"],
                                        host["seeds"], args.cache, args.draft_cache, args.eos_ids, host["stops"])
        self.count = np.zeros(size, np.int64)

    def _program(self, name: str, jitted, *args):
        """jitted compiled for args (kept in the engine's program cache; the compile time counted)."""
        program, seconds = self.engine.program(f"refill.{name}", jitted, *args)
        self.compile_s += seconds
        return program

    def _healed(self, row) -> tuple:
        """(the row's ids, the text token healing removed, its first token's allowed [V] or None): engine.heal."""
        if id(row) not in self.healing:
            h = self.engine.heal([row.ids], [row.stop], self.gen)
            self.healing[id(row)] = (h.ids[0], h.removed[0], None if h.allowed is None else h.allowed[0])
        return self.healing[id(row)]

    def _args(self, rows: list) -> dict:
        """Rows as program arguments (None, an empty slot: a one-token prompt, max_new 0)."""
        prompts = np.zeros((len(rows), self.width), np.int32)
        ids = [None if r is None else self._healed(r)[0] for r in rows]
        for b, x in enumerate(ids):
            if x is not None:
                prompts[b, : len(x)] = x
        allowed = None
        if self.heal:
            V = self.engine.cfg.vocab_size
            mask = [None if r is None else self._healed(r)[2] for r in rows]
            allowed = jax.device_put(np.stack([np.ones(V, bool) if m is None else m for m in mask]))
        col = lambda f, dt, empty: np.asarray([empty if r is None else f(r) for r in rows], dt)
        put = jax.device_put
        sampler = Sampler(put(col(lambda r: r.sampling.temperature, np.float32, 0.0)),
                          put(col(lambda r: r.sampling.top_k, np.int32, 0)),
                          put(col(lambda r: r.sampling.top_p, np.float32, 1.0)), self.greedy)
        stop = None
        if self.stop_shape is not None:
            packed = stops.pack(self.engine.token_bytes(), [() if r is None else r.stop for r in rows], self.stop_shape)
            stop = self.engine.stop_arrays(packed)
        return dict(prompts=put(prompts), prompt_lens=put(col(lambda r: len(self._healed(r)[0]), np.int32, 1)),
                    max_new=put(col(lambda r: r.max_new, np.int32, 0)),
                    seeds=put(col(lambda r: r.sampling.seed, np.uint32, 0)), sampler=sampler, stops=stop,
                    allowed=allowed)

    def _place(self) -> list[int]:
        """Waiting rows into the free slots -> the slots filled."""
        placed = []
        for b in range(self.size):
            if self.slots[b] is None and self.queue:
                self.slots[b] = self.queue.pop(0)
                self.life[b] = (self.clock["decode_s"], self.clock["compile_s"], self.clock["tokens"])
                placed.append(b)
        return placed

    def _refill(self, placed: list[int], all_stops, s: DecodeState) -> DecodeState:
        """s with the rows of the slots `placed` started, refill_at rows per refill program."""
        R = self.refill_at
        for i in range(0, len(placed), R):
            at = placed[i: i + R] + [self.size] * (R - len(placed[i: i + R]))  # slot B: a padding row, dropped
            h = self._args([self.slots[b] if b < self.size else None for b in at])
            a = (self.models, h["prompts"], h["prompt_lens"], h["max_new"], h["sampler"], h["seeds"], self.eos_ids,
                 h["stops"], all_stops, jax.device_put(np.asarray(at, np.int32)), s, h["allowed"])
            s = self._program("refill", refill.refill_program, *a)(*a)
        return s

    def step(self, limit: int) -> Flush | None:
        """Places waiting rows, refills their slots, runs rounds -> what finished (None: nothing left)."""
        placed = self._place()
        active = sum(r is not None for r in self.slots)
        if not active:
            return None
        t0, compiled = time.perf_counter(), self.compile_s  # compile_s: this step's, and the empty state's before
        h = self._args(self.slots)
        s = self._refill(placed, h["stops"], self.state) if placed else self.state
        want = (self.size - active) + min(self.refill_at, active)
        a = (self.models, h["sampler"], h["max_new"], self.eos_ids, jax.device_put(np.int32(limit)),
             jax.device_put(np.int32(want)), s)
        self.state, n = self._program("rounds", refill.rounds_until_program, *a)(*a)
        done, count = np.asarray(self.state.done), np.asarray(self.state.count)
        decode_s = time.perf_counter() - t0 - (self.compile_s - compiled)
        self.clock["decode_s"] += decode_s
        self.clock["compile_s"] += self.compile_s
        new = np.isin(np.arange(self.size), placed)
        self.clock["tokens"] += int(np.where(new, count, count - self.count).sum())
        self.count = count
        finished = [b for b in range(self.size) if self.slots[b] is not None and done[b]]
        flush = Flush(self._finish(finished), self.compile_s, decode_s, self.size * int(n))
        for b in finished:
            self.slots[b] = None
        self.compile_s = 0.0
        return flush

    def _finish(self, finished: list[int]) -> list:
        """(row, token ids, Stats) of the finished slots; their acceptance is learnt for lookahead "auto"
        (real rows only: an empty slot is never finished)."""
        if not finished:
            return []
        st = self.state
        tokens, rounds, accepted = np.asarray(st.tokens), np.asarray(st.rounds), np.asarray(st.accepted)
        drafted = fallback.drafted_rounds(st)
        eng, K, out = self.engine, self.K, []
        eng.observe(K, self.size, int(drafted[finished].sum()), int(accepted[finished].sum()), self.choice)
        for b in finished:
            row, n = self.slots[b], int(self.count[b])
            t_decode, t_compile, t_tokens = self.life[b]
            stats = eng.row_stats(n, int(rounds[b]), int(accepted[b]), K, kv_bytes=self.kv_bytes,
                                  drafted=int(drafted[b]),
                                  compile_s=self.clock["compile_s"] - t_compile,
                                  decode_s=self.clock["decode_s"] - t_decode,
                                  batch_tokens=self.clock["tokens"] - t_tokens, choice=self.choice)
            stats = dataclasses.replace(stats, healed=self.healing.pop(id(row))[1])
            ids, stats = eng.finish(tokens[b, :n].tolist(), stats, row.stop, self.gen)
            out.append((row, ids, stats))
        return out
