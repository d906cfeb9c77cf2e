"""The cold README command with lookahead's costs shipped (lookahead.SHIPPED), beside the autotuning results.

Run 1: the cold README command (cold_census.run: new compilation and lookahead caches; the autotuning results
shipped as they are) measures lookahead's costs; its cost files become the shipped ones (in this tree, and
under --out to bring back). Runs 2 and 3: the cold README command again in new caches: no cost measurement
("costs timed in" absent or near 0 in the stats), the autotuning results seeded as before.

    PYTHONPATH=.:benchmarks/results/logs12 python benchmarks/results/logs13/ship_costs.py --out DIR
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import cold_census

from jspec import lookahead


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    res = {}
    with tempfile.TemporaryDirectory() as a:
        res["run1_costs_measured"] = cold_census.run(a, {}, [])
        measured = sorted((Path(a) / "jspec" / "lookahead").glob("*.json"))
        if not measured:
            raise SystemExit("run 1 left no cost files")
        lookahead.SHIPPED.mkdir(parents=True, exist_ok=True)
        (out / "lookahead").mkdir(parents=True, exist_ok=True)
        for f in measured:
            shutil.copyfile(f, lookahead.SHIPPED / f.name)
            shutil.copyfile(f, out / "lookahead" / f.name)
        res["shipped"] = [f.name for f in measured]
    for run in ("run2_costs_shipped", "run3_costs_shipped"):
        with tempfile.TemporaryDirectory() as b:
            res[run] = cold_census.run(b, {}, [])
    for k, r in res.items():
        if k == "shipped":
            print("shipped:", r)
            continue
        print(k, r["wall_s"], "s rc", r["returncode"], r["stats"][-170:])
        for prog, f in list(r["programs"].items())[:4]:
            print(f"   {prog:32s} {dict(f)}")
    (out / "ship_costs.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
