# Session 16, device call 3. Issue 14, re-measured after sessions 15-16's kernel changes (the Mosaic grid, ring,
# late values, the commit's grid): the README command cold and warm and the 24-prompt job (shipped pair), the 8B
# + draft program cold and from the persistent cache in a second process; then the INT2 step's compiled HLO and
# profile at B 1 / 128K for the next small-kernel cut (issue 16 item 3; gzipped).
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "startup: README command, job, 8B + draft"
timeout 300 python benchmarks/startup.py --cases shipped,8b+draft --budget 280 --out $OUT/startup.json 2>&1 | tail -14
el "step profile"
timeout 80 python benchmarks/step_ab.py --tag default --cases int2:1:131072 --profile int2:1:131072 \
  --out $OUT/step.json 2>&1 | grep -v "^{" | tail -22
gzip -c $OUT/step_profile/int2_B1_131072.hlo.txt > $OUT/int2_B1_131072.hlo.txt.gz; rm -rf $OUT/step_profile
el done
