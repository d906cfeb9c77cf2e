"""Speculation at long context on the 8B shape: each drafter's step against the target's, at 32K and 128K, batch 1-64.

    PYTHONPATH=. python benchmarks/long_context.py --out $OUT/long_context.json            # one GPU
    JAX_PLATFORMS=cpu PYTHONPATH=. python benchmarks/long_context.py --small --out /tmp/lc.json   # CPU check
    PYTHONPATH=.:benchmarks python benchmarks/long_context.py --derive FILE.json --out FILE.json   # auto rows again

Part A, measured, then derived. Llama-3-8B-shaped target (random bf16 weights, Hadamard rotations, INT2 OSCAR KV
with its INT2 history written straight into the cache: the cache's length set to the context, as decode.py's 1M
row; a long prefill is not the point), a Qwen3-0.6B-shaped draft model and a Llama-3.1-8B-EAGLE-3-shaped head.
Per context and batch, in one run, by the loops --lookahead auto uses (jspec.runtime.lookahead.measure): the plain
INT2 step (a target forward over one token and its commit), the verify step (K + 1 tokens), and each drafter's own
step: the self-draft (the target over its BF16 window and a round's scratch), the draft model and the head each
over a full BF16 cache and over a windowed one (decode.state.DRAFT_WINDOW), the n-gram lookup, and the self-skip
(decode.drafters.self_skip: the target's first 16, 24 or 28 of its 32 layers over the self-draft's view). A drafter
whose cache does not fit the device beside the target's is skipped and says so. From these costs and the
tokens per round measured on the CPU with the shipped pair (benchmarks/results/long_context_acceptance.json, at
the longest context it has: 4K; self-skip: benchmarks/results/self_skip.json at the same fraction of the shipped
target's 8 layers, 1K, code), the speed-up over plain INT2, tau * step / (draft(K) + verify(K + 1)): derived,
labelled so (random weights have no acceptance of their own).
Part B, measured directly: the shipped pair at its own contexts (up to 4K), batch 1, greedy: plain INT2 decoding and
each drafter at K = 4 on the same held-out prompts, paired calls, speed-up = median of plain time / drafter time.
--small: CPU-sized shapes and contexts (a check that the script runs end to end before GPU time is spent).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jspec
from jspec.cache import kvcache
from jspec.config import GenerateConfig, KVConfig, SamplingConfig
from jspec.decode import drafters
from jspec.decode.state import DRAFT_WINDOW, Drafter, DraftMode, Models
from jspec.model import decoder as model, head, rotation
from jspec.runtime import lookahead

from decode import LLAMA3_8B  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from long_context_acceptance import HEAD, prompts  # noqa: E402
from speculative import LLAMA3_8B_EAGLE3, QWEN3_06B_SHAPE  # noqa: E402
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

K = 4
# Self-skip's N of the 8B's 32 layers: the fractions self_skip.json measured on the shipped target's 8 (4/8, 6/8 =
# the default 3/4, 7/8), so each derived row reads the acceptance of its own fraction.
SKIP_LAYERS = (16, 24, 28)
FULL = dict(contexts=(32768, 131072), batches=(1, 8, 32, 64), paired_contexts=(1024, 4000), new_tokens=64, reps=3)
SMALL = dict(contexts=(512, 1024), batches=(1, 2), paired_contexts=(200,), new_tokens=8, reps=1)
# name: (draft mode, the drafter's model or head ("model", "head", None), a windowed cache)
DRAFTERS = {"self": (DraftMode.SELF, None, False), "ngram+self": (DraftMode.NGRAM_SELF, None, False),
            "ngram": (DraftMode.NGRAM, None, False), "model": (DraftMode.MODEL, "model", False),
            "model-window": (DraftMode.MODEL, "model", True), "head": (DraftMode.HEAD, "head", False),
            "head-window": (DraftMode.HEAD, "head", True), **{f"self-skip-{n}": (DraftMode.SELF_SKIP, n, False)
                                                              for n in SKIP_LAYERS}}
RESULTS = Path(__file__).resolve().parent / "results"  # the landed acceptance figures (CPU, shipped pair)
ACCEPTANCE, SELF_SKIP = RESULTS / "long_context_acceptance.json", RESULTS / "self_skip.json"


def shapes(small: bool, max_ctx: int):
    """(target config, draft config, head config): the 8B shapes, or CPU-sized stand-ins."""
    cfg, dcfg, hcfg = LLAMA3_8B, QWEN3_06B_SHAPE, LLAMA3_8B_EAGLE3
    if small:
        cfg = dataclasses.replace(cfg, vocab_size=8192, hidden_size=256, intermediate_size=896, num_layers=4,
                                  num_heads=2, num_kv_heads=1)
        dcfg = dataclasses.replace(dcfg, vocab_size=8192, hidden_size=128, intermediate_size=384, num_layers=2,
                                   num_heads=2, num_kv_heads=1)
        hcfg = head.HeadConfig(head.layer_config(cfg, 2, 1, 896), 2048, (1, 2, 3))
    cfg = dataclasses.replace(cfg, max_position=max(cfg.max_position, max_ctx + 1024))
    dcfg = dataclasses.replace(dcfg, max_position=cfg.max_position)
    hcfg = dataclasses.replace(hcfg, layer=dataclasses.replace(hcfg.layer, max_position=cfg.max_position))
    return cfg, dcfg, hcfg


def weights(cfg, dcfg, hcfg):
    target = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    target = rotation.apply_rotations(target, cfg, *rotation.hadamard_rotations(cfg))
    draft = model.init_params(dcfg, jax.random.key(1), dtype=jnp.bfloat16)
    Vd = hcfg.draft_vocab
    d2t = np.sort(np.random.default_rng(0).choice(cfg.vocab_size, Vd, False)) - np.arange(Vd)
    return target, draft, head.init_head(hcfg, jax.random.key(2), jnp.bfloat16, d2t=d2t)


def drafter(name, draft, hp, dcfg, hcfg) -> Drafter:
    mode, part, windowed = DRAFTERS[name]
    window = DRAFT_WINDOW if windowed else None
    if part == "model":
        return Drafter(draft, mode=mode, model_cfg=dcfg, window=window)
    if part == "head":
        return Drafter(head=hp, mode=mode, head_cfg=hcfg, window=window)
    if isinstance(part, int):  # self-skip: the target's first `part` layers (all of a smaller --small target)
        return Drafter(mode=mode, layers=part)
    return Drafter(mode=mode)


def cache_bytes(m: Models, kv: KVConfig, B: int, cap: int) -> int:
    """What the target's and the drafter's caches of a call take (allocation sizes)."""
    caches = jax.eval_shape(lambda: (kvcache.init_cache(m.target_cfg, kv, B, cap, jnp.bfloat16, K),
                                     drafters.init_cache(m.drafter, B, cap, jnp.bfloat16, K)))
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(caches))


def free_bytes() -> float:
    stats = jax.devices()[0].memory_stats() or {}
    return stats["bytes_limit"] - stats["bytes_in_use"] - 4 * 2**30 if "bytes_limit" in stats else float("inf")


def acceptance() -> dict:
    """{drafter: tokens per round at K} at the longest context measured (float32 rows first), or {} when absent."""
    rows = [r for r in json.loads(ACCEPTANCE.read_text())["rows"] if r["K"] == K] if ACCEPTANCE.is_file() else []
    out = {}
    for r in sorted(rows, key=lambda r: (r["dtype"] != "float32", -r["context"])):
        out.setdefault(r["drafter"], dict(tau=r["tokens_per_round"], context=r["context"], dtype=r["dtype"]))
    if SELF_SKIP.is_file():  # code at 1K, float32: the same fraction of the shipped target's 8 layers
        for r in json.loads(SELF_SKIP.read_text())["acceptance"]:
            if r["drafter"] == "self-skip" and r["text"] == "code" and 32 * r["layers"] // 8 in SKIP_LAYERS:
                out[f"self-skip-{32 * r['layers'] // 8}"] = dict(tau=r["tokens_per_round"], context=r["context"],
                                                                 dtype=f"float32, its first {r['layers']} of 8 layers")
    return out


def part_a(cfg, dcfg, hcfg, contexts, batches, budget_s: float, names=tuple(DRAFTERS)) -> list[dict]:
    target, draft, hp = weights(cfg, dcfg, hcfg)
    kv, impl = KVConfig("int2"), "pallas" if jax.default_backend() == "gpu" else "reference"
    taus, rows, t0 = acceptance(), [], time.perf_counter()
    for ctx in contexts:
        for B in batches:
            memo, cap, priced = {}, ctx + K + 2, {}
            for name in names:
                m = Models(target, drafter(name, draft, hp, dcfg, hcfg), cfg, K, impl)
                row = dict(ctx=ctx, batch=B, drafter=name, K=K)
                if cache_bytes(m, kv, B, cap) > free_bytes():
                    rows.append(dict(row, skipped="the caches do not fit the device"))
                    continue
                if time.perf_counter() - t0 > budget_s:
                    rows.append(dict(row, skipped="time budget"))
                    continue
                costs = priced[name] = lookahead.measure(m, kv, B, cap, ctx, K, jnp.bfloat16, memo=memo)
                step, draft_s, verify = costs.verify_at(1), costs.draft(m.drafter.mode, K), costs.verify_at(K + 1)
                row.update(measured_ms=dict(plain_step=step * 1e3, verify=verify * 1e3, draft_round=draft_s * 1e3),
                           costs_ms=costs.as_ms())
                if name in taus:
                    tau = taus[name]["tau"]
                    row["derived"] = dict(tau=tau, tau_from=f"shipped pair, CPU, {taus[name]['context']} tokens, "
                                          f"{taus[name]['dtype']}", speedup_over_plain_int2=tau * step / (draft_s + verify))
                rows.append(row)
                print(json.dumps(row), flush=True)
            rows.append(auto_row(rows, priced, taus, ctx, B))
            print(json.dumps(rows[-1]), flush=True)
    return rows


# What draft "auto" holds here (load's candidates: self-skip at its default 3/4 of the layers, the windowed draft;
# its ngram+self-skip and ngram+model are not timed here)
AUTO = ("self", "ngram", "ngram+self", "self-skip-24", "model-window")


CALLS, CALL_TOKENS = 4, 256  # auto_row: calls of one workload, tokens per row of each


def auto_row(rows: list[dict], priced: dict, taus: dict, ctx: int, B: int) -> dict:
    """What draft "auto" chooses at (ctx, B) by the engine's own rule, call by call over CALLS calls of CALL_TOKENS
    tokens of the workload taus holds, as Engine.plan_auto and Engine.generate_ids learn: each candidate priced
    (lookahead.price, K <= 4: the verify is timed at 1 and 5 tokens) at lookahead.auto_alpha (the priors for B rows
    on the first call, then what the earlier calls measured), lookahead.winner; the call then measures its drafter
    at that drafter's tau at K = 4 as a per-draft alpha (lookahead.alpha_from_accepted) and the engine learns it
    (lookahead.observe, after_call). Each call's derived speed-up is its choice at that true alpha;
    derived = the last call's (what a job of this workload runs at), first_call = the first one's.
    best_candidate: the best derived row of its candidates at K = 4, for comparison."""
    if not priced:
        return dict(ctx=ctx, batch=B, drafter="auto", K=K, skipped="no candidate measured")
    names = [n for n in AUTO if n in priced and n in taus]
    seen, bench, calls = {}, {}, []
    for call in range(CALLS):
        cands = [lookahead.plain(next(iter(priced.values())))]
        for name in names:
            mode = DRAFTERS[name][0]
            alpha, source = lookahead.auto_alpha(mode, seen.get(name, (0, 0)), bench.get(name), call, B)
            cands.append(dataclasses.replace(lookahead.price(priced[name], mode, alpha, source, K, ks=range(1, K + 1)),
                                             mode=name))
        won, gain = lookahead.winner(cands), 1.0
        if won.K:
            costs, mode = priced[won.mode], DRAFTERS[won.mode][0]
            alpha = lookahead.alpha_from_accepted(taus[won.mode]["tau"] - 1, K)
            tokens = lookahead.expected_tokens(alpha, won.K)
            gain = tokens * costs.verify_at(1) / (costs.draft(mode, won.K) + costs.verify_at(won.K + 1))
            rounds = max(round(CALL_TOKENS / tokens), 1)
            accepted = round(rounds * (tokens - 1))
            seen[won.mode] = lookahead.observe(seen.get(won.mode, (0, 0)), won.K, rounds, accepted)
            bench[won.mode] = lookahead.after_call(bench.get(won.mode), costs, mode, won.K,
                                                   lookahead.alpha_from_accepted(accepted / rounds, won.K), call)
        calls.append(dict(chose=won.mode, K=won.K, speedup=gain, why=[c.stats() for c in cands]))
    best = max(((r["derived"]["speedup_over_plain_int2"], r["drafter"]) for r in rows if r.get("ctx") == ctx
                and r.get("batch") == B and r["drafter"] in AUTO and "derived" in r), default=(1.0, "none"))
    last = calls[-1]
    return dict(ctx=ctx, batch=B, drafter="auto", K=last["K"], chose=last["chose"], calls=calls,
                derived=dict(speedup_over_plain_int2=last["speedup"], first_call=calls[0]["speedup"]),
                best_candidate=dict(drafter=best[1], speedup=best[0]))


def derive(path: Path) -> dict:
    """A landed JSON's auto rows derived again from its measured rows (their costs_ms), by today's auto_row."""
    result = json.loads(path.read_text())
    measured = [r for r in result["part_a"] if r["drafter"] != "auto"]
    taus, rows = acceptance(), []
    for ctx, B in dict.fromkeys((r["ctx"], r["batch"]) for r in measured):
        cell = [r for r in measured if (r["ctx"], r["batch"]) == (ctx, B)]
        priced = {r["drafter"]: lookahead.Costs.from_ms(r["costs_ms"]) for r in cell if "costs_ms" in r}
        rows += cell + [auto_row(cell, priced, taus, ctx, B)]
    result["part_a"] = rows
    return result


def part_b(contexts, new_tokens: int, reps: int) -> list[dict]:
    """The shipped pair, batch 1: plain INT2 against each drafter at K = 4, paired calls on held-out prompts."""
    rows = []
    engines = {name: jspec.load(draft=arg, **kw) for name, (arg, kw) in dict(
        plain=(None, {}), self=("self", {}), ngram=("ngram", {}), model=("shipped", dict(draft_window=None)),
        head=(str(HEAD), dict(draft_window=None)), **{"ngram+self": ("ngram+self", {}), "model-window": ("shipped", {}),
                                                      "head-window": (str(HEAD), {})}).items()}
    for ctx in contexts:
        [ids] = prompts(engines["plain"].tokenizer, 1, ctx, new_tokens)
        call = lambda name, K: engines[name].generate_ids([ids], [SamplingConfig()], [new_tokens],
                                                         GenerateConfig(new_tokens, lookahead=K, stop_at_eos=False))[0]
        for name in engines:
            if name == "plain":
                continue
            call("plain", 0), call(name, K)  # compile both
            ratios, taus = [], []
            for _ in range(reps):
                plain, spec = call("plain", 0)[1], call(name, K)[1]
                ratios.append(plain.decode_s / spec.decode_s)
                taus.append(spec.accept_length)
            rows.append(dict(ctx=ctx, drafter=name, K=K, batch=1, new_tokens=new_tokens,
                             measured_speedup_over_plain_int2=statistics.median(ratios), tau=statistics.median(taus)))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=default_out("long_context.json"),
                    help="JSON path (default: a scratch folder)")
    ap.add_argument("--small", action="store_true", help="CPU-sized shapes and contexts")
    ap.add_argument("--budget-s", type=float, default=480.0, help="part A skips what is left after this")
    ap.add_argument("--parts", default="ab", help="a: the 8B-shaped costs and derived speed-ups; b: the shipped pair's "
                    "measured speed-up")
    ap.add_argument("--contexts", type=int, nargs="+", help="part A's contexts (default 32K and 128K)")
    ap.add_argument("--batches", type=int, nargs="+", help="part A's batches (default 1 8 32 64)")
    ap.add_argument("--drafters", nargs="+", choices=list(DRAFTERS), default=list(DRAFTERS), help="part A's drafters")
    ap.add_argument("--derive", type=Path, help="no measuring: this JSON's auto rows derived again from its "
                    "measured costs (written to --out)")
    a = ap.parse_args(argv)
    if a.derive:
        a.out.write_text(json.dumps(derive(a.derive), indent=1))
        return 0
    preset = dict(SMALL if a.small else FULL)
    preset.update({k: tuple(v) for k, v in dict(contexts=a.contexts, batches=a.batches).items() if v})
    cfg, dcfg, hcfg = shapes(a.small, max(preset["contexts"]))
    result = dict(device=str(jax.devices()[0]), jax=jax.__version__, small=a.small, K=K,
                  shapes=dict(target=cfg.hidden_size, draft=dcfg.hidden_size, head=hcfg.layer.hidden_size),
                  draft_window=dataclasses.asdict(DRAFT_WINDOW))
    if "a" in a.parts:
        result["part_a"] = part_a(cfg, dcfg, hcfg, preset["contexts"], preset["batches"], a.budget_s, a.drafters)
        a.out.write_text(json.dumps(result, indent=1))
    if "b" in a.parts:
        result["part_b"] = part_b(preset["paired_contexts"], preset["new_tokens"], preset["reps"])
        a.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
