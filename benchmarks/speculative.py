"""End-to-end generation: jspec {no draft, draft} x {bf16, int2} vs HF transformers, on one GPU.

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 PYTHONPATH=. python benchmarks/speculative.py --out $OUT/spec.json

Part A, the shipped pair (real acceptance), held-out prompts from the validation split: tokens/s of
jspec variants and of HF `generate` / assisted generation on the same checkpoints, batch 1 and 8, and
jspec's speed-up against K. Part B, an 8B-shaped target with a Qwen3-0.6B-shaped draft (random
weights): measured draft-step and verify-step times, and the speed-up they imply at the acceptance
measured in part A (derived, and labelled so).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

import jspec
from jspec import data, engine, model, rotation
from jspec.config import KVConfig, ModelConfig

from decode import LLAMA3_8B, time_step  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

QWEN3_06B_SHAPE = ModelConfig("qwen3", 128256, 1024, 3072, 28, 16, 8, 128, qk_norm=True, max_position=140000)


def held_out_prompts(tok, n: int, chars: int = 600) -> list[str]:
    """The first `chars` characters (cut at a line end) of n validation-split stdlib files."""
    docs = data.split_documents(data.stdlib_root())["val"]
    prompts = []
    for doc in docs:
        cut = doc[:chars].rsplit("\n", 1)[0] + "\n"
        if len(tok(cut)["input_ids"]) >= 32:
            prompts.append(cut)
        if len(prompts) == n:
            break
    return prompts


def time_jspec(eng, prompts, gen) -> dict:
    eng.generate(prompts, gen)  # compile
    t0 = time.perf_counter()
    res = eng.generate(prompts, gen)
    wall = time.perf_counter() - t0
    new = sum(r.stats["new_tokens"] for r in res)
    return dict(tok_s=new / wall, new_tokens=new, wall_s=wall,
                accept_length=float(np.mean([r.stats["accept_length"] for r in res])),
                accept_rate=float(np.mean([r.stats["accept_rate"] for r in res])),
                kv_bytes=res[0].stats["batch_kv_bytes"])


def time_hf(target_dir, draft_dir, prompts, max_new: int, assisted: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    load = lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
    m = load(target_dir)
    kw = dict(do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=tok.pad_token_id)
    if assisted:
        kw["assistant_model"] = load(draft_dir)
    enc = tok(prompts, return_tensors="pt", padding=True).to("cuda")
    with torch.no_grad():
        m.generate(**enc, **kw)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = m.generate(**enc, **kw)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    new = (out.shape[1] - enc["input_ids"].shape[1]) * len(prompts)
    return dict(tok_s=new / wall, new_tokens=new, wall_s=wall)


def part_a(max_new: int) -> dict:
    rows = []
    engines = {
        (kv, draft): jspec.load(draft=None if draft == "none" else "auto", kv=KVConfig(kv))
        for kv in ("bf16", "int2") for draft in ("none", "draft")
    }
    prompts = held_out_prompts(engines["bf16", "none"].tokenizer, 8)
    gen = jspec.GenerateConfig(max_new_tokens=max_new, lookahead=4)
    for B in (1, 8):
        for (kv, draft), eng in engines.items():
            r = time_jspec(eng, prompts[:B], gen)
            rows.append(dict(system="jspec", kv=kv, draft=draft, batch=B, **r))
            print(rows[-1], flush=True)
        for assisted in (False, True):
            if assisted and B > 1:
                continue  # HF assisted generation supports batch 1 only
            r = time_hf(engine.DEFAULT_TARGET, engine.DEFAULT_DRAFT, prompts[:B], max_new, assisted)
            rows.append(dict(system="hf", kv="bf16", draft="draft" if assisted else "none", batch=B, **r))
            print(rows[-1], flush=True)
    by_k = []
    for K in (1, 2, 3, 4, 6, 8):
        r = time_jspec(engines["int2", "draft"], prompts[:1], jspec.GenerateConfig(max_new_tokens=max_new, lookahead=K))
        by_k.append(dict(K=K, **r))
        print(by_k[-1], flush=True)
    return dict(prompts=len(prompts), max_new=max_new, rows=rows, by_k=by_k)


def part_b(tau: float, K: int = 4, ctx: int = 8192) -> dict:
    """Measured: target decode step, verify step (K + 1 tokens) and draft step, each a forward plus the
    commit of its rows (decode.time_step). Derived: the speed-up at the shipped pair's tau."""
    target = model.init_params(LLAMA3_8B, jax.random.key(0), dtype=jnp.bfloat16)
    target = rotation.apply_rotations(target, LLAMA3_8B, *rotation.hadamard_rotations(LLAMA3_8B))
    draft = model.init_params(QWEN3_06B_SHAPE, jax.random.key(1), dtype=jnp.bfloat16)
    int2 = KVConfig("int2")
    t_step = time_step(target, LLAMA3_8B, int2, 1, ctx, "pallas", steps=8)
    t_verify = time_step(target, LLAMA3_8B, int2, 1, ctx, "pallas", n=K + 1, steps=8)
    t_draft = time_step(draft, QWEN3_06B_SHAPE, KVConfig("bf16"), 1, ctx, "reference", steps=8)
    derived = tau * t_step / (K * t_draft + t_verify)
    return dict(ctx=ctx, K=K, measured_ms=dict(target_step=t_step * 1e3, verify=t_verify * 1e3,
                                               draft_step=t_draft * 1e3),
                tau_from_shipped_pair=tau, derived_speedup=derived)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/speculative.json")
    ap.add_argument("--max-new", type=int, default=128)
    args = ap.parse_args()
    result = dict(device=str(jax.devices()[0]), jax=jax.__version__)
    result["shipped_pair"] = a = part_a(args.max_new)
    save(args.out, result)
    tau = next(r["accept_length"] for r in a["rows"] if r["kv"] == "int2" and r["draft"] == "draft" and r["batch"] == 1)
    result["llama8b_qwen06b"] = part_b(tau)
    print(json.dumps(result["llama8b_qwen06b"]))
    save(args.out, result)


def save(path, result):
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
