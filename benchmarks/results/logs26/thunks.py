"""Issue 14, session 26: what a program launches, per layer, from its optimized HLO dump (XLA_FLAGS=
"--xla_dump_to=DIR --xla_dump_hlo_as_text"). A second process's load emits XLA's thunks again from the HLO (its
legacy serialized form; session 26's NOTES), one per instruction of the computations that run as a sequence (the
entry, while bodies and conditions, conditional branches): this counts those instructions by where they come from
(the named scope: draft / verify / prefill / commit ..., and the model layer `layerN`) and by kind.

    python thunks.py DIR [--parts REGEX] [--top 12]
"""

import argparse
import collections
import re
from pathlib import Path

FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id"}
HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\{$")
INSTR = re.compile(r"^\s+(?:ROOT )?%?[\w.\-]+ = [^=]*? ([a-z\-]+)\((.*)$")
CALLED = re.compile(r"(?:body|condition|true_computation|false_computation)=%?([\w.\-]+)|branch_computations=\{([^}]*)\}")


def computations(text: str):
    """(entry name, {name: [instruction lines]}) of an HLO module's text."""
    comps, entry, name = {}, None, None
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            name, comps[m[2]] = m[2], []
            entry = m[2] if m[1] else entry
        elif line.startswith("}"):
            name = None
        elif name:
            comps[name].append(line)
    return entry, comps


def sequenced(entry: str, comps: dict) -> list:
    """The computations that run as sequences of thunks: the entry and, transitively, the bodies, conditions and
    branches of its control flow (not fused computations or reducers)."""
    todo, seen = [entry], []
    while todo:
        c = todo.pop()
        if c in seen or c not in comps:
            continue
        seen.append(c)
        for line in comps[c]:
            for m in CALLED.finditer(line):
                todo += [m[1]] if m[1] else [x.strip().lstrip("%") for x in m[2].split(",")]
    return seen


def where(line: str) -> tuple:
    """(phase, layer) from an instruction's op_name: the first of decode's named scopes in it, and layerN."""
    op = re.search(r'op_name="([^"]*)"', line)
    op = op[1] if op else ""
    phase = next((p for p in ("prefill", "draft", "verify", "accept", "commit") if f"/{p}/" in op + "/"), "other")
    layer = re.search(r"/layer(\d+)/", op)
    return phase, int(layer[1]) if layer else None


def kind(op: str, rest: str) -> str:
    if op == "fusion":
        k = re.search(r'"kind":"(\w+)"', rest) or re.search(r"kind=(\w+)", rest)
        return f"fusion:{k[1] if k else '?'}"
    if op == "custom-call":
        t = re.search(r'custom_call_target="([^"]+)"', rest)
        return f"custom-call:{t[1] if t else '?'}"
    return op


def main(path: str, parts: str, top: int):
    for f in sorted(Path(path).glob("*after_optimizations.txt")):
        if not re.search(parts, f.name):
            continue
        entry, comps = computations(f.read_text())
        per = collections.Counter()  # (phase, layer or None) -> thunks
        kinds = collections.Counter()
        for c in sequenced(entry, comps):
            for line in comps[c]:
                m = INSTR.match(line)
                if not m or m[1] in FREE:
                    continue
                per[where(line)] += 1
                kinds[kind(m[1], m[2])] += 1
        total = sum(per.values())
        print(f"{f.name}: {total} thunk instructions in {len(sequenced(entry, comps))} sequenced computations")
        by_phase = collections.defaultdict(list)
        for (phase, layer), n in per.items():
            by_phase[phase].append((layer, n))
        for phase, rows in sorted(by_phase.items()):
            layers = [n for layer, n in rows if layer is not None]
            outside = sum(n for layer, n in rows if layer is None)
            if layers:
                print(f"  {phase}: {len(layers)} layer scopes, {sum(layers)} thunks ({min(layers)}-{max(layers)} per "
                      f"layer scope, mean {sum(layers) / len(layers):.1f}); {outside} outside layers")
            else:
                print(f"  {phase}: {outside} thunks, no layer scope")
        print("  kinds:", ", ".join(f"{k} {n}" for k, n in kinds.most_common(top)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--parts", default=r"jit_(_start|_rounds|draft_prefill)\.", help="file names to read (regex)")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    main(a.dir, a.parts, a.top)
