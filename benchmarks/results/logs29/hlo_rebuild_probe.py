"""What rebuilding a program's HLO module from its proto costs (issue 14's second process: jaxlib 0.11.2's GPU load
calls HloModule::CreateFromProtoWithConfig on the module each executable keeps, beside the serialized thunks).

The 8B + draft program's parts, traced with the weights as shapes and compiled by XLA:CPU (the GPU's module is
fused differently, but holds about as many instructions); for each, its optimized HLO module's proto size, its
instruction count, and the median time of HloModule.from_serialized_hlo_module_proto (the same CreateFromProto):

    PYTHONPATH=.:benchmarks python benchmarks/results/logs29/hlo_rebuild_probe.py [--small]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="tiny shapes (a check of the script)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from jaxlib import _hlo

    import startup
    from jspec import engine, programs
    from jspec.config import SamplingConfig

    eng, ids, gen = startup._build("8b+draft", args.small, abstract=True)
    call = eng.prepare(ids, [SamplingConfig()] * len(ids), [gen.max_new_tokens] * len(ids), gen)
    t = time.perf_counter()
    lowered = [x.lower() for x in engine.trace_parts(call)]
    compiled = programs.compile_all(lowered, [eng.xla_options] * len(lowered))
    print(f"trace, lower and compile (XLA:CPU): {time.perf_counter() - t:.1f} s", flush=True)
    for name, c in zip(engine.part_names(call.models), compiled):
        module = c.runtime_executable().hlo_modules()[0]
        proto = module.as_serialized_hlo_module_proto()
        text = module.to_string()
        instructions = sum(1 for line in text.splitlines() if " = " in line)
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            _hlo.HloModule.from_serialized_hlo_module_proto(proto)
            times.append(time.perf_counter() - t)
        print(f"{name}: {len(proto) / 1e6:.2f} MB proto, {instructions} instructions, rebuilt in "
              f"{statistics.median(times) * 1e3:.1f} ms (median of {args.reps})", flush=True)


if __name__ == "__main__":
    main()
