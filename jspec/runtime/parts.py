"""The generate program on one device as parts compiled side by side and run back to back, with no host sync
between them: the target's prefill (start), the rounds from the state it leaves, and where the drafter's prefill
runs apart (a draft model: Proposer.split_prefill) the drafter's prefill, so that the two compile side by side."""

from __future__ import annotations

from jspec.decode import drafters, loop as decode
from jspec.decode.state import Models, ProgramArgs


def part_names(m: Models) -> list:
    """The generate program's parts on one device (trace_parts), by name: the prefill and the rounds, and the
    drafter's prefill where it runs apart, a part of its own so that the two prefills compile side by side."""
    return ["start", "rounds"] + ["draft_prefill"] * drafters.of(m).split_prefill(m)


def trace_parts(args: ProgramArgs, start=decode.start_program, rounds=decode.rounds_program,
                draft_prefill=decode.draft_prefill_program) -> list:
    """The generate program's parts (part_names) traced for args, jitted as decode's: the prefill (start), the
    rounds from the state it leaves (rounds) and the draft's prefill (draft_prefill: run first, start then
    given the models without it: Proposer.without_prefill)."""
    m = args.models
    split = "draft_prefill" in part_names(m)
    alone = drafters.of(m).without_prefill(m)
    first = start.trace(*args._replace(models=alone)) if split else start.trace(*args)
    parts = [first, rounds.trace(m, args.sampler, args.max_new, args.eos_ids, first.out_info)]
    if split:
        parts.append(draft_prefill.trace(m, args.prompts, args.prompt_lens, args.draft_cache))
    return parts


def lower_parts(args: ProgramArgs, *jitted) -> list:
    """trace_parts, lowered."""
    return [part.lower() for part in trace_parts(args, *jitted)]


def back_to_back(start, rounds, draft_prefill=None):
    """The generate program as its compiled parts (trace_parts'), each enqueued on the results of the one
    before."""
    def run(*args):
        a = ProgramArgs(*args)
        models = a.models
        if draft_prefill is not None:  # start was traced on the models without the drafter's prefill
            a = a._replace(models=drafters.of(models).without_prefill(models),
                           draft_cache=draft_prefill(models, a.prompts, a.prompt_lens, a.draft_cache))
        return rounds(models, a.sampler, a.max_new, a.eos_ids, start(*a))
    return run
