"""Are the shipped XLA autotuning results (jspec/autotune/jaxlib-*.json, seeded by engine.seed_autotune) still those
of today's programs? Session 22 measured the 8B + draft program's cold compile at 23.9-26.9 s, against 14.94 s when
its results were first shipped (session 14). For each case (the README command's program, "shipped"; the 8B-shaped
INT2 target + 0.6B-shaped draft, "8b+draft"), a cold run in a fresh cache seeded with the pack as it is: the
per-fusion files XLA writes that the pack lacks are fusions it autotuned again. Those join the pack (in this tree and
under --out, to bring back), and both cases run cold again on the merged pack, then warm.

    PYTHONPATH=.:benchmarks python benchmarks/results/logs22/autotune_refresh.py --out DIR [--small]

--small: tiny 8B-case shapes, the 8b+draft case only (a CPU check of the script; XLA:CPU writes no files).
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
KEEP = ("load_s", "compile_s", "run_s", "wall_s", "error")
CASES = ("shipped", "8b+draft")


def case(name: str, cache: Path, process: str, small: bool) -> dict:
    args = argparse.Namespace(small=small, abstract=False, phases=False, one_program=False, engine=True,
                              scan_layers=False, scan_draft=False, rerun=False, xla_norms=False)
    r = startup.run_child(name, cache, args, 300)
    tuned = cache / engine.PER_FUSION
    r = {k: r[k] for k in KEEP if k in r}
    r["autotune_files"] = sorted(str(p.relative_to(tuned)) for p in tuned.rglob("*") if p.is_file())
    print(name, process, {k: v for k, v in r.items() if k != "autotune_files"}, len(r["autotune_files"]),
          "autotune files", flush=True)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    out, cases = Path(a.out), CASES[1:] if a.small else CASES
    pack = json.loads(SHIPPED.read_text()) if SHIPPED.exists() else {}  # none for a jaxlib without a pack
    res, new = {}, {}
    for name in cases:
        with tempfile.TemporaryDirectory() as tmp:
            r = res[f"{name} cold, the pack as shipped"] = case(name, Path(tmp), "cold, the pack as shipped", a.small)
            tuned = Path(tmp) / engine.PER_FUSION
            added = {f: base64.b64encode((tuned / f).read_bytes()).decode() for f in r["autotune_files"] if f not in pack}
            r["not_in_pack"] = len(added)
            print(f"   {len(added)} of {len(r['autotune_files'])} files not in the pack", flush=True)
            new.update(added)
    if new:
        pack.update(new)
        SHIPPED.write_text(json.dumps(pack, indent=0, sort_keys=True) + "\n")
        (out / SHIPPED.name).write_text(SHIPPED.read_text())
    for name in cases:
        with tempfile.TemporaryDirectory() as tmp:
            res[f"{name} cold, merged pack"] = case(name, Path(tmp), "cold, merged pack", a.small)
            res[f"{name} warm"] = case(name, Path(tmp), "warm", a.small)
    (out / "autotune_refresh.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
