"""Levers on OSCAR's INT2 quality for a real model, measured one at a time (kv_quality_real.py's texts).

    PYTHONPATH=. python benchmarks/kv_quality_real_levers.py [--model FILE.gguf] [--windows 2] [--seq-len 1024]
        [--out benchmarks/results/kv_quality_real_levers.json]

One calibration pass (training-split stdlib code, 8192 tokens) gives the rotations of every lever: the
targets of its first 2K / 8K tokens (token count), U's column order (desc, asc), per KV head
vs one per layer. Then the clip quantiles (K, V) shared by all layers, and a per-layer table: the gap to
BF16 when only layer i's history is INT2 (the other layers BF16; the layers before i reuse BF16's
residual). Every variant is scored at (sink, recent) = (64, 256) on the same windows of held-out prose
and code, paired with BF16: per-window gap in percent (mean, standard error) and top-1 agreement.
The JSON is rewritten after every variant, so a cut run keeps what it measured.
"""

from __future__ import annotations

import argparse
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

TOKENS = (2048, 8192)


def prefix_targets(params, cfg, batches, counts):
    """{tokens: (C_Q, C_S) [L, Hkv, D, D]} for the first `tokens` of batches, from one layer-by-layer pass."""
    f32 = lambda t: jax.tree.map(lambda a: a.astype(jnp.float32), t)
    xs = [params.embed[jnp.asarray(t)].astype(jnp.float32) for t in batches]
    ys = [jnp.zeros_like(x) for x in xs]
    per = np.cumsum([b.size for b in batches])
    out = {c: ([], []) for c in counts}
    for i in range(params.num_layers):
        lp = f32(params.layer(i))
        qs, ks, vs = [], [], []
        for b, (x, y) in enumerate(zip(xs, ys)):
            xs[b], ys[b], q, k, v = calibrate._layer_step(lp, cfg, x, y)
            qs.append(np.asarray(q)), ks.append(np.asarray(k)), vs.append(np.asarray(v))
        for c in counts:
            m = int(np.searchsorted(per, c) + 1)
            cq, cs = calibrate.layer_targets(qs[:m], ks[:m], vs[:m], cfg.num_kv_heads)
            out[c][0].append(cq), out[c][1].append(cs)
    return {c: (np.stack(a), np.stack(b)) for c, (a, b) in out.items()}


class Scorer:
    """Per-window NLL and top-1 agreement of a variant, paired with BF16 on the same windows."""

    def __init__(self, params, cfg, windows: dict):
        self.cfg, self.windows, self.ref = cfg, windows, {}
        for name, ws in windows.items():
            for i, w in enumerate(ws):
                tok = jnp.asarray(w[None, :-1])
                res = kv_blocked.residuals(params, cfg, tok, [None] * cfg.num_layers)
                lp = kv_blocked.head_logp(params, *res[-1], cfg)
                self.ref[name, i] = (res, np.asarray(lp.argmax(-1)), self._nll(lp, w))

    @staticmethod
    def _nll(lp, w):
        return float(-jnp.take_along_axis(lp, jnp.asarray(w[1:, None]), -1).mean())

    def score(self, params, kvs, start_layer: int = 0) -> dict:
        out = {}
        for name, ws in self.windows.items():
            gaps, agree = [], []
            for i, w in enumerate(ws):
                res, arg, nll = self.ref[name, i]
                tok = jnp.asarray(w[None, :-1])
                lp = kv_blocked.logp(params, self.cfg, tok, kvs, start=(start_layer, res[start_layer]))
                gaps.append(100 * (np.exp(self._nll(lp, w) - nll) - 1))
                agree.append(float((np.asarray(lp.argmax(-1)) == arg).mean()))
            g, a = np.asarray(gaps), np.asarray(agree)
            sem = lambda x: float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")
            out[name] = {"gap_pct": round(float(g.mean()), 3), "gap_sem": round(sem(g), 3), "gap_windows": g.round(3).tolist(),
                         "top1": round(float(a.mean()), 4), "top1_sem": round(sem(a), 4)}
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=real.smollm2_path())
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--layer-table", choices=("prose", "code", "none"), default="prose",
                    help="text of the per-layer table (its first window)")
    ap.add_argument("--out", type=Path, default=default_out("kv_quality_real_levers.json"),
                    help="JSON path (default: a scratch folder)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cfg, params, tok = checkpoint.load_model(args.model, jnp.float32)
    L = cfg.num_layers
    report = {"command": "PYTHONPATH=. python benchmarks/kv_quality_real_levers.py " + " ".join(sys.argv[1:]),
              "commit": real.git_commit(), "model": Path(args.model).name, "device": jax.devices()[0].device_kind,
              "jax": jax.__version__, "seq_len": args.seq_len, "windows": args.windows, "sink_recent": [64, 256],
              "levers": {}, "layer_table": []}
    save = lambda: args.out.write_text(json.dumps(report, indent=2) + "\n")
    log = lambda *a: print(f"[{time.perf_counter() - t0:.0f} s]", *a, flush=True)

    batches = real.calibration_batches(tok, max(TOKENS), 512)
    targets = prefix_targets(params, cfg, batches, TOKENS)
    log("targets ready")
    top = max(TOKENS)
    rots = {f"oscar/{c}tok": rotation.rotations_from_covariances(*targets[c]) for c in TOKENS}
    rots["oscar/asc"] = rotation.rotations_from_covariances(*targets[top], order="asc")
    rots["oscar/per-layer"] = rotation.rotations_from_covariances(*targets[top], per_head=False)
    rots["hadamard"] = rotation.hadamard_rotations(cfg)
    windows = {"prose": real.pick_windows(real.encode(tok, real.prose_text()), args.seq_len, args.windows)[0],
               "code": real.pick_windows(real.encode(tok, real.code_text(True)), args.seq_len, args.windows)[0]}
    scorer = Scorer(params, cfg, windows)
    log("BF16 references ready")
    kv = KVConfig("int2", sink=64, recent=256)
    rotated = {}

    def run(name, rot, kvs, **kw):
        if rot not in rotated:
            rotated.clear()
            rotated[rot] = rotation.apply_rotations(params, cfg, *rots[rot])
        r = scorer.score(rotated[rot], kvs, **kw)
        log(name, json.dumps(r))
        return r

    main_rot = f"oscar/{top}tok"
    for name in ["hadamard", *rots]:
        if name != "hadamard" or "hadamard" not in report["levers"]:
            report["levers"][name] = run(name, name, [kv] * L)
            save()
    for ck, cv in ((0.9, 0.85), (0.0, 0.0), (0.98, 0.96)):
        name = f"{main_rot}/clip-{ck}-{cv}"
        report["levers"][name] = run(name, main_rot, [KVConfig("int2", sink=64, recent=256, clip_k=ck, clip_v=cv)] * L)
        save()
    if args.layer_table != "none":
        scorer.windows = {args.layer_table: windows[args.layer_table][:1]}
        for i in range(L):
            r = run(f"layer {i}", main_rot, [kv if j == i else None for j in range(L)], start_layer=i)
            report["layer_table"].append({"layer": i, **r[args.layer_table]})
            save()
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    save()
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
