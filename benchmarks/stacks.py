"""Where a sampled span of a process goes: a py-spy `--format raw` profile (collapsed stacks) read back.

    py-spy record --native --rate 1000 --format raw -o load.raw -- python benchmarks/startup.py --child ...
    python benchmarks/stacks.py load.raw --within deserialize_and_load --top 40

Only the samples whose stack holds a frame matching --within count. For each function (Python frames by name
and file, native ones by their name without arguments): the share of those samples it is on the stack of
(inclusive, counted once per sample) and at the top of (self).
"""

from __future__ import annotations

import argparse
import collections
import re


def frame_name(frame: str) -> str:
    """'fn (file.py:12)' -> 'fn (file.py)'; 'ns::Cls::fn(int, char const*) const' -> 'ns::Cls::fn'."""
    frame = frame.strip()
    python = re.fullmatch(r"(.+?) \(([^()]+?):\d+\)", frame)
    if python:
        return f"{python.group(1)} ({python.group(2).rsplit('/', 1)[-1]})"
    depth, out = 0, []
    for ch in frame:  # drop every parenthesised part (argument lists), keep templates and names
        depth += ch == "("
        if depth == 0:
            out.append(ch)
        depth -= ch == ")" and depth > 0
    return "".join(out).strip() or frame


def read(path: str, within: str):
    """[(frames root first, count)] of the samples whose stack has a frame matching `within`."""
    keep = re.compile(within)
    stacks = []
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit() and keep.search(stack):
                stacks.append(([frame_name(x) for x in stack.split(";")], int(count)))
    return stacks


def summary(stacks, top: int) -> str:
    total = sum(n for _, n in stacks)
    inclusive, own = collections.Counter(), collections.Counter()
    for frames, n in stacks:
        for name in set(frames):
            inclusive[name] += n
        own[frames[-1]] += n
    lines = [f"{total} samples"]
    for title, counts in (("inclusive", inclusive), ("self", own)):
        lines.append(f"-- {title}")
        lines += [f"{100 * n / total:6.1f}%  {name[:160]}" for name, n in counts.most_common(top)]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", help="py-spy record --format raw output")
    ap.add_argument("--within", default=".", help="regex: only samples with a matching frame")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    stacks = read(args.raw, args.within)
    print(summary(stacks, args.top) if stacks else f"no samples match {args.within!r}")


if __name__ == "__main__":
    main()
