# Session 27, call 2 (issue 16's 1.7x and 1.3x, 0.03-0.08 ms short at B 1 / 128K): the INT2 step's kernels by kind
# (profile_step.py; its JSON and the step's HLO come back), to choose what to cut.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "profile"; timeout 200 python benchmarks/profile_step.py --out $OUT/profile --cases int2:1:131072 2>&1 | tail -30
gzip -9 $OUT/profile/*.hlo.txt 2>/dev/null; ls -la $OUT/profile
el done
