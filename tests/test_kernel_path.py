"""The Pallas INT2 path (interpret mode on CPU) gives the reference path's greedy tokens end to end."""

import pytest

import jspec
from jspec import engine


@pytest.mark.skipif(not engine.DEFAULT_TARGET.is_dir(), reason="shipped checkpoints absent")
def test_shipped_pair_greedy_tokens_equal_with_kernel_and_reference():
    # Small windows so that most of the prompt is read from the INT2 history.
    kv = jspec.KVConfig("int2", sink=4, recent=8)
    gen = jspec.GenerateConfig(max_new_tokens=8, lookahead=2)
    prompt = ("import os\nimport sys\n\n\ndef main(argv):\n    \"\"\"Parse the command line and run.\"\"\"\n"
              "    parser = argparse.ArgumentParser(description=__doc__)\n    parser.add_argument(")
    tokens = {}
    for impl in ("reference", "pallas"):
        eng = jspec.load(kv=kv, dtype="float32", attn_impl=impl)
        [r] = eng.generate([prompt], gen)
        tokens[impl] = r.token_ids
    assert len(eng.encode(prompt)) > 4 + 8 + 16  # the INT2 history is really read
    assert tokens["pallas"] == tokens["reference"]
