"""`jspec calibrate` (and `python -m jspec.calibrate`): the command line over jspec.model.calibrate.

jspec calibrate --model DIR [--data PATH_OR_GLOB ...] [--tokens N] [--seq-len L]
    [--mode oscar|hadamard|none] [--per-layer] [--order desc|asc] [--clip-tokens N] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax.numpy as jnp

from jspec.cli import notes
from jspec.config import INT32_MAX, ConfigError, check_int
from jspec.model import rotation
from jspec.model.calibrate import CLIP_TOKENS, calibrate, data_files, token_windows


def check_args(args) -> None:
    """ConfigError naming the flag unless the sizes are positive integers."""
    for flag in ("tokens", "seq_len", "batch_size"):
        check_int(f"--{flag.replace('_', '-')}", getattr(args, flag), 1, INT32_MAX)
    check_int("--clip-tokens", args.clip_tokens, 0, INT32_MAX)


def check_out(out: Path) -> None:
    """ConfigError unless out is a new path or a rotation file jspec wrote (rotation.is_rotation_file): --out
    must never overwrite anything else, such as the model's own weights."""
    if out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a directory: give the rotation file's path")
    if out.exists() and not rotation.is_rotation_file(out):
        raise ConfigError(f"--out {str(out)!r} exists and is not a rotation file jspec wrote: refusing to overwrite "
                          "it (give another path, or remove it first)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="jspec calibrate", description="Fit OSCAR KV rotations.")
    ap.add_argument("--model", required=True, help="local Hugging Face model directory or GGUF file")
    ap.add_argument("--data", nargs="+",
                    help="calibration text files or globs (default: DIR/calibration.txt, for FILE.gguf its folder's)")
    ap.add_argument("--tokens", type=int, default=30000, help="calibration token budget")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per calibration window")
    ap.add_argument("--batch-size", type=int, default=4, help="windows per forward")
    ap.add_argument("--mode", choices=rotation.MODES, default="oscar")
    ap.add_argument("--per-layer", action="store_true", help="one rotation per layer shared by its KV heads")
    ap.add_argument("--order", choices=rotation.ORDERS, default="desc",
                    help="U's column order: which eigen-direction H maps to the constant row (default desc)")
    ap.add_argument("--clip-tokens", type=int, default=CLIP_TOKENS,
                    help="tokens the clip search reads (0: no search; the run time then uses its default clips)")
    ap.add_argument("--out", help="rotation file (default: DIR/rotations.safetensors, FILE.rotations.safetensors "
                                  "beside FILE.gguf)")
    args = ap.parse_args(argv)

    from jspec.io.checkpoint import CheckpointError, is_gguf, load_model, rotation_path

    model_dir = Path(args.model)
    out = Path(args.out) if args.out else rotation_path(model_dir)
    try:
        check_args(args)
        check_out(out)
        say = notes.say if sys.stderr.isatty() else lambda _: None  # as the bar: on a terminal only
        say(f"loading {model_dir}")
        cfg, params, tokenizer = load_model(model_dir, dtype=jnp.float32)
        batches = []
        if args.mode == "oscar":
            files = data_files(model_dir.parent if is_gguf(model_dir) else model_dir, args.data)
            say(f"reading up to {args.tokens} tokens from {len(files)} file(s), then fitting "
                f"{cfg.num_layers} layers (a progress bar on a terminal)")
            batches = token_windows(tokenizer, files, args.tokens, args.seq_len, args.batch_size)
        rot_k, rot_v, meta = calibrate(params, cfg, batches, args.mode, per_head=not args.per_layer,
                                       order=args.order, clip_tokens=args.clip_tokens)
    except (FileNotFoundError, ConfigError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        rotation.save_rotations(out, rot_k, rot_v, meta)
    except OSError as e:
        print(f"error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    clips = f", clip (K, V) {meta['clip_model']}" if "clip_model" in meta else ""
    print(f"wrote {out}: mode={meta['mode']} {meta['grouping']}, {meta['calibration_tokens']} tokens{clips}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
