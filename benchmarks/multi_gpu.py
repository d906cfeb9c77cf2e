"""Decode tokens/s of the 8B-shaped target on one GPU and on several: tensor- and data-parallel.

    PYTHONPATH=. python benchmarks/multi_gpu.py --out $OUT/multi_gpu.json
    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu PYTHONPATH=. \
        python benchmarks/multi_gpu.py --smoke     # CPU check: two host devices, decode.py's tiny model

The step of benchmarks/decode.py (a fori_loop of decode steps in one jitted call) on a ("dp", "tp")
mesh of jspec.runtime.sharding: the target split over tp by heads and MLP units, the cache by rows over dp and
KV heads over tp, the Pallas kernel run per shard. Each mesh is timed in the same process as the
one-GPU baseline.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

from jspec.model import decoder as model
from jspec.runtime import sharding

from decode import LLAMA3_8B, SMOKE, kv_modes, time_step  # noqa: E402  (benchmarks/ is on sys.path)
from scratch import default_out  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(default_out("multi_gpu.json")), help="JSON path (default: a scratch folder)")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="a CPU check of the script: decode.py's tiny model, "
                    "context 512, batch 2, 2 steps per call")
    args = ap.parse_args(argv)
    if args.smoke:
        args.ctx, args.batches, args.steps = 512, "2", 2
    cfg, n = SMOKE if args.smoke else LLAMA3_8B, jax.device_count()
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    modes = kv_modes(params, cfg)
    meshes = [(None, 1)] + [(spec, k) for k in (2, 4, 8) if k <= n for spec in (f"tp={k},dp=1", f"tp=1,dp={k}")]
    rows = []
    for name, (kv, impl, p) in modes.items():
        for spec, k in meshes:
            label = spec or "1 GPU"
            mesh = None if spec is None else sharding.make_mesh(spec, cfg, jax.devices()[:k])
            placed = p if mesh is None else sharding.shard_params(p, cfg, mesh)
            for B in map(int, args.batches.split(",")):
                if B % sharding.dp_size(mesh):
                    continue
                try:
                    t = time_step(placed, cfg, kv, B, args.ctx, impl, steps=args.steps, mesh=mesh)
                except jax.errors.JaxRuntimeError as e:  # e.g. a BF16 cache that fits only when split
                    rows.append(dict(kv=name, mesh=label, batch=B, error=str(e).splitlines()[0][:200]))
                    print(rows[-1], flush=True)
                    continue
                rows.append(dict(kv=name, mesh=label, gpus=k, batch=B,
                                 ms=t * 1e3, tok_s=B / t))
                print(f"{name} {label:>10} B {B:>3}: {t * 1e3:8.2f} ms  {B / t:8.0f} tok/s", flush=True)
                with open(args.out, "w") as f:
                    json.dump(dict(device=str(jax.devices()[0]), n_devices=n, jax=jax.__version__, ctx=args.ctx,
                                   steps_per_call=args.steps, rows=rows), f, indent=1)
            del placed


if __name__ == "__main__":
    main()
