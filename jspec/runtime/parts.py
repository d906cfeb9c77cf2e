"""The generate program on one device as parts compiled side by side and run back to back, with no host sync
between them: the target's prefill (start), the rounds from the state it leaves, and with a draft model the
draft's prefill, so that the two prefills compile side by side."""

from __future__ import annotations

from jspec.decode import loop as decode
from jspec.decode.state import Models, ProgramArgs


def part_names(m: Models) -> list:
    """The generate program's parts on one device (trace_parts), by name: the prefill and the rounds, and with a
    draft model the draft's prefill, a part of its own so that the two prefills compile side by side."""
    return ["start", "rounds"] + ["draft_prefill"] * (m.draft is not None)


def trace_parts(args: ProgramArgs, start=decode.start_program, rounds=decode.rounds_program,
                draft_prefill=decode.draft_prefill_program) -> list:
    """The generate program's parts (part_names) traced for args, jitted as decode's: the prefill (start), the
    rounds from the state it leaves (rounds) and the draft's prefill (draft_prefill: run first, start then
    given the models without the draft)."""
    m = args.models
    split = "draft_prefill" in part_names(m)
    first = start.trace(*args._replace(models=m.without_draft_model())) if split else start.trace(*args)
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
        if draft_prefill is not None:  # start was traced on the target alone
            a = a._replace(models=models.without_draft_model(),
                           draft_cache=draft_prefill(models, a.prompts, a.prompt_lens, a.draft_cache))
        return rounds(models, a.sampler, a.max_new, a.eos_ids, start(*a))
    return run
