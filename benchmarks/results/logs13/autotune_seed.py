"""Does a cold README command skip XLA's GEMM autotuning when its per-fusion autotune results are there?

Run 1: the cold README command (cold_census.run: new compilation and lookahead caches), with XLA's new
autotuner also pointed at a directory of its own (--xla_gpu_experimental_autotuner_cache_dir), to see
which of the two caches the autotuner of this jaxlib writes. Then every file that is not a compiled program
is copied out ($OUT/autotune) and into a second new cache, and run 2 is the cold README command again with
those results in place (no compiled program, no lookahead costs: only the autotuner's results), run 3 the
same with the per-fusion directory only (the experimental one left empty).

    PYTHONPATH=.:benchmarks/results/logs12 python benchmarks/results/logs13/autotune_seed.py --out DIR
"""

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import cold_census

PER_FUSION = "xla_gpu_per_fusion_autotune_cache_dir"


def listing(root: Path) -> dict:
    """Files under root that are not JAX cache entries, with their sizes."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(("-cache", "-atime"))}


def cold(tmp: Path, exp: Path) -> dict:
    exp.mkdir(parents=True, exist_ok=True)
    env = {"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_experimental_autotuner_cache_dir={exp}"}
    r = cold_census.run(str(tmp), env, [])
    r["files"] = listing(tmp)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    res = {}
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, tempfile.TemporaryDirectory() as c:
        a, b, c = Path(a), Path(b), Path(c)
        res["run1_cold"] = cold(a, a / "exp")
        shutil.copytree(a, out / "autotune", ignore=shutil.ignore_patterns("*-cache", "*-atime", "jspec"))
        # run 2: both autotune directories seeded
        (b / "xla").mkdir()
        if (a / "xla" / PER_FUSION).exists():
            shutil.copytree(a / "xla" / PER_FUSION, b / "xla" / PER_FUSION)
        shutil.copytree(a / "exp", b / "exp")
        res["run2_seeded_both"] = cold(b, b / "exp")
        # run 3: only the per-fusion directory (the one JAX sets up by itself)
        (c / "xla").mkdir()
        if (a / "xla" / PER_FUSION).exists():
            shutil.copytree(a / "xla" / PER_FUSION, c / "xla" / PER_FUSION)
        res["run3_seeded_per_fusion"] = cold(c, c / "exp")
    for k, r in res.items():
        print(k, r["wall_s"], "s rc", r["returncode"], r["stats"][-160:])
        print("   files:", len(r["files"]), sum(r["files"].values()), "bytes;",
              sorted({f.split("/")[0] + "/" + f.split("/")[1] if "/" in f else f for f in r["files"]})[:6])
        for prog, f in list(r["programs"].items())[:6]:
            print(f"   {prog:32s} {dict(f)}")
    (out / "autotune_seed.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
