"""Kernels per round and decode speed: plain decoding, the draft model and the EAGLE-3 head on the shipped pair.

    PYTHONPATH=. python benchmarks/head_round.py --out $OUT/head_round.json   # whatever device JAX finds

At batch 1 a small model's round is launch-bound, so the kernels a round executes bound its fixed cost. For
plain decoding and for K = 1..4 of each draft mode, decode.round_program is compiled (greedy, batch 1) and
its HLO walked as executed: loop bodies count once per trip (XLA's known_trip_count), a conditional counts
its largest branch. "loops" counts the while loops a round runs (on a GPU each trip reads its predicate back
to the host). CPU programs also run threefry as a rolled loop: on the CPU it adds one loop per round to
every mode. Then one decode call of --new tokens is timed for plain and the head (K = --k), in one process.
"""

from __future__ import annotations

import argparse
import json
import re

import jax

import jspec
from jspec.config import GenerateConfig, KVConfig, SamplingConfig
from jspec.decode import loop as decode

PROMPT = "def quicksort(items):\n    \"\"\"Sort a list.\"\"\"\n"
NOT_KERNELS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
               "after-all", "opt-barrier"}
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.-]+) .*\{$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%\S+ = .*? ([a-z][a-z0-9-]*)\((.*)$")


def _computations(hlo: str) -> dict:
    """{name: [(opcode, rest of the line)]} of an HLO module's text; the entry is also under "ENTRY"."""
    comps, body = {}, None
    for line in hlo.splitlines():
        if body is None and (m := _COMP.match(line)):
            body = comps.setdefault(m.group(1), [])
            if line.startswith("ENTRY"):
                comps["ENTRY"] = body
        elif line == "}":
            body = None
        elif body is not None and (m := _INSTR.match(re.sub(r"/\*.*?\*/", "", line))):
            body.append(m.groups())
    return comps


def executed(hlo: str, root: str = "ENTRY") -> dict:
    """Kernels, fusions, scatters and while loops one run of the program executes (see the module doc); root:
    the computation to start from (a loop body: what one trip executes)."""
    comps = _computations(hlo)
    ref = lambda key, rest: re.search(rf"{key}=%([\w.-]+)", rest).group(1)

    def walk(name):
        n = dict(kernels=0, fusions=0, scatters=0, loops=0)
        for op, rest in comps[name]:
            sub = []
            if op == "while":
                trips = int(m.group(1)) if (m := re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)) else 1
                sub = [(walk(ref("body", rest)), trips), (walk(ref("condition", rest)), trips + 1)]
                n["loops"] += 1
            elif op == "conditional":
                branches = [walk(b) for b in re.findall(r"%([\w.-]+)", rest) if b in comps]
                sub = [(max(branches, key=lambda b: b["kernels"]), 1)]
            elif op == "call":
                sub = [(walk(ref("to_apply", rest)), 1)]
            elif op not in NOT_KERNELS:
                n["kernels"] += 1
                n["fusions"] += op == "fusion"
                fused = comps[ref("calls", rest)] if op == "fusion" else ()
                n["scatters"] += op == "scatter" or any(o == "scatter" for o, _ in fused)
            for counts, times in sub:
                for k in n:
                    n[k] += counts[k] * times
        return n

    return walk(root)


def round_counts(eng, K: int) -> dict:
    """Executed counts of one round of eng at lookahead K (batch 1, greedy, a 256-token bucket)."""
    args = eng.prepare([eng.encode(PROMPT)], [SamplingConfig()], [64], GenerateConfig(max_new_tokens=64, lookahead=K))
    s = decode.start_program(*args)
    hlo = decode.round_program.lower(args.models, args.sampler, args.max_new, args.eos_ids, s).compile().as_text()
    return executed(hlo)


def tokens_per_s(eng, K: int, new: int, reps: int) -> dict:
    """The median of reps decode calls of `new` tokens (after a compiling call): tokens/s and tau."""
    gen = GenerateConfig(max_new_tokens=new, lookahead=K, stop_at_eos=False)
    eng.generate([PROMPT], gen)
    runs = sorted((eng.generate([PROMPT], gen)[0].stats for _ in range(reps)), key=lambda st: st["decode_s"])
    st = runs[len(runs) // 2]
    return dict(tok_s=st["new_tokens"] / st["decode_s"], tau=st["accept_length"], new_tokens=st["new_tokens"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="checkpoints/code-target")
    ap.add_argument("--head", default="checkpoints/code-head")
    ap.add_argument("--draft", default="checkpoints/code-draft")
    ap.add_argument("--kv", default="auto", choices=("auto", "bf16", "int2"))
    ap.add_argument("--ks", default="1,2,3,4", help="lookaheads whose rounds are counted")
    ap.add_argument("--k", type=int, default=4, help="the head's lookahead in the timed call")
    ap.add_argument("--new", type=int, default=256, help="tokens per timed decode call")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-time", action="store_true", help="counts only")
    ap.add_argument("--out", help="JSON path")
    a = ap.parse_args()
    load = lambda draft: jspec.load(a.target, draft=draft, kv=KVConfig(a.kv), mesh=None)
    engs = dict(model=load(a.draft), head=load(a.head))
    out = dict(backend=jax.default_backend(), device=str(jax.devices()[0]), kv=engs["head"].kv.mode,
               counts=dict(plain=round_counts(engs["head"], 0)))
    print(f"{out['device']} kv {out['kv']}: per round executed (kernels, fusions, scatters, loops)")
    print(f"  plain      {out['counts']['plain']}")
    for mode, eng in engs.items():
        for K in map(int, a.ks.split(",")):
            out["counts"][f"{mode} K={K}"] = c = round_counts(eng, K)
            print(f"  {mode} K={K}  {c}")
    save(a.out, out)  # the counts are kept if the timing is cut short
    if not a.no_time:
        plain, head = tokens_per_s(engs["head"], 0, a.new, a.reps), tokens_per_s(engs["head"], a.k, a.new, a.reps)
        out["timing"] = dict(plain=plain, head=head, K=a.k, speedup=head["tok_s"] / plain["tok_s"])
        print(f"plain {plain['tok_s']:.1f} tok/s; head K={a.k} {head['tok_s']:.1f} tok/s (tau {head['tau']:.2f}): "
              f"{out['timing']['speedup']:.2f}x")
        save(a.out, out)


def save(path, out: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
