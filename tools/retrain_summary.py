"""The metrics of issue 18 from the reports tools/retrain_pair.sh wrote: prints one JSON object.

    python tools/retrain_summary.py WORK/new      # WORK/new/issue18/*.json, WORK/new/checkpoints/

Every figure is read from a report; a report that is missing (its stage failed or timed out) gives
null figures, never a default.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOALS = {"bpb_reduction": 0.15, "repeated_line_share": 0.25, "tokens_per_round": 2.3, "oscar_vs_bf16_ppl": 0.015}


def read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def row(report: dict, metric: str, model: str = "target") -> dict:
    """pair_quality's validation row for (metric, model); reports from before its rows keep one per metric."""
    rows = [r for r in report.get("rows", []) if (r["metric"], r["split"], r["model"]) == (metric, "validation", model)]
    return rows[0] if rows else report.get(metric, {})


def dir_bytes(path: Path) -> int | None:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else None


def kv_summary(kvq: dict) -> dict:
    """PPL of BF16 and of INT2 at (64, 256) with clip on, per rotation, and OSCAR's gap to BF16."""
    res = kvq.get("results", {})
    bf16 = get(res, "bf16", "ppl")
    out = {"bf16_ppl": bf16}
    for rot in ("none", "hadamard", "oscar"):
        out[f"int2_{rot}_ppl"] = get(res, f"int2/{rot}/clip-on/S64-R256", "ppl")
    if bf16 and out["int2_oscar_ppl"]:
        out["oscar_vs_bf16"] = out["int2_oscar_ppl"] / bf16 - 1
        out["oscar_better_than_none"] = out["int2_none_ppl"] is not None and out["int2_oscar_ppl"] < out["int2_none_ppl"]
    return out


def packages_table(meta: dict) -> str:
    """The corpus' packages as a markdown table for checkpoints/README.md."""
    rows = ["| package | version | licence | files |", "| --- | --- | --- | --- |"]
    rows += [f"| {p['name']} | {p['version']} | {p['licence']} | {p['files']} |" for p in meta.get("packages", [])]
    return "\n".join(rows)


def summary(new: Path) -> dict:
    rep = new / "issue18"
    old, tgt, pair = read(rep / "old_pair.json"), read(rep / "new_target.json"), read(rep / "new_pair.json")
    old_bpb, new_bpb = get(row(old, "bpb"), "bpb"), get(row(tgt, "bpb"), "bpb")
    sizes = {name: dir_bytes(new / "checkpoints" / name) for name in ("code-target", "code-draft", "code-head")}
    out = {
        "bpb": {"old": old_bpb, "new": new_bpb,
                "reduction": 1 - new_bpb / old_bpb if old_bpb and new_bpb else None},
        "repeated_line_share": {"old": get(row(old, "repetition"), "repeated_line_share"),
                                "new": get(row(tgt, "repetition"), "repeated_line_share")},
        "tokens_per_round_k4": {"old": get(row(old, "tau", "pair"), "tokens_per_round"),
                                "new": get(row(pair, "tau", "pair"), "tokens_per_round")},
        "greedy_agreement_new": get(row(pair, "agree", "pair"), "greedy_agreement"),
        "kv_quality": kv_summary(read(rep / "kv_quality.json")),
        "checkpoint_bytes": sizes,
        "corpus": {k: v for k, v in read(rep / "corpus_meta.json").items() if k not in ("rejected_packages",)},
        "training": {name: read(rep / f"{name}.json") for name in ("target_train", "draft_pretrain", "draft_distil", "head_train")},
        "packages_table": packages_table(read(rep / "corpus_meta.json")),
        "goals": GOALS,
        "reports": {name: read(rep / f"{name}.json") for name in ("old_pair", "new_target", "new_pair")},
    }
    return out


if __name__ == "__main__":
    print(json.dumps(summary(Path(sys.argv[1])), indent=2, default=str))
