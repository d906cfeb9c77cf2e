"""The cold README command with and without XLA's autotuning results shipped (engine.seed_autotune).

Run 1: the cold README command (cold_census.run: new compilation and lookahead caches) with no shipped
results (jspec/autotune/jaxlib-<version>.json moved aside); the per-fusion autotune files it leaves in its
compilation cache become the shipped pack (relative path -> base64 contents; in this tree, and under --out
to bring back). Runs 2 and 3: the cold README command again in new caches, which engine.use_compile_cache
seeds from that pack. (Session 13's call 3 ran it with the pack as a folder of the same files, before they
were packed into one JSON: the round trip is byte for byte.)

    PYTHONPATH=.:benchmarks/results/logs12 python benchmarks/results/logs13/autotune_seed.py --out DIR
"""

import argparse
import base64
import json
import tempfile
from pathlib import Path

import cold_census
import jaxlib

from jspec import engine

SHIPPED = engine.AUTOTUNE_DIR / f"jaxlib-{jaxlib.__version__}.json"


def files(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def cold(tmp: Path) -> dict:
    """The cold README command in tmp, with the autotune files it found (seeded) and left."""
    r = cold_census.run(str(tmp), {}, [])
    tuned = tmp / "xla" / engine.PER_FUSION
    r["autotune_files"] = files(tuned)
    r["autotune_bytes"] = sum((tuned / f).stat().st_size for f in r["autotune_files"])
    r["autotune_new"] = len(set(r["autotune_files"]) - set(json.loads(SHIPPED.read_text()) if SHIPPED.exists() else {}))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    res = {}
    aside = SHIPPED.with_name(SHIPPED.name + ".aside")
    if SHIPPED.exists():
        SHIPPED.rename(aside)
    with tempfile.TemporaryDirectory() as a:
        res["run1_cold_unseeded"] = cold(Path(a))
        tuned = Path(a) / "xla" / engine.PER_FUSION
        pack = {f: base64.b64encode((tuned / f).read_bytes()).decode() for f in files(tuned)}
        if not pack:  # no GPU autotuner ran (a CPU): keep what was shipped
            aside.rename(SHIPPED) if aside.exists() else None
            raise SystemExit("run 1 left no autotune files")
        SHIPPED.write_text(json.dumps(pack, indent=0, sort_keys=True) + "\n")
    (out / SHIPPED.name).write_text(SHIPPED.read_text())
    for run in ("run2_cold_seeded", "run3_cold_seeded"):
        with tempfile.TemporaryDirectory() as b:
            res[run] = cold(Path(b))
    for k, r in res.items():
        print(k, r["wall_s"], "s rc", r["returncode"], r["stats"][-170:])
        print(f"   autotune files {len(r['autotune_files'])} ({r['autotune_new']} not shipped), "
              f"{r['autotune_bytes']} bytes")
        for prog, f in list(r["programs"].items())[:5]:
            print(f"   {prog:32s} {dict(f)}")
    (out / "autotune_seed.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
