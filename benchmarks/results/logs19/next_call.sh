# Prepared in session 19 for session 20 (not run): why the user path's cache hit of the 8B + draft program took
# 2.83 s (startup.py --engine, call 2) against 1.54 s for JAX's own cache (session 16): store_probe.py's steps,
# one part after the other, then Engine.compile again in a fresh process. Then qkv rows (logs19/qkv_rows.patch,
# applied to a copy in .before/qkv) against this tree, alternating twice: call 2's -0.061 ms was one pair of
# processes, within the spread between processes. About 5 minutes.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
S=benchmarks/results/logs19/store_probe.py
for m in write engine steps engine; do el "store_probe $m"; timeout 150 python $S --cache /tmp/sp $m 2>&1 | tail -1; done
rm -rf .before/qkv && mkdir -p .before/qkv && cp -r jspec tests .before/qkv/ && (cd .before/qkv && patch -s -p1 < ../../benchmarks/results/logs19/qkv_rows.patch)
ab() { PYTHONPATH=$2:benchmarks timeout 100 python benchmarks/step_ab.py --tag $1 --jspec-root $2 \
  --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step_$1.json 2>&1 | grep "ms/step"; }
for i in 1 2; do el "A/B $i"; ab base$i . ; ab qkv$i .before/qkv; done
el done
