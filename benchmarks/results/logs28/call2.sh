# (The kernel store this call measured, programs.compiled_together keeping each part's Mosaic kernels alone in an
# entry read first, was taken out after it: the kernel builds in ~6 ms, so there was nothing to hide. NOTES, session 28.)
# Session 28, call 2 (issue 14's second process): the Mosaic GPU kernels kept in the store and loaded first
# (this tree) against HEAD a25b021 (.before/prev), and the Triton path (no Mosaic kernel) in this tree. Each:
# a cold child (Engine.compile fills the store), then warm children (compile_s = Engine.compile from the store).
# One warm child per tree with jaxlib's Mosaic custom-call log on (when each kernel is built; $OUT/vlog_*.txt.gz).
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
child() {  # root cache-dir [startup args...]
  PYTHONPATH=$1:benchmarks timeout 150 python benchmarks/startup.py --child 8b+draft --cache $2 --engine "${@:3}" \
    2>>$OUT/stderr_$(basename $2).txt | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); \
print({k: round(d[k], 2) for k in ('import_s', 'load_s', 'compile_s', 'run_s')}, d['attn'])"
}
vlog() {  # root cache-dir tag
  TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=custom_call=5,gpu_aot_compilation_result=1 PYTHONPATH=$1:benchmarks \
    timeout 150 python benchmarks/startup.py --child 8b+draft --cache $2 --engine 2>$OUT/vlog_$3.txt | tail -1 | \
    python -c "import json,sys; d=json.loads(sys.stdin.read()); print('vlog', {k: round(d[k], 2) for k in ('load_s', 'compile_s', 'run_s')})"
  grep -E "LoadExecutable|Mosaic|mosaic|RunAsync for jit_draft_prefill" $OUT/vlog_$3.txt | grep -v "Finish" | cut -c1-170 | head -20
  gzip -9 $OUT/vlog_$3.txt
}
for round in 1 2; do
  for tree in prev new; do
    root=$([ $tree = prev ] && echo .before/prev || echo .)
    [ $round = 1 ] && { el "$tree cold"; child $root /tmp/$tree; ls /tmp/$tree/jspec-programs | wc -l; }
    el "$tree warm $round"; child $root /tmp/$tree
  done
done
el "prev warm, log on"; vlog .before/prev /tmp/prev prev
el "new warm, log on"; vlog . /tmp/new new
el "triton cold"; child . /tmp/tri --attn triton
for i in 1 2; do el "triton warm $i"; child . /tmp/tri --attn triton; done
el "new warm 3"; child . /tmp/new
el done
