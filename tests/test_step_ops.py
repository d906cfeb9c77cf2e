"""The INT2 decode step's ops per layer (issue 16), counted on the CPU by tools/op_count.py.

The GPU runs the split path (attention_split: Mosaic kernel + XLA around it); its step is launch-bound
at batch 1, so every kernel per layer costs 32 x a few microseconds. XLA:CPU fuses differently from
XLA:GPU, but the concatenates, reductions and transposes of the jnp code show up in both: these limits
fail a change that brings them back. The kernel call (wrapper included) is stubbed: its own ops belong
to jspec/kernels/hopper/.
"""

import sys
from pathlib import Path

_TOOLS = str(Path(__file__).resolve().parent.parent / "tools")
sys.path.insert(0, _TOOLS)
try:
    import op_count
finally:
    sys.path.remove(_TOOLS)

# Per layer of a decode step (batch 1, one token), jax 0.10 on the CPU. Before issue 16 (d0dd9b9):
# fusion 63, concatenate 7, reduce 12, transpose 11, dot 7, dynamic-update-slice 4. The dots left are the
# four weight GEMMs; R_K and the BF16 window's two products are reductions now.
LIMITS = {"fusion": 49, "concatenate": 0, "reduce": 11, "transpose": 0, "dot": 4, "dynamic-update-slice": 4,
          "scatter": 0, "sort": 0}


def test_int2_decode_step_ops_per_layer():
    kv, impl = op_count.CASES["int2 split"]
    got = op_count.per_layer(op_count.SMALL, kv, impl, batch=1, n=1, wrapper=False)
    over = {op: f"{got[op]} > {limit}" for op, limit in LIMITS.items() if got[op] > limit}
    assert not over, f"more ops per layer in the INT2 decode step than pinned: {over} (all: {got})"
