"""Plots from benchmarks/results/*.json (run anywhere after the GPU runs).

    python benchmarks/plots.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jspec.cache import kvcache
from jspec.config import KVConfig  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def tokens_vs_context(decode: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [r for r in decode["rows"] if "tok_s" in r]  # rows that ran
    batches = sorted({r["batch"] for r in rows})
    for kv, style, marker in (("bf16", "--", "s"), ("int2", "-", "o")):
        for i, B in enumerate(batches):  # one colour per batch, one line style per KV mode
            pts = sorted((r["ctx"], r["tok_s"]) for r in rows if r["kv"] == kv and r["batch"] == B)
            if pts:
                ax.plot(*zip(*pts), style, marker=marker, color=plt.cm.viridis(i / max(1, len(batches) - 1)),
                        label=f"{kv} B={B}")
    ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="decode tokens/s",
           title="Llama-3-8B-shaped target, one H200")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def memory_vs_context(out: Path) -> None:
    """KV bytes per sequence from the cache layout (Llama-3-8B shapes), computed, not measured."""
    from decode import LLAMA3_8B

    import jax
    import jax.numpy as jnp

    ctxs = [2**k for k in range(11, 18)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for kv in (KVConfig("bf16"), KVConfig("int2")):
        sizes = []
        for T in ctxs:
            c = jax.eval_shape(lambda: kvcache.init_cache(LLAMA3_8B, kv, 1, T, jnp.bfloat16))
            sizes.append(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(c.layers)) / 2**30)
        ax.plot(ctxs, sizes, marker="o", label=kv.mode)
    ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="KV cache per sequence (GiB)",
           title="KV memory, Llama-3-8B shapes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def speedup_vs_k(spec: dict, out: Path) -> None:
    a = spec["shipped_pair"]
    base = next(r["tok_s"] for r in a["rows"] if r["system"] == "jspec" and r["kv"] == "int2"
                and r["draft"] == "none" and r["batch"] == 1)
    ks = [r["K"] for r in a["by_k"]]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ks, [r["tok_s"] / base for r in a["by_k"]], marker="o", label="tokens/s vs no draft")
    ax.plot(ks, [r["accept_length"] for r in a["by_k"]], marker="s", label="accept_length")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel="lookahead K", title="shipped pair, batch 1, int2 KV")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def speculative_modes_vs_k(spec: dict, out: Path, batch: int | None = None) -> None:
    """Speed-up over plain decoding against K, one line per draft mode (K = 0 is plain decoding), one panel
    per workload and KV mode; a star marks what --lookahead auto chose and measured. batch: the smallest
    in the grid unless given."""
    if not spec["grid"]:
        return
    batch = batch or min(r["batch"] for r in spec["grid"])
    rows = [r for r in spec["grid"] if r["batch"] == batch]
    workloads = sorted({r["workload"] for r in rows})
    kvs = sorted({r["kv"] for r in rows})
    fig, axes = plt.subplots(len(workloads), len(kvs), figsize=(5 * len(kvs), 3.6 * len(workloads)), squeeze=False)
    for (i, w), (j, kv) in ((x, y) for x in enumerate(workloads) for y in enumerate(kvs)):
        ax = axes[i][j]
        sel = [r for r in rows if r["workload"] == w and r["kv"] == kv]
        for c, mode in enumerate(("model", "ngram", "ngram+model", "head")):
            pts = sorted([(0, 1.0)] + [(r["K"], r["speedup"]) for r in sel if r["mode"] == mode
                                       and r["lookahead"] != "auto"])
            color = plt.cm.tab10(c)
            ax.plot(*zip(*pts), marker="o", color=color, label=mode)
            for r in (r for r in sel if r["mode"] == mode and r["lookahead"] == "auto"):
                ax.plot(r["K"], r["speedup"], marker="*", ms=14, color=color, ls="none")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set(xlabel="lookahead K (star: auto)", ylabel="speed-up vs plain", title=f"{w}, {kv} KV, batch {batch}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main():
    decode = RESULTS / "decode.json"
    if decode.is_file():
        tokens_vs_context(json.loads(decode.read_text()), RESULTS / "decode_tokens_vs_context.png")
    memory_vs_context(RESULTS / "kv_memory_vs_context.png")
    spec = RESULTS / "speculative.json"
    if spec.is_file():
        spec = json.loads(spec.read_text())
        if "grid" in spec:  # the draft-mode grid (benchmarks/speculative.py since issue 17)
            speculative_modes_vs_k(spec, RESULTS / "speculative_modes_vs_k.png")
        else:
            speedup_vs_k(spec, RESULTS / "speculative_speedup_vs_k.png")


if __name__ == "__main__":
    main()
