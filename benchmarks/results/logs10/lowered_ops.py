"""Session 10: the 8B-shaped INT2 target + 0.6B-shaped draft program (benchmarks/startup.py's "8b+draft"
case, weights as shapes), lowered for CUDA on the CPU with the GPU's attention path, and its StableHLO op
count with every nested call inlined: a CPU proxy of the program's size, with and without the fused commit.

    PYTHONPATH=. python benchmarks/results/logs10/lowered_ops.py            # jnp commit: 55,562 ops
    PYTHONPATH=. python benchmarks/results/logs10/lowered_ops.py --fused    # fused commit: 44,874 ops
"""

import argparse
import collections
import functools
import re
import sys

sys.path.insert(0, "benchmarks")

import jax  # noqa: E402
import startup  # noqa: E402

from jspec import decode, engine, kvcache  # noqa: E402
from jspec.config import SamplingConfig  # noqa: E402
from jspec.pallas import int2_mosaic  # noqa: E402

OP = re.compile(r"\s*(?:%\S+ = )?\"?[a-z_]+\.[a-z_.]+")


def inlined_ops(text: str, entry: str = "main") -> int:
    """Ops of `entry` with each func.call replaced by its callee's ops, recursively."""
    own, calls, cur = collections.Counter(), collections.defaultdict(list), None
    for line in text.splitlines():
        head = re.match(r"\s*func\.func (?:private |public )?@(\S+)\(", line)
        if head:
            cur = head.group(1)
            continue
        if cur is None:
            continue
        calls[cur] += re.findall(r"call @([\w.]+)\(", line)
        if OP.match(line) and not line.strip().startswith(("return", "}")):
            own[cur] += 1

    @functools.cache
    def total(fn):
        return own[fn] + sum(total(c) for c in calls[fn])

    return total(entry)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fused", action="store_true", help="kvcache.FUSED_COMMIT")
    args = ap.parse_args()
    kvcache.FUSED_COMMIT = args.fused
    engine._default_impl = lambda: "pallas"  # the GPU's attention path ...
    eng, ids, gen = startup._build("8b+draft", False, abstract=True)
    prog = eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)
    int2_mosaic.available = lambda: True  # ... with the Mosaic kernel, as on an H200
    jax.default_backend = lambda: "gpu"  # compiled kernels, not interpret mode
    text = decode.generate_program.trace(*prog).lower(lowering_platforms=("cuda",)).as_text()
    print(f"fused commit {args.fused}: {inlined_ops(text)} StableHLO ops inlined")


if __name__ == "__main__":
    main()
