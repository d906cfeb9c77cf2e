"""The 8B-shaped INT2 target + 0.6B-shaped draft program (startup.py's "8b+draft" case) cold with and without
its XLA autotuning results shipped beside the README command's (engine.seed_autotune), then warm.

Run 1: the case cold in a new cache seeded with the shipped pack as it is (the README command's results: none
match these shapes); the per-fusion autotune files it adds become part of the pack (in this tree and under --out
to bring back). Run 2: cold again in a new cache seeded with the merged pack. Run 3: warm (run 2's cache).

    PYTHONPATH=.:benchmarks python benchmarks/results/logs14/autotune_8b.py --out DIR
"""

import argparse
import base64
import json
import tempfile
from pathlib import Path

import jaxlib
import startup

from jspec import engine

SHIPPED = engine.AUTOTUNE_DIR / f"jaxlib-{jaxlib.__version__}.json"
KEEP = ("load_s", "trace_s", "lower_s", "compile_s", "cache_hit", "run_s", "wall_s", "phases", "error")


def case(cache: Path, process: str) -> dict:
    args = argparse.Namespace(small=False, abstract=False, phases=process == "warm", one_program=False)
    r = startup.run_child("8b+draft", cache, args, 300)
    tuned = cache / engine.PER_FUSION
    r = {k: r[k] for k in KEEP if k in r}
    r["autotune_files"] = sorted(str(p.relative_to(tuned)) for p in tuned.rglob("*") if p.is_file())
    print(process, {k: v for k, v in r.items() if k not in ("phases", "autotune_files")},
          len(r["autotune_files"]), "autotune files", flush=True)
    print("   ", r.get("phases", [])[:6], flush=True)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    pack = json.loads(SHIPPED.read_text())
    res = {}
    with tempfile.TemporaryDirectory() as a:
        res["cold_readme_pack"] = case(Path(a), "cold, the README command's pack")
        tuned = Path(a) / engine.PER_FUSION
        new = {f: base64.b64encode((tuned / f).read_bytes()).decode()
               for f in res["cold_readme_pack"]["autotune_files"] if f not in pack}
    res["added"] = len(new)
    if not new:
        raise SystemExit("run 1 added no autotune files")
    pack.update(new)
    SHIPPED.write_text(json.dumps(pack, indent=0, sort_keys=True) + "\n")
    (out / SHIPPED.name).write_text(SHIPPED.read_text())
    with tempfile.TemporaryDirectory() as b:
        res["cold_merged_pack"] = case(Path(b), "cold, merged pack")
        res["warm"] = case(Path(b), "warm")
    (out / "autotune_8b.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
