"""KV cache quality of the shipped target: perplexity and top-1 agreement with BF16 under INT2 KV.

    PYTHONPATH=. python benchmarks/kv_quality.py [--windows 4] [--out benchmarks/results/kv_quality.json]
        [--extra NAME=ROTATION_FILE ...] [--sr 64,256] [--clip on] [--clip-kv K,V ...]
        [--forward model|blocked]

Validation split of the shipped corpus (data/code/val.npy; build it with `python -m jspec.train.data`),
cut into consecutive 2048-token windows (jspec.train.data.eval_windows); a fixed, evenly spaced subset of
them keeps the CPU run short. Float32 weights and compute. Variants: BF16, and INT2 with rotation
{none, hadamard, oscar} x clip {on (K 0.96, V 0.92), off} x (sink, recent) {(64, 256), (16, 64)};
--extra adds other rotation files as rotations of their own (a calibration variant beside the shipped
file, in the same run), --sr / --clip keep one window pair / clip setting. Every summary carries the
per-window perplexities, and every INT2 one the mean and spread over windows of its paired per-window
gap to BF16 (the figure to compare two rotations by: most of the window-to-window variance is shared).

One full forward per window with an empty int2 cache applies the attention rule exactly as decoding
would (key p is read from INT2 for query t iff S <= p <= t - R; tests/test_cache.py pins cached
decode == full forward). The empty cache's capacity only sets how many masked slots attention scans,
so it is kept tiny (CACHE_SLOTS), which halves the work; tests/test_kv_quality.py checks that this
forward equals a chunked prefill through a committed cache.

KV bytes per token come from the cache layout (jspec.cache.kvcache.init_cache, shapes only): BF16 stores
2 x D x 2 bytes per (layer, KV head, token); INT2 stores D/4 code bytes plus a (scale, zero) pair
per group for K and V, for every committed token, plus the BF16 sink (S) and ring (W = R) slots,
which are a fixed cost amortized over the context (2048 and 32K tokens are reported).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jspec.cache import kvcache
from jspec.config import KVConfig, ModelConfig
from jspec.int2 import quant
from jspec.io import checkpoint
from jspec.model import decoder as model, rotation
from jspec.runtime.engine import DEFAULT_TARGET, ROTATION_FILE
from jspec.train import data

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_blocked  # noqa: E402
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

ROTATIONS = ("none", "hadamard", "oscar")
CLIPS = {"on": (0.96, 0.92), "off": (0.0, 0.0)}
WINDOWS = ((64, 256), (16, 64))
SEQ_LEN = 2048
TAIL_FROM = 1024  # a second perplexity over positions >= TAIL_FROM, where most keys are INT2
CACHE_SLOTS = 16
CONTEXTS = (2048, 32768)  # where the sink/ring overhead is amortized for bytes per token


@dataclasses.dataclass(frozen=True)
class Variant:
    rotation: str  # "none" | "hadamard" | "oscar" ("none" for BF16)
    kv: KVConfig  # mode "bf16" or "int2"
    clip: str = "-"  # "on" | "off" ("-" for BF16), or a setting of the caller's ("searched", "K,V")
    layers: tuple | None = None  # one KVConfig per layer (per-layer clips; forward="blocked" only), else kv for all

    @property
    def name(self) -> str:
        if not self.kv.int2:
            return "bf16"
        return f"int2/{self.rotation}/clip-{self.clip}/S{self.kv.sink}-R{self.kv.recent}"


def variants(rotations=ROTATIONS, windows=WINDOWS, clips=tuple(CLIPS)) -> list[Variant]:
    """BF16 first (it is the reference), then every INT2 combination."""
    out = [Variant("none", KVConfig("bf16"))]
    for (S, R) in windows:
        for rot in rotations:
            for clip in clips:
                ck, cv = CLIPS[clip]
                out.append(Variant(rot, KVConfig("int2", sink=S, recent=R, clip_k=ck, clip_v=cv), clip))
    return out


def rotation_sets(cfg: ModelConfig, rotation_file: Path, extra: dict | None = None) -> dict:
    """{name: (rot_k, rot_v)} for none, hadamard, oscar (rotation_file) and each extra {name: file}."""
    files = {"oscar": rotation_file, **(extra or {})}
    return {"none": rotation.data_free_rotations(cfg, "none"), "hadamard": rotation.hadamard_rotations(cfg),
            **{name: rotation.load_rotations(f, cfg)[:2] for name, f in files.items()}}


def rotated_params(params: model.Params, cfg: ModelConfig, rots: dict) -> dict:
    """{rotation name: params} with R_K set and R_V folded into W_v / W_o (float32)."""
    return {name: params if name == "none" else rotation.apply_rotations(params, cfg, *rk_rv)
            for name, rk_rv in rots.items()}


def window_logp(params, cfg: ModelConfig, kv: KVConfig, tokens, capacity: int = CACHE_SLOTS):
    """tokens [1, n] -> next-token log-probabilities [n, V] f32 under kv (one full forward)."""
    # The empty cache is an argument, not built under jit: XLA would constant-fold its masked scores.
    cache = kvcache.init_cache(cfg, kv, 1, capacity, jnp.float32) if kv.int2 else None
    return _logp(params, cfg, tokens, cache)


@partial(jax.jit, static_argnums=1)
def _logp(params, cfg: ModelConfig, tokens, cache):
    logits, _ = model.forward(params, cfg, tokens, cache)
    return jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)


@jax.jit
def token_metrics(logp, ref_logp, targets):
    """Per position: NLL of the target, top-1 agreement with the reference, KL(ref || this)."""
    nll = -jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]
    agree = logp.argmax(-1) == ref_logp.argmax(-1)
    kl = jnp.sum(jnp.exp(ref_logp) * (ref_logp - logp), axis=-1)
    return nll, agree, kl


def summarize(nll: np.ndarray, agree: np.ndarray, kl: np.ndarray, tail_from: int = TAIL_FROM) -> dict:
    """Arrays [windows, n] -> perplexity, top-1 agreement and mean KL, overall and on the tail."""
    tail = np.s_[:, tail_from:]
    return {
        "ppl": float(np.exp(nll.mean())),
        "top1_agree": float(agree.mean()),
        "kl": float(kl.mean()),
        "ppl_tail": float(np.exp(nll[tail].mean())),
        "top1_agree_tail": float(agree[tail].mean()),
        "ppl_windows": np.exp(nll.mean(1)).round(5).tolist(),
        "top1_windows": agree.mean(1).round(5).tolist(),
    }


def paired_gaps(results: dict) -> None:
    """Adds to each INT2 summary its per-window PPL gap to BF16 in percent: mean, std, standard error."""
    base = np.asarray(results["bf16"]["ppl_windows"])
    for name, r in results.items():
        if name == "bf16":
            continue
        gap = 100 * (np.asarray(r["ppl_windows"]) / base - 1)
        sem = gap.std(ddof=1) / np.sqrt(len(gap)) if len(gap) > 1 else float("nan")
        r["gap_windows"] = {"mean": float(gap.mean()), "std": float(gap.std(ddof=1)) if len(gap) > 1 else float("nan"),
                            "sem": float(sem)}
        top1 = np.asarray(r["top1_windows"])
        r["top1_sem"] = float(top1.std(ddof=1) / np.sqrt(len(top1))) if len(top1) > 1 else float("nan")


def evaluate(params_by_rot: dict, cfg: ModelConfig, windows: np.ndarray, vs: list[Variant], log=print,
             tail_from: int = TAIL_FROM, forward: str = "model") -> dict:
    """windows [N, n+1] int32 -> {variant name: summary}; window-major so only one reference is held.

    forward: "model" (window_logp: model.forward with an empty int2 cache) or "blocked" (kv_blocked.logp:
    the same rule in causal query blocks, about 3x faster on a CPU at 2048 tokens).
    """
    acc = {v.name: ([], [], []) for v in vs}
    for i, w in enumerate(windows):
        tokens, targets = jnp.asarray(w[None, :-1]), jnp.asarray(w[1:])
        ref = None
        t0 = time.perf_counter()
        for v in vs:
            kvs = list(v.layers) if v.layers else [v.kv if v.kv.int2 else None] * cfg.num_layers
            if forward == "model" and v.layers:
                raise ValueError(f"{v.name}: per-layer KV settings need forward='blocked'")
            logp = (window_logp(params_by_rot[v.rotation], cfg, v.kv, tokens) if forward == "model" else
                    kv_blocked.logp(params_by_rot[v.rotation], cfg, tokens, kvs))
            ref = logp if ref is None else ref  # vs[0] is BF16
            for lst, x in zip(acc[v.name], token_metrics(logp, ref, targets)):
                lst.append(np.asarray(x))
        ppl = {name: np.exp(lists[0][-1].mean()) for name, lists in acc.items()}  # this window's, for the log
        base = ppl.pop(vs[0].name)
        gaps = " ".join(f"{name}:{100 * (p / base - 1):+.2f}%" for name, p in ppl.items())
        log(f"window {i + 1}/{len(windows)}: {time.perf_counter() - t0:.1f} s; BF16 PPL {base:.3f}; {gaps}")
    results = {name: summarize(*(np.stack(x) for x in lists), tail_from) for name, lists in acc.items()}
    paired_gaps(results)
    return results


def rotation_fit(params, cfg: ModelConfig, tokens, rots: dict, clip=CLIPS["on"]) -> dict:
    """Per (rotation, layer, KV head): how well INT2 codes the rotated keys and values of `tokens` [1, n].

    key_snr_db = 10 log10(E[(q.k)^2] / E[(q.(k - Q(k)))^2]) over every (query row, key) pair of the
    head: the logit error the key rotation is fit to minimize (oscar.md 2.2). value_err = the
    relative squared error |v - Q(v)|^2 / |v|^2 (R_V is orthogonal: the same in either basis).
    rots: {name: (rot_k, rot_v)}, lists of [Hkv, D, D] per layer.
    """
    from jspec.model.calibrate import _layer_step

    G = cfg.head_dim
    x = params.embed[jnp.asarray(tokens)].astype(jnp.float32)
    y = jnp.zeros_like(x)
    out = {name: {"key_snr_db": [], "value_err": []} for name in rots}
    for i in range(params.num_layers):
        x, y, q, k, v = _layer_step(params.layer(i), cfg, x, y)
        Hkv, g = cfg.num_kv_heads, cfg.q_per_kv
        qh = q[0].reshape(-1, Hkv, g, G).transpose(1, 2, 0, 3).reshape(Hkv, -1, G)  # [Hkv, n*g, D]
        kh, vh = k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2)  # [Hkv, n, D]
        for name, (rk, rv) in rots.items():
            kr = jnp.einsum("hnd,hde->hne", kh, rk[i])
            vr = jnp.einsum("hnd,hde->hne", vh, rv[i])
            qr = jnp.einsum("hnd,hde->hne", qh, rk[i])
            kq, vq = quant.fake_quantize(kr, G, clip[0]), quant.fake_quantize(vr, G, clip[1])
            s, e = qr @ kr.transpose(0, 2, 1), qr @ (kq - kr).transpose(0, 2, 1)
            snr = 10 * jnp.log10(jnp.mean(s * s, (1, 2)) / jnp.mean(e * e, (1, 2)))
            verr = jnp.sum((vq - vr) ** 2, (1, 2)) / jnp.sum(vr * vr, (1, 2))
            out[name]["key_snr_db"].append(np.asarray(snr).round(2).tolist())
            out[name]["value_err"].append(np.asarray(verr).round(4).tolist())
    return out


def kv_bytes_per_token(cfg: ModelConfig, kv: KVConfig, context: int) -> float:
    """Bytes of the cache init_cache allocates for one row of `context` tokens, per token."""
    big = dataclasses.replace(cfg, max_position=max(cfg.max_position, context))
    shapes = jax.eval_shape(lambda: kvcache.init_cache(big, kv, 1, context, jnp.bfloat16))
    return shapes.nbytes() / context


def bytes_table(cfg: ModelConfig, vs: list[Variant]) -> dict:
    """{(S, R) or "bf16": {context: bytes/token}}, plus the per-token INT2 floor without the windows."""
    out = {}
    for v in vs:
        key = "bf16" if not v.kv.int2 else f"S{v.kv.sink}-R{v.kv.recent}"
        out[key] = {str(c): kv_bytes_per_token(cfg, v.kv, c) for c in CONTEXTS}
    D, G = cfg.head_dim, KVConfig().group(cfg.head_dim)
    per_head = 2 * (D // 4 + 2 * (D // G) * 2)  # K and V: codes + bf16 (scale, zero) per group
    out["int2_floor"] = {"per_token": cfg.num_layers * cfg.num_kv_heads * per_head,
                         "bits_per_element": per_head * 8 / (2 * D)}
    return out


def _gap(r: dict) -> str:
    g = r.get("gap_windows")
    return "-" if g is None else f"{g['mean']:+.2f}% +- {g['sem']:.2f}"


def markdown(results: dict, kvb: dict, vs: list[Variant]) -> str:
    base = results["bf16"]["ppl"]
    rows = ["| KV | rotation | clip | (S, R) | PPL | vs BF16 | per-window gap (mean +- s.e.) | PPL pos >= 1024 "
            "| top-1 agree | KL (nats) | B/token @2K | B/token @32K |", "|" + " --- |" * 12]
    for v in vs:
        r = results[v.name]
        key = "bf16" if not v.kv.int2 else f"S{v.kv.sink}-R{v.kv.recent}"
        sr = "-" if not v.kv.int2 else f"({v.kv.sink}, {v.kv.recent})"
        b = kvb[key]
        rows.append(
            f"| {v.kv.mode.upper()} | {v.rotation if v.kv.int2 else '-'} | {v.clip} | {sr} | {r['ppl']:.3f} "
            f"| {100 * (r['ppl'] / base - 1):+.2f}% | {_gap(r)} | {r['ppl_tail']:.3f} | {r['top1_agree']:.4f} "
            f"| {r['kl']:.4f} | {b['2048']:.0f} | {b['32768']:.0f} |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_TARGET)
    ap.add_argument("--rotations", type=Path, help=f"OSCAR rotation file (default: MODEL/{ROTATION_FILE})")
    ap.add_argument("--data", type=Path, default=Path("data/code"), help="corpus directory (val.npy)")
    ap.add_argument("--windows", type=int, default=4, help="evenly spaced validation windows (0: all)")
    ap.add_argument("--only", nargs="*", choices=ROTATIONS, default=list(ROTATIONS), help="rotations to run")
    ap.add_argument("--extra", nargs="*", default=[], metavar="NAME=FILE",
                    help="more rotation files, each run as rotation NAME (e.g. a calibration variant)")
    ap.add_argument("--sr", nargs="*", default=[f"{S},{R}" for S, R in WINDOWS], metavar="S,R",
                    help="(sink, recent) pairs to run")
    ap.add_argument("--clip", nargs="*", choices=tuple(CLIPS), default=list(CLIPS), help="clip settings to run")
    ap.add_argument("--clip-kv", nargs="*", default=[], metavar="K,V",
                    help="more clip settings (key and value quantiles), each run as clip setting 'K,V'")
    ap.add_argument("--seq-len", type=int, default=SEQ_LEN, help="tokens per window (a second perplexity from "
                    f"{TAIL_FROM} on, or half the window when shorter)")
    ap.add_argument("--forward", choices=("model", "blocked"), default="model",
                    help="model.forward with an empty int2 cache, or the blocked forward (kv_blocked.py, faster)")
    ap.add_argument("--out", type=Path, default=default_out("kv_quality.json"),
                    help="JSON path (default: a scratch folder)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    rot_file = args.rotations or checkpoint.rotation_path(args.model)
    cfg, params, _ = checkpoint.load_model(args.model, jnp.float32, tokenizer=False)
    seq_len, tail_from = args.seq_len, min(TAIL_FROM, args.seq_len // 2)
    all_windows = data.eval_windows(data.load_split(args.data, "val"), seq_len)  # [N, seq_len + 1]
    n = len(all_windows) if args.windows <= 0 else min(args.windows, len(all_windows))
    picked = np.linspace(0, len(all_windows) - 1, n).round().astype(int)
    extra = dict(e.split("=", 1) for e in args.extra)
    sr = [tuple(int(x) for x in p.split(",")) for p in args.sr]
    for pair in args.clip_kv:  # a clip setting of its own, named by its values
        CLIPS[pair] = tuple(float(x) for x in pair.split(","))
    vs = variants(list(args.only) + list(extra), sr, [*args.clip, *args.clip_kv])
    rots = rotation_sets(cfg, rot_file, {k: Path(f) for k, f in extra.items()})
    results = evaluate(rotated_params(params, cfg, rots), cfg, all_windows[picked], vs, tail_from=tail_from,
                       forward=args.forward)
    kvb = bytes_table(cfg, vs)
    # Diagnostic (middle picked window, clip on): how well INT2 codes the keys/values under each rotation.
    fit = rotation_fit(params, cfg, all_windows[picked[n // 2]][None, :-1], rots)
    wall = time.perf_counter() - t0
    table = markdown(results, kvb, vs)
    print(table)
    _, _, meta = rotation.load_rotations(rot_file, cfg)
    report = {
        "model": str(args.model), "rotation_file": str(rot_file), "rotation_meta": meta,
        "extra_rotations": {k: {"file": f, "meta": rotation.load_rotations(f, cfg)[2]} for k, f in extra.items()},
        "split": "val", "seq_len": seq_len, "windows_total": len(all_windows), "windows_used": picked.tolist(),
        "scored_positions": int(n * seq_len), "tail_from": tail_from, "compute": "float32",
        "clips": CLIPS, "results": results, "kv_bytes_per_token": kvb,
        "rotation_fit": {"window": int(picked[n // 2]), **fit},
        "variants": [{"name": v.name, "rotation": v.rotation, "clip": v.clip, **dataclasses.asdict(v.kv)} for v in vs],
        "wall_s": round(wall, 1), "backend": jax.default_backend(), "jax": jax.__version__, "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
