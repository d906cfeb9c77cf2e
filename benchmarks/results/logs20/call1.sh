# Session 20, call 1 (H200): the decode kernel's splits at B 1 / 128K (kernel alone, traced); the step's profile and
# compiled HLO at B 1 / 128K (which fusions surround the Mosaic kernel: the target of this session's q/k/v kernel);
# then session 19's store_probe (issue 14: why Engine.compile's cache hit took 2.83 s).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "kernel_diag splits at B 1 / 128K"
timeout 150 python benchmarks/kernel_diag.py --trace --points 1:131072:1 --out $OUT/kd \
  --variants base,num_splits=98,num_splits=147,num_splits=33 2>&1 | grep -E "^B=|copy [0-9]"
el "step_ab now, profile"
timeout 150 python benchmarks/step_ab.py --tag now --jspec-root . --cases int2:1:131072,bf16:1:131072 \
  --profile int2:1:131072 --out $OUT/step_now.json 2>&1 | grep -vE "^ +0\.00[0-9] ms" | tail -30
S=benchmarks/results/logs19/store_probe.py
for m in write engine steps engine; do el "store_probe $m"; timeout 150 python $S --cache /tmp/sp $m 2>&1 | tail -3; done
el done
