"""Draft modes x KV x batch x lookahead on the shipped pair: tokens/s and speed-up over plain decoding.

    PYTHONPATH=. python benchmarks/speculative.py --out $OUT/speculative.json          # one GPU, ~5 min
    JAX_PLATFORMS=cpu PYTHONPATH=. python benchmarks/speculative.py --small --out /tmp/spec.json  # CPU check
    PYTHONPATH=. python benchmarks/speculative.py --head checkpoints/code-head --batches 1,8 --llama8b \
        --out $OUT/speculative_head.json                            # the head against the other modes, 8B shape

Workloads, both held out from training (validation-split stdlib files):
- held_out: ~600-character pieces cut at line ends (the first piece of each file first: the prompts
  measured before), continued freely;
- edit: a function from such a file, a comment asking for it again with one name changed, and the first
  two lines of that rewrite: the continuation repeats or modifies code in the prompt (what prompt lookup
  serves; the shipped target is a small model and does not always copy).
Modes (jspec.load's draft): none (plain decoding), model (the shipped draft), ngram (prompt lookup),
ngram+model (both), head (an EAGLE-3 head: --head DIR, default checkpoints/code-head when it exists;
"random" for a random one of the trained shape, which only checks the plumbing: its tau is ~1).
Greedy, 128 new tokens. Per KV (bf16, int2) and batch (1, 8, 32): plain decoding,
each mode at lookahead auto, and a fixed K (a sweep of K at batch 1, K = 4 at the others). Batch 1 runs
the first `singles` prompts (8) one call each, in turn, and counts all their tokens over all their time:
one prompt's tau swings with K by chance (3.02 at K = 4, 3.63 at 6, 3.53 at 8).

tokens/s = new tokens / decode_s (the compiled program's time, without compilation), median of `reps`
calls after a warm-up; speed-up = over plain decoding of the same workload, KV and batch in this run: the
median ratio of `reps` pairs (a plain call, then the mode's call), which a drift of the GPU's speed between
rows does not bias ("speedup_vs_plain_row" divides by the plain row measured first instead);
tau = tokens emitted per round per row (bonus included). "auto" starts from the prior (the engine's
acceptance estimate is reset per workload), reports its first choice, then calls until the chosen K
repeats (the online estimate settles) before timing. Every program is compiled once: the modes of a KV
share one engine's program cache, and both workloads fall in the same prompt bucket (256 tokens).
A time budget (--budget-s) skips what is left, in priority order, and records what it skipped.
--hf adds HF transformers generate/assisted generation; --llama8b the 8B-shaped step costs (part B):
the 0.6B-shaped draft model's and a Llama-3-8B-EAGLE-3-shaped head's (random weights), each measured
(target step, verify, verify with the head's features, draft/head step) and the speed-up they imply at the
tau the shipped pair measured in this run (derived, not measured: the 8B shapes have random weights).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jspec
from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig
from jspec.decode.drafters import Probe
from jspec.decode.drafters.head import target_features
from jspec.decode.state import Drafter, DraftMode, Models
from jspec.paths import CHECKPOINTS
from jspec.io import eagle3
from jspec.model import head, decoder as model, rotation
from jspec.runtime import engine, lookahead
from jspec.train import data

from decode import LLAMA3_8B, time_step  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

QWEN3_06B_SHAPE = ModelConfig("qwen3", 128256, 1024, 3072, 28, 16, 8, 128, qk_norm=True, max_position=140000)
# Llama-3.1-8B's EAGLE-3 head (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): one Llama layer of the target's shape,
# a 32000-token draft vocabulary, vLLM's default taps (2, L // 2, L - 3)
LLAMA3_8B_EAGLE3 = head.HeadConfig(head.layer_config(LLAMA3_8B, 32, 8, 14336), 32000, (2, 16, 29))
MODES = ("model", "ngram", "ngram+model", "head")  # the draft modes; "none" is the plain baseline
SWEEP = {"model": (1, 2, 4, 8), "ngram": (1, 2, 4, 8, 16), "ngram+model": (1, 2, 4, 8), "head": (1, 2, 4, 6, 8)}
FULL = dict(kvs=("bf16", "int2"), batches=(1, 8, 32), sweep=SWEEP, fixed=4, max_new=128, reps=5, singles=8)
SMALL = dict(kvs=("bf16",), batches=(1,), sweep={m: (2,) for m in MODES}, fixed=None, max_new=24, reps=1,
             singles=2)
DEFAULT_HEAD = CHECKPOINTS / "code-head"
PROMPT_TOKENS = (130, 250)  # both workloads in the 256-token bucket: one program serves both


# ------------------------------------------------------------------------------------------ workloads


def held_out_prompts(tok, n: int, chars: int = 600) -> list[str]:
    """n pieces of validation-split files with >= 32 tokens: the first piece of every file, then the
    second, and so on (the first pieces are the prompts measured before)."""
    pieces = [data.pieces(doc, chars) for doc in data.split_documents(data.stdlib_root())["val"]]
    prompts = []
    for r in range(max(map(len, pieces))):
        prompts += [p[r] for p in pieces if r < len(p) and len(tok(p[r])["input_ids"]) >= 32]
    return prompts[:n]


def _renamed(func: ast.FunctionDef) -> tuple[str, str]:
    """(old, new): the first argument other than self/cls, else the function's name, and its new name."""
    args = [a.arg for a in func.args.args if a.arg not in ("self", "cls")]
    old = args[0] if args else func.name
    return old, f"new_{old}"


def _edit_prompt(doc: str, func: ast.FunctionDef) -> str | None:
    """The function; a comment asking for it again with a name changed; the rewrite begun (its def line and
    first body line, renamed, without the line end: the model writes the next line's indentation itself).
    None when the def line does not stand alone or the body is one line."""
    lines = textwrap.dedent("\n".join(doc.splitlines()[func.lineno - 1 : func.end_lineno])).split("\n")
    if not lines[0].rstrip().endswith(":") or len(lines) < 3:
        return None
    old, new = _renamed(func)
    begun = re.sub(rf"\b{re.escape(old)}\b", new, "\n".join(lines[:2]))
    return "\n".join(lines) + f"\n\n\n# {func.name} again, with `{old}` renamed to `{new}`:\n{begun}"


def edit_prompts(tok, n: int) -> list[str]:
    """n edit-style prompts from validation-split functions (one per file in turn, in file order)."""
    per_doc = []
    for doc in data.split_documents(data.stdlib_root())["val"]:
        funcs = [f for f in ast.walk(ast.parse(doc)) if isinstance(f, ast.FunctionDef)]
        prompts = [p for p in (_edit_prompt(doc, f) for f in sorted(funcs, key=lambda f: f.lineno)) if p]
        per_doc.append([p for p in prompts if PROMPT_TOKENS[0] <= len(tok(p)["input_ids"]) <= PROMPT_TOKENS[1]])
    out = []
    for r in range(max(map(len, per_doc))):
        out += [p[r] for p in per_doc if r < len(p)]
    return out[:n]


# ------------------------------------------------------------------------------------------ timing


def _summary(calls) -> dict:
    """tokens/s (of the programs, compile excluded), tau and accept rate of generate calls run in turn (each
    a list of results): all their new tokens over all their decode time. K is the one most calls ran."""
    st = [r.stats for results in calls for r in results]
    new, rounds = sum(s.new_tokens for s in st), sum(s.rounds for s in st)
    Ks = [results[0].stats.lookahead for results in calls]
    drafted = sum(s.lookahead * s.rounds for s in st)
    out = dict(K=max(Ks, key=Ks.count), tok_s=new / sum(results[0].stats.decode_s for results in calls),
               new_tokens=new, compile_s=sum(results[0].stats.compile_s for results in calls),
               tau=(new - len(st)) / rounds if rounds else 1.0,
               accept_rate=sum(s.accepted for s in st) / drafted if drafted else 0.0)
    if len(set(Ks)) > 1:
        out["Ks"] = Ks
    if st[0].lookahead_auto is not None:
        out["auto"] = st[0].lookahead_auto
    return out


def measure(eng, groups, gen, reps: int, plain=None) -> dict:
    """The median call of `reps` after a warm-up (which compiles when needed); for auto, after the
    chosen K settles. A call is one generate per group of prompts, in turn (batch 1 over several prompts:
    one prompt per group). Auto rows also keep their first call's choice. With `plain` (the plain engine),
    each timed call follows a plain call of the same prompts: "speedup" is the median of the per-pair
    ratios, so that a drift of the GPU's speed during the run does not show as a gain or a loss."""
    call = lambda e, g: _summary([e.generate(prompts, g) for prompts in groups])
    first = call(eng, gen)
    calls = [first]
    while gen.lookahead == "auto" and len(calls) < 4:  # until the online estimate repeats its choice
        calls.append(call(eng, gen))
        if calls[-1].get("Ks", calls[-1]["K"]) == calls[-2].get("Ks", calls[-2]["K"]):
            break
    timed, ratios, base = [], [], dataclasses.replace(gen, lookahead=0)
    for _ in range(reps):
        if plain is not None:
            p = call(plain, base)["tok_s"]
        timed.append(call(eng, gen))
        if plain is not None:
            ratios.append((timed[-1]["tok_s"] / p, p))
    row = dict(sorted(timed, key=lambda r: r["tok_s"])[len(timed) // 2])
    row["compile_s"] = sum(c["compile_s"] for c in calls + timed)
    if gen.lookahead == "auto":
        row["K_first"], row["auto_first"] = first["K"], first.get("auto")
    if ratios:
        row["speedup_paired"], row["plain_tok_s_paired"] = sorted(ratios)[len(ratios) // 2]
    return row


def engines(kv: str, head_dir) -> dict:
    """{mode: Engine} for one KV mode. They are copies of one engine (dataclasses.replace keeps its
    program and cost caches), so the K = 0 program that several modes run is compiled once."""
    base = jspec.load(draft="shipped", kv=KVConfig(kv))
    d = base.drafter
    out = {"none": dataclasses.replace(base, drafter=Drafter()), "model": base,
           "ngram": dataclasses.replace(base, drafter=Drafter(mode=DraftMode.NGRAM)),
           "ngram+model": dataclasses.replace(base, drafter=d.replace(mode=DraftMode.NGRAM_MODEL))}
    if head_dir is not None:
        hcfg, hp = load_head(head_dir, base.cfg)
        out["head"] = dataclasses.replace(base, drafter=Drafter(head=hp, mode=DraftMode.HEAD, head_cfg=hcfg))
    return out


def load_head(head_dir, cfg: ModelConfig):
    """(HeadConfig, HeadParams) from a directory, or "random": a random head of train_head's default shape."""
    if head_dir != "random":
        return eagle3.load_head(head_dir, cfg)
    from jspec.train import train_head

    tc = train_head.HeadTrainConfig()
    hcfg = head.HeadConfig(head.layer_config(cfg, tc.num_heads, tc.num_kv_heads, tc.intermediate_size),
                           tc.draft_vocab, train_head.train_taps(cfg.num_layers))
    return hcfg, head.init_head(hcfg, jax.random.key(0), jnp.bfloat16, d2t=np.zeros(tc.draft_vocab, np.int32))


def jobs(cfg: dict, modes, parts=("auto", "sweep", "fixed")) -> list[tuple]:
    """(kv, batch, mode, lookahead) in priority order: auto and plain at every batch, then the sweep of K at
    batch 1, then the fixed K at the others; `parts` keeps some of the three (and the plain rows they need)."""
    first = [(kv, B, mode, "auto" if mode != "none" else 0) for B in cfg["batches"] for kv in cfg["kvs"]
             for mode in ("none",) + modes]
    if "head" in modes and cfg["fixed"] and 1 in cfg["batches"]:  # the head at K = 4, batch 1: part B's tau
        first += [(kv, 1, "head", cfg["fixed"]) for kv in cfg["kvs"]]
    sweep = [(kv, 1, mode, K) for kv in cfg["kvs"] for mode in modes for K in cfg["sweep"][mode]
             if 1 in cfg["batches"]]
    fixed = [(kv, B, mode, cfg["fixed"]) for B in cfg["batches"] if B > 1 and cfg["fixed"]
             for kv in cfg["kvs"] for mode in modes]
    chosen = (first if "auto" in parts else []) + (sweep if "sweep" in parts else []) + \
        (fixed if "fixed" in parts else [])
    plain = [j for j in first if j[2] == "none" and any(c[:2] == j[:2] for c in chosen)]
    return list(dict.fromkeys(plain + chosen))  # the plain rows first: every speed-up divides by one


def grid(cfg: dict, workloads: dict, budget_s: float, head_dir=None, parts=("auto", "sweep", "fixed"),
         on_row=lambda rows: None, modes=MODES) -> tuple[list, list]:
    """Runs every job on every workload; returns (rows, skipped jobs). No head_dir: no head mode. on_row(rows)
    after each row (to keep what was measured if the process is stopped)."""
    t0, rows, skipped, engs, plain = time.perf_counter(), [], [], {}, {}
    modes = tuple(m for m in modes if m != "head" or head_dir is not None)
    for kv, B, mode, K in jobs(cfg, modes, parts):
        if time.perf_counter() - t0 > budget_s:
            skipped.append(dict(kv=kv, batch=B, mode=mode, lookahead=K))
            continue
        eng = (engs.get(kv) or engs.setdefault(kv, engines(kv, head_dir)))[mode]
        gen = jspec.GenerateConfig(max_new_tokens=cfg["max_new"], lookahead=K)
        for name, prompts in workloads.items():
            eng._seen.clear()  # auto starts from the prior on each workload (a fresh engine's state)
            base = None if mode == "none" else engs[kv]["none"]
            groups = [[p] for p in prompts[: cfg["singles"]]] if B == 1 else [prompts[:B]]
            r = dict(workload=name, kv=kv, batch=B, mode=mode, lookahead=K, prompts=len(groups) * len(groups[0]),
                     **measure(eng, groups, gen, cfg["reps"], base))
            if mode == "none":
                plain[name, kv, B] = r["tok_s"]
            r["speedup_vs_plain_row"] = r["tok_s"] / plain[name, kv, B]
            r["speedup"] = r.get("speedup_paired", r["speedup_vs_plain_row"])
            rows.append(r)
            on_row(rows)
            print(json.dumps({k: v for k, v in r.items() if not k.startswith("auto")}), flush=True)
    return rows, skipped


def table(rows: list) -> str:
    """One line per (workload, KV, batch): plain tokens/s, then per mode the speed-up at lookahead auto and
    at the best fixed K (with the K each ran)."""
    head = f"{'workload':9}{'kv':5}{'B':>3}{'plain tok/s':>12}" + "".join(f"{m + ': auto | best K':>28}" for m in MODES)
    lines = [head]
    for w, kv, B in sorted({(r["workload"], r["kv"], r["batch"]) for r in rows}):
        sel = [r for r in rows if (r["workload"], r["kv"], r["batch"]) == (w, kv, B)]
        plain = next((r["tok_s"] for r in sel if r["mode"] == "none"), float("nan"))
        cells = ""
        for m in MODES:
            auto = next((r for r in sel if r["mode"] == m and r["lookahead"] == "auto"), None)
            best = max((r for r in sel if r["mode"] == m and r["lookahead"] != "auto"), key=lambda r: r["speedup"],
                       default=None)
            cell = lambda r: f"{r['speedup']:.2f}x K{r['K']:<2}" if r else "-"
            cells += f"{cell(auto) + ' | ' + cell(best):>28}"
        lines.append(f"{w:9}{kv:5}{B:>3}{plain:>12.0f}" + cells)
    return "\n".join(lines)


# ------------------------------------------------------------------- HF and the 8B shapes (optional)


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


def hf_rows(prompts, max_new: int) -> list:
    rows = [dict(system="hf", draft="none", batch=B, **time_hf(engine.DEFAULT_TARGET, None, prompts[:B], max_new,
                                                               False)) for B in (1, 8)]
    rows.append(dict(system="hf", draft="model", batch=1, **time_hf(engine.DEFAULT_TARGET, engine.DEFAULT_DRAFT,
                                                                    prompts[:1], max_new, True)))
    return rows


def part_b_head(tau: float | None, K: int = 4, ctx: int = 8192, small: bool = False) -> dict:
    """The 8B shape with a Llama-3-8B-EAGLE-3-shaped head (random weights), INT2 KV, batch 1. Measured by the
    loops --lookahead auto uses (jspec.runtime.lookahead: a target forward over 1 and K + 1 tokens, one head token),
    plus the verify forward with the head's features (the three taps and fc), which a head round pays.
    Derived: the speed-up at the head's tau on the shipped pair, tau * step / (K * head step + verify).
    small: a stand-in 1/16 the width and 4 layers, reference attention, 512 tokens (a CPU check of the code)."""
    cfg, hcfg = LLAMA3_8B, LLAMA3_8B_EAGLE3
    if small:
        cfg = dataclasses.replace(cfg, vocab_size=8192, hidden_size=256, intermediate_size=896, num_layers=4,
                                  num_heads=2, num_kv_heads=1)
        hcfg = head.HeadConfig(head.layer_config(cfg, 2, 1, 896), 2048, (1, 2, 3))
        ctx = 512
    target = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    target = rotation.apply_rotations(target, cfg, *rotation.hadamard_rotations(cfg))
    Vd = hcfg.draft_vocab
    d2t = np.sort(np.random.default_rng(0).choice(cfg.vocab_size, Vd, False)) - np.arange(Vd)
    hp = head.init_head(hcfg, jax.random.key(1), jnp.bfloat16, d2t=d2t)
    m = Models(target, Drafter(head=hp, mode=DraftMode.HEAD, head_cfg=hcfg), cfg, K, "reference" if small else "pallas")
    int2, cap = KVConfig("int2"), ctx + 64
    costs = lookahead.measure(m, int2, 1, cap, ctx, K, jnp.bfloat16)

    def verify_features(m, carry):  # the verify forward of a head round: logits and features, commit of none
        tok, cache = carry
        logits, (k, v), f = target_features(m, tok, cache)
        cache = kvcache.commit(cache, k, v, jnp.zeros_like(cache.length))
        return jnp.argmax(logits, -1).astype(jnp.int32) + (f[..., 0] > 1e30), cache  # f used: fc is not elided

    cache = kvcache.init_cache(cfg, int2, 1, cap, jnp.bfloat16, K)
    cache = cache.replace(length=jnp.full((1,), ctx, jnp.int32))
    carry = (jnp.zeros((1, K + 1), jnp.int32), cache)
    t_verify_f = lookahead.per_step(Probe({}, m, verify_features, lambda place: carry), 8)
    t_step, t_verify, t_head = costs.verify_at(1), costs.verify_at(K + 1), costs.head_step
    lc = hcfg.layer
    out = dict(ctx=ctx, K=K, small=small, head=dict(hidden=lc.hidden_size, heads=lc.num_heads, kv_heads=lc.num_kv_heads,
                                                   intermediate=lc.intermediate_size, draft_vocab=hcfg.draft_vocab,
                                                   taps=list(hcfg.taps)),
               measured_ms=dict(target_step=t_step * 1e3, verify=t_verify * 1e3, verify_with_features=t_verify_f * 1e3,
                                head_step=t_head * 1e3),
               head_step_over_target_step=t_head / t_step)
    if tau is not None:
        out.update(tau_from_shipped_pair=tau, derived_speedup=tau * t_step / (K * t_head + t_verify_f))
    return out


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


# ------------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(default_out("speculative.json")), help="JSON path (default: a scratch folder)")
    ap.add_argument("--small", action="store_true", help="a CPU-sized run: bf16, batch 1, K 2 and auto, 24 tokens")
    ap.add_argument("--budget-s", type=float, default=270.0, help="skip the jobs left after this many seconds")
    ap.add_argument("--hf", action="store_true", help="also time HF transformers (needs torch with CUDA)")
    ap.add_argument("--llama8b", action="store_true", help="also time the 8B-shaped steps (part B; with --small the "
                    "head part runs at a CPU-sized stand-in shape)")
    ap.add_argument("--batches", help="comma-separated batch sizes instead of the preset's (e.g. 32,64)")
    ap.add_argument("--kvs", help="comma-separated KV modes instead of the preset's (e.g. int2)")
    ap.add_argument("--singles", type=int, help="batch-1 rows run this many prompts, one call each, in turn "
                    "(preset: 8; 1 is the first prompt alone, as before)")
    ap.add_argument("--head", default=None, help="the head mode's EAGLE-3 head: a directory, 'random' or 'none' "
                    "(default: checkpoints/code-head if it exists, else 'random' with --small, else none)")
    ap.add_argument("--sweep-ks", help="comma-separated K for every mode's batch-1 sweep instead of the preset's")
    ap.add_argument("--workloads", default="held_out,edit", help="comma-separated workloads (held_out, edit)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated draft modes (plain always runs)")
    ap.add_argument("--parts", default="auto,sweep,fixed",
                    help="which rows: auto (each mode at --lookahead auto), sweep (K at batch 1), fixed (K = 4 at the "
                         "other batches); plain rows come with them")
    args = ap.parse_args()
    head_dir = args.head or (DEFAULT_HEAD if DEFAULT_HEAD.is_dir() else "random" if args.small else "none")
    head_dir = None if head_dir == "none" else head_dir
    cfg = SMALL if args.small else FULL
    if args.batches:
        cfg = dict(cfg, batches=tuple(int(b) for b in args.batches.split(",")))
    if args.kvs:
        cfg = dict(cfg, kvs=tuple(args.kvs.split(",")))
    if args.sweep_ks:
        cfg = dict(cfg, sweep={m: tuple(int(k) for k in args.sweep_ks.split(",")) for m in MODES})
    if args.singles:
        cfg = dict(cfg, singles=args.singles)
    tok = jspec.load(draft=None, kv=KVConfig("bf16")).tokenizer
    n = max(*cfg["batches"], cfg["singles"])
    make = {"held_out": held_out_prompts, "edit": edit_prompts}
    workloads = {name: make[name](tok, n) for name in args.workloads.split(",")}
    result = dict(device=str(jax.devices()[0]), device_kind=jax.devices()[0].device_kind, jax=jax.__version__,
                  config={k: v for k, v in cfg.items()}, prompts={k: len(v) for k, v in workloads.items()},
                  head=None if head_dir is None else str(head_dir))
    t0 = time.perf_counter()
    result["grid"], result["skipped"] = grid(cfg, workloads, args.budget_s, head_dir, tuple(args.parts.split(",")),
                                             lambda rows: save(args.out, dict(result, grid=rows, partial=True)),
                                             tuple(args.modes.split(",")))
    result["grid_s"] = time.perf_counter() - t0
    save(args.out, result)
    if args.hf:
        result["hf"] = hf_rows(next(iter(workloads.values())), cfg["max_new"])
        save(args.out, result)
    tau = next((r["tau"] for r in result["grid"] if (r["workload"], r["kv"], r["mode"], r["batch"], r["lookahead"])
                == ("held_out", "int2", "model", 1, 4)), None)
    if args.llama8b and tau is not None and not args.small:  # the shipped draft's tau at K = 4, as measured before
        result["llama8b_qwen06b"] = part_b(tau)
        save(args.out, result)
    if args.llama8b:  # the head's tau at K = 4 on the shipped pair (a trained head's, not a random one's)
        tau_head = next((r["tau"] for r in result["grid"] if (r["workload"], r["kv"], r["mode"], r["batch"],
                         r["lookahead"]) == ("held_out", "int2", "head", 1, 4)), None)
        result["llama8b_eagle3"] = part_b_head(tau_head if head_dir != "random" else None, small=args.small)
        save(args.out, result)
    plot(result, Path(args.out).with_name("speculative_modes_vs_k.png"))
    print(f"grid {result['grid_s']:.0f}s, skipped {len(result['skipped'])} jobs (budget {args.budget_s:.0f}s)")
    print(table(result["grid"]))


def plot(result: dict, out: Path) -> None:
    try:
        from plots import speculative_modes_vs_k
    except ImportError as e:  # matplotlib is in the bench extra only
        print(f"no plot ({e})")
        return
    speculative_modes_vs_k(result, out)
    print(f"plot: {out}")


def save(path, result):
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
