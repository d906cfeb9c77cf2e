# Session 14, device call 5 (the last ~6 minutes of device time). The INT2 step's compiled HLO at B 1 / 128K with
# its profile (which small kernels are left per layer, for issue 16 item 3; gzipped: at most 8 files come back),
# then the 8B + draft program cold and warm from the autotuning pack as committed.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "step profile"
timeout 80 python benchmarks/step_ab.py --tag default --cases int2:1:131072 --profile int2:1:131072 \
  --out $OUT/step.json 2>&1 | grep -v "^{" | tail -22
gzip -c $OUT/step_profile/int2_B1_131072.hlo.txt > $OUT/int2_B1_131072.hlo.txt.gz; ls $OUT/step_profile; rm -rf $OUT/step_profile
el "8B + draft, cold and warm"
timeout 110 python benchmarks/startup.py --no-readme --cases 8b+draft --budget 100 --out $OUT/startup_8b.json 2>&1 | tail -4
el done
