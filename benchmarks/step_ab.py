"""8B-shaped decode step of one library tree: step times and a kernel profile, for A/B runs of two trees.

    # in one device call, the old tree at .before/prev (its jspec is imported through PYTHONPATH):
    PYTHONPATH=.before/prev python benchmarks/step_ab.py --tag before --jspec-root .before/prev --out $OUT/ab_before.json
    PYTHONPATH=. python benchmarks/step_ab.py --tag after --jspec-root . --out $OUT/ab_after.json
    PYTHONPATH=. python benchmarks/step_ab.py --tag after-gemm --gemm-products --cases int2:1:131072,int2:8:32768 \
        --profile "" --out $OUT/ab_after_gemm.json

The script, benchmarks/decode.py and benchmarks/profile_step.py come from this directory in both runs
(decode.py and profile_step.py are unchanged since d0dd9b9); only the jspec package differs, and the
JSON records which one was imported. --cases: kv mode : batch : context, timed as decode.py does (random
bf16 Llama-3-8B weights, `--steps` steps per jitted call, median of 8 calls). --profile: the cases to
trace with profile_step.profile_case (kernels per step by kind; the HLO is written beside the JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp

import jspec
from jspec.attention import split as attention_split
from jspec.cache import kvcache
from jspec.model import decoder as model

from decode import LLAMA3_8B, copy_bandwidth, kv_modes, kv_read_bytes, time_step, weight_bytes  # noqa: E402
from profile_step import profile_case  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True, help="a name for this tree in the JSON (before, after)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="int2:1:131072,bf16:1:131072,int2:8:32768,bf16:8:32768")
    ap.add_argument("--profile", default="int2:1:131072", help="cases to trace; empty: none")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--jspec-root", default=None, help="fail unless jspec is imported from under this folder")
    ap.add_argument("--gemm-products", action="store_true", help="issue 16 tree only: the small products (R_K, "
                    "the BF16 window's) as GEMMs again (SMALL_ROTATE = SMALL_CHUNK = 0), to time that choice alone")
    ap.add_argument("--scan-layers", action="store_true", help="the layers stacked, each forward one lax.scan "
                    "(model.stack_layers), compiled with model.SCAN_OPTIONS as the engine does")
    ap.add_argument("--scan-option", action="append", default=[], metavar="NAME=VALUE", help="with --scan-layers: "
                    "an XLA option added to model.SCAN_OPTIONS (the value read as JSON where it is), to time it")
    ap.add_argument("--jnp-commit", action="store_true", help="the int2 commit in jnp (kvcache.FUSED_COMMIT = "
                    "False), to time it against the default one Pallas kernel (pallas/int2_commit.py)")
    ap.add_argument("--commit-group", type=int, default=None, help="kvcache.COMMIT_GROUP: the fused commit as a "
                    "kernel per this many layers (0: one kernel for all layers, the default before session 26)")
    ap.add_argument("--xla-window", action="store_true", help="the BF16 window parts and the merge in XLA "
                    "(attention_split.FUSED_WINDOW = False), to time them against the one Pallas kernel "
                    "(pallas/window_merge.py)")
    ap.add_argument("--xla-norms", action="store_true", help="the residual adds and RMS norms in XLA (model."
                    "FUSED_NORMS = False), to time them against one Pallas kernel each (pallas/add_norm.py)")
    args = ap.parse_args()
    for opt in args.scan_option:  # read by model.compile_options when each step is compiled
        name, value = opt.split("=", 1)
        try:  # true, false and numbers as JSON reads them; anything else a string
            model.SCAN_OPTIONS[name] = json.loads(value)
        except json.JSONDecodeError:
            model.SCAN_OPTIONS[name] = value
    if args.xla_window:
        attention_split.FUSED_WINDOW = False  # read while tracing
    if args.xla_norms:
        model.FUSED_NORMS = False  # read while tracing
    if args.jnp_commit:
        kvcache.FUSED_COMMIT = False  # read while tracing
    if args.commit_group is not None:
        kvcache.COMMIT_GROUP = args.commit_group or None  # read while tracing
    if args.gemm_products:
        model.SMALL_ROTATE = attention_split.SMALL_CHUNK = 0  # read while tracing: set before any step is traced
    if args.jspec_root and not os.path.abspath(jspec.__file__).startswith(os.path.abspath(args.jspec_root) + os.sep):
        raise SystemExit(f"jspec imported from {jspec.__file__}, not from under {args.jspec_root}")
    t0 = time.perf_counter()
    longest = max(int(c.split(":")[2]) for c in filter(None, args.cases.split(",")))
    cfg = LLAMA3_8B if longest + 1024 <= LLAMA3_8B.max_position else \
        dataclasses.replace(LLAMA3_8B, max_position=longest + 1024)  # as decode.py for 1M
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    modes = kv_modes(params, cfg)
    wbytes, bw = weight_bytes(params), copy_bandwidth()
    if args.scan_layers:  # each mode's weights stacked (the unstacked ones are freed with params and modes)
        del params
        modes = {k: (kv, impl, model.stack_layers(p)) for k, (kv, impl, p) in modes.items()}
    res = dict(tag=args.tag, jspec=jspec.__file__, gemm_products=args.gemm_products, jnp_commit=args.jnp_commit,
               commit_group=args.commit_group, xla_window=args.xla_window, xla_norms=args.xla_norms,
               scan_layers=args.scan_layers, scan_options=dict(model.SCAN_OPTIONS) if args.scan_layers else None,
               xla_flags=os.environ.get("XLA_FLAGS", ""),
               device=str(jax.devices()[0]),
               jax=jax.__version__, copy_bw_gbs=bw / 1e9, steps_per_call=args.steps, rows=[], profiles=[])
    print(f"[{args.tag}] jspec from {jspec.__file__}; copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    for case in filter(None, args.cases.split(",")):
        mode, B, ctx = case.split(":")
        B, ctx = int(B), int(ctx)
        kv, impl, p = modes[mode]
        t1 = time.perf_counter()
        t = time_step(p, cfg, kv, B, ctx, impl, steps=args.steps)
        floor = (wbytes + kv_read_bytes(cfg, kv, B, ctx)) / bw
        res["rows"].append(dict(kv=mode, batch=B, ctx=ctx, ms=t * 1e3, floor_ms=floor * 1e3,
                                case_s=time.perf_counter() - t1))
        print(f"[{args.tag}] {mode} B {B} ctx {ctx}: {t * 1e3:.3f} ms/step (floor at copy bandwidth "
              f"{floor * 1e3:.2f} ms; case took {time.perf_counter() - t1:.0f} s)", flush=True)
        save()
    out_dir = os.path.splitext(args.out)[0] + "_profile"
    os.makedirs(out_dir, exist_ok=True)
    for case in filter(None, args.profile.split(",")):
        mode, B, ctx = case.split(":")
        r = profile_case(modes, mode, int(B), int(ctx), out_dir)
        res["profiles"].append(r)
        print(f"[{args.tag}] profile {r['case']}: wall {r['wall_ms']:.2f} ms, {r['kernels_per_step']:.0f} "
              f"kernels/step, kernel time {r['kernel_ms_per_step']:.3f} ms", flush=True)
        for k in r["kinds"][:20]:
            print(f"   {k['ms']:7.3f} ms  {k['per_step']:6.0f}x  {k['kind'][:100]}", flush=True)
        save()
    print(f"[{args.tag}] done in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
