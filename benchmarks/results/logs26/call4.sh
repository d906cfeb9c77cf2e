# Session 26, call 4 (call 3's machine, warm): the default tree (COMMIT_GROUP = 8, three parts) Engine.compile cold
# of the 8B + draft program twice, with its second process (warm); INT2 / BF16 at B 1 / 128K once more.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for r in 1 2; do
  el "engine default $r"; timeout 100 python benchmarks/startup.py --engine --rerun --cases 8b+draft --no-readme \
    --no-job --out $OUT/engine_default_$r.json 2>&1 | grep "^| 8b+draft"
done
el "int2 / bf16"; timeout 80 python benchmarks/step_ab.py --tag rest2 --jspec-root . \
  --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step_rest2.json 2>&1 | grep "ms/step"
el done
