"""Issue 14, session 25: how many distinct Triton kernels XLA builds for a program, from its optimized HLO dump
(XLA_FLAGS=--xla_dump_to=DIR). A Triton fusion's kernel is compiled once per distinct fused computation (XLA's
kernel reuse cache keys it by the computation's fingerprint and its arguments), so fusions that differ only in
names share a kernel; this counts them with names stripped, and prints what sets apart the variants of a kind.

    python triton_kernels.py DIR
"""

import collections
import re
import sys
from pathlib import Path

NAME = re.compile(r"%[\w.\-]+")


def computations(text: str) -> dict:
    """name -> body text of each computation in an HLO module's text."""
    out, name, body = {}, None, []
    for line in text.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$", line)
        if m and not line.startswith(" "):
            name, body = m[1], []
        elif line == "}" and name:
            out[name] = "\n".join(body)
            name = None
        elif name:
            body.append(line)
    return out


def canonical(body: str) -> str:
    """The body with instruction names numbered in order of appearance and metadata dropped."""
    body = re.sub(r", metadata=\{[^}]*\}", "", body)
    names = {}
    return NAME.sub(lambda m: names.setdefault(m[0], f"%{len(names)}"), body)


def main(path: str):
    for f in sorted(Path(path).glob("*jit__*after_optimizations.txt")):
        text = f.read_text()
        comps = computations(text)
        kinds = collections.Counter()
        kernels = collections.defaultdict(list)  # canonical -> fusion names
        for line in text.splitlines():
            m = re.search(r"(%[\w.\-]+) = .* fusion\(.*calls=%?([\w.\-]+).*\"kind\":\"(__triton[\w]*)\"", line)
            if not m:
                continue
            cfg = re.search(r"\"triton_gemm_config\":(\{[^}]*\})", line)
            shapes = line.split(" fusion(")[0].split(" = ")[1]
            key = (m[3], canonical(comps.get(m[2], "")), cfg[1] if cfg else "")
            kinds[m[3]] += 1
            kernels[key].append((m[1], shapes))
        print(f"{f.name}: {sum(kinds.values())} Triton fusions {dict(kinds)}, {len(kernels)} distinct kernels")
        by_shape = collections.Counter(v[0][1] for v in kernels.values())
        for shape, n in by_shape.most_common(12):
            print(f"  {n:3d} distinct kernels of output {shape}")
        # Two variants of the most repeated output shape, side by side: what tells them apart.
        shape = by_shape.most_common(1)[0][0] if by_shape else None
        variants = [k for k, v in kernels.items() if v[0][1] == shape][:2]
        if len(variants) == 2:
            a, b = (k[1].splitlines() for k in variants)
            print(f"  e.g. {kernels[variants[0]][0][0]} vs {kernels[variants[1]][0][0]}:")
            for x, y in zip(a, b):
                if x != y:
                    print(f"    - {x.strip()[:200]}\n    + {y.strip()[:200]}")
            if variants[0][2] != variants[1][2]:
                print(f"    config {variants[0][2]}\n        vs {variants[1][2]}")


if __name__ == "__main__":
    main(sys.argv[1])
