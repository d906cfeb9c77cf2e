# Session 23, call 5 (H200): the fused norms (pallas/add_norm.py) at rest. Two more INT2 / BF16 pairs at B 1 / 128K
# (separate processes; call 4 had 1.713x), every GPU-marked test, then the README command cold and warm (the shipped
# draft's norms take the kernel: hidden 256; the target's 384 stays in XLA).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for r in 1 2; do el "step pair $r"; timeout 60 python benchmarks/step_ab.py --tag r$r --jspec-root . \
  --cases int2:1:131072,bf16:1:131072 --profile "" --out $OUT/step_r$r.json 2>&1 | grep "ms/step"; done
el "gpu tests"; timeout 340 python -m pytest -q --tb=short -m gpu -p no:cacheprovider 2>&1 | grep -v "^  warnings\|Warning\|^  " | tail -15
el "README command"; timeout 100 python benchmarks/startup.py --cases shipped --no-job --out $OUT/startup_readme.json \
  2>&1 | grep "^| "
el done
