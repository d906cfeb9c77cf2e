# Session 28, call 3 (issue 16): the INT2 commit in groups of 16 layers against 8 (the default), alternated three
# times (session 27's prepared next_call.sh c without its cold compile), each run also timing BF16 at B 1 / 128K:
# six INT2 / BF16 pairs and six floor ratios at B 1 / 128K from one call.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
CASES=int2:1:131072,bf16:1:131072,int2:8:32768
ab() { timeout 100 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases $CASES --profile "" $2 \
  --out $OUT/step_$1.json 2>&1 | grep "ms/step"; }
for i in 1 2 3; do
  el "groups of 16, $i"; ab g16_$i "--commit-group 16"
  el "groups of 8, $i"; ab g8_$i ""
done
el done
