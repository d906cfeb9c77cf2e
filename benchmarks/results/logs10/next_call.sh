# Prepared in session 10; run in session 11 as its call 1 (logs: results/logs11/call1.log): two questions this session's calls raised,
# and the fused INT2 commit (pallas/int2_commit.py, kvcache.FUSED_COMMIT; CPU-tested only).
# 1. Issue 14: does any form of a stacked weight's layer slice reach its GEMM in place (slice_probe.py)?
# 2. Issue 14: the warm README command, 6.6-8.4 s in session 10 against 3.6-4.1 s in session 9: the Pallas
#    modules imported eagerly (this tree, 153682c reverted) against lazily (153682c re-applied to a copy),
#    interleaved, each with its own caches warmed by one cold run first.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "fused commit: GPU tests, then the 8B step with and without it (kernels per step in the profile)"
timeout 90 python -m pytest -q -m gpu tests/test_int2_commit.py -p no:cacheprovider 2>&1 | tail -2
for f in "" --fused-commit; do
  timeout 150 python benchmarks/step_ab.py --tag "commit$f" $f --cases int2:1:131072,int2:8:32768 \
    --profile int2:1:131072 --out $OUT/step_commit$f.json 2>&1 | grep -v "^{" | tail -4
done
el "slice probe"
timeout 120 python benchmarks/results/logs10/slice_probe.py --m 1,8,256 2>&1 | grep -v '^{"device' | tee $OUT/slice_probe.log
el "lazy-import copy"
mkdir -p /tmp/lazy && cp -r jspec /tmp/lazy/ && ln -sfn $PWD/checkpoints /tmp/lazy/checkpoints
python - <<'PY'
p = "/tmp/lazy/jspec/attention_split.py"
s = open(p).read()
imports = "from jspec.pallas import int2_mosaic\nfrom jspec.pallas.int2_attention import int2_attention\n"
assert imports in s
s = s.replace(imports, "")
head = '    Returns the kernel\'s unmerged split partials: out [B, H, splits, M, D], lse [B, H, splits, M]."""\n'
assert head in s
s = s.replace(head, head + "    from jspec.pallas import int2_mosaic\n    from jspec.pallas.int2_attention import int2_attention\n\n")
open(p, "w").write(s)
PY
el "README warm A/B"
run() {  # $1 tree, $2 label
  s=$(date +%s.%N); (cd $1 && timeout 100 python -m jspec.generate "def fibonacci(n):" --compile-cache /tmp/cc_$2 \
    > $OUT/readme_$2.txt 2>&1); echo "$2 rc=$? wall=$(python -c "print(round($(date +%s.%N) - $s, 2))") $(tail -1 $OUT/readme_$2.txt | grep -o 'compile [0-9.]*s')"
}
export JSPEC_CACHE_DIR=/tmp/jc; run $PWD eager; run /tmp/lazy lazy   # cold: fills each one's caches
for i in 1 2 3 4; do run $PWD eager; run /tmp/lazy lazy; done
el done
