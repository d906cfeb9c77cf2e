# Session 19, call 2: issue 16's qkv rows again (session 17's change 3 in the form it left to try: R_K's reduction
# writing bf16 rows, RoPE per slot; .before/qkv = the helper's jspec) against this tree's jspec (.before/prev =
# git archive f8c73ba jspec tests), separate processes of one call; the user path's cache hit of the
# 8B + draft program (startup.py --engine: Engine.compile, jspec's program store). (Cut to these after
# two refused starts; the GPU tests moved to call 3.)
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
ab() {  # tag root profile
  PYTHONPATH=$2:benchmarks timeout 150 python benchmarks/step_ab.py --tag $1 --jspec-root $2 \
    --cases int2:1:131072,bf16:1:131072 --profile "$3" --out $OUT/step_$1.json 2>&1 | grep -v "^{" | tail -18
}
el "startup.py --engine 8b+draft: cold, then the cache hit"
PYTHONPATH=. timeout 170 python benchmarks/startup.py --engine --no-readme --cases 8b+draft --out $OUT/startup_engine.json 2>&1 | tail -4
el "step_ab before (f8c73ba)"; ab before .before/prev ""
el "step_ab qkv rows, profile"; ab qkv .before/qkv int2:1:131072
el done
