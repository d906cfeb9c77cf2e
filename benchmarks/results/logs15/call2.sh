# Session 15, device call 2. Issue 16: (1) how many CTAs of the decode kernel fit on an SM (the profiler's
# kernel_details and theoretical occupancy) and split sweeps around waves of 396 (3 per SM) and 528 (4 per SM),
# to set decode_splits by waves; (2) the fused commit alone with fewer/more warps and keys and values in
# programs of their own (its GPU tests first). commit_ab.py's variants then included split_kv (keys and values in
# programs of their own), now the only layout, so rerunning this script times today's kernel under other names.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "commit GPU tests"
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int2_commit.py 2>&1 | tail -2
el "commit alone"
timeout 120 python benchmarks/commit_ab.py --out $OUT 2>&1 | tail -30
sweep() {  # name, points, split counts
  timeout $4 python benchmarks/kernel_diag.py --trace --budget-s $(( $4 - 15 )) --out $OUT/$1 \
    --variants base$(for s in $3; do echo -n ",num_splits=$s"; done) --points $2 2>&1 | grep -v "^{" | grep "B=" 
}
el "splits, B 1 / 1M"; sweep s1m 1:1048576:1 "49 50 66 99 100 132 148 149" 60
el "splits, B 4 / 1M"; sweep s4m 4:1048576:1 "12 13 17 24 25 33 37 49 50" 75
el "splits, 128K"; sweep s128 1:131072:1,8:131072:1 "6 7 12 16 17 19 25 33 49 50 66 99" 110
el "splits, B 8 / 32K"; sweep s32 8:32768:1 "6 7 8 12 16" 40
python - <<'PY'
import json, os
for d in ("s1m", "s4m", "s128", "s32"):
    p = os.path.join(os.environ["OUT"], d, "kernel_diag.json")
    if os.path.exists(p):
        r = json.load(open(p))["rows"]
        print(d, r[0].get("details"))
PY
el done
