# Prepared in session 27 for the next session (not run). `bash next_call.sh a|b|c`:
# `a` (~3 min), issue 14's second process: the 8B + draft program's rounds part takes ~0.8 s to deserialize and
#   1.6 s to load (session 27, call 1), and the trace names nothing inside the load but the command buffers. XLA's
#   scoped timers log at VLOG 1 in the files that hold them: a cold child (startup.py --child, Engine.compile into
#   jspec's store), then a warm one with the timers on for the compiler, executable and PJRT files; their lines go to
#   $OUT/warm_vlog.txt (the longest 40 printed).
# `b` (~4 min), issue 16's 1.7x: RoPE's tables per slot once for all layers (model.SLOT_TABLES, step_ab.py
#   --slot-tables) against each layer selecting v's angle itself, alternated, with a profile: does XLA put RoPE back
#   into R_K's reduction (568 -> 536 kernels at B 1)? INT2 only (BF16 KV has no R_K).
# `c` (~5 min), issue 16 and 14: the INT2 commit in groups of 16 layers (2 kernels per step at B 1) against 8 (4:
#   +0.025 ms against one kernel in session 27's profile), alternated; then the 8B + draft cold compile with 16.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:benchmarks
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
case "$1" in
a)
  rm -rf /tmp/c; el "cold child"; timeout 150 python benchmarks/startup.py --child 8b+draft --cache /tmp/c --engine \
    2>/dev/null | tail -1 | cut -c1-300
  el "warm child, timers on"; TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=gpu_compiler=1,gpu_executable=1,compiler=1,\
nvptx_compiler=1,command_buffer_conversion_pass=1,thunk_emitter=1,ir_emitter_unnested=1,buffer_assignment=1,\
pjrt_stream_executor_client=1,se_gpu_pjrt_client=1,stream_executor_executable=1,gpu_aot_compilation_result=1 \
    timeout 100 python benchmarks/startup.py --child 8b+draft --cache /tmp/c --engine 2>$OUT/warm_vlog.txt | tail -1 | \
    cut -c1-300
  wc -l $OUT/warm_vlog.txt
  python - <<'PY'
import os, re
lines = open(os.environ["OUT"] + "/warm_vlog.txt", errors="replace").read().splitlines()
timed = []
for line in lines:  # ScopedLoggingTimer: "<label> ... <n> (ms|s|us)"
    m = re.search(r"([\d.]+)\s*(s|ms|us)\b", line)
    if m and ("took" in line or "time" in line.lower()):
        secs = float(m[1]) * {"s": 1, "ms": 1e-3, "us": 1e-6}[m[2]]
        timed.append((secs, line[-160:]))
for secs, line in sorted(timed, reverse=True)[:40]:
    print(f"{secs:9.4f} s  {line}")
PY
  gzip -9 $OUT/warm_vlog.txt ;;
b)
  CASES=int2:1:131072,bf16:1:131072,int2:8:32768
  ab() { timeout 90 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases $CASES --profile "$2" $3 \
    --out $OUT/step_$1.json 2>&1 | grep "ms/step\|kernels/step"; }
  el "slot tables 1"; ab slot1 int2:1:131072 --slot-tables
  el "default 1"; ab default1 ""
  el "slot tables 2"; ab slot2 "" --slot-tables
  el "default 2"; ab default2 ""
  gzip -9 $OUT/*/*.hlo.txt 2>/dev/null ;;
c)
  CASES=int2:1:131072,int2:8:32768
  ab() { timeout 90 python benchmarks/step_ab.py --tag $1 --jspec-root . --cases $CASES --profile "" $2 \
    --out $OUT/step_$1.json 2>&1 | grep "ms/step"; }
  el "groups of 16, 1"; ab g16a "--commit-group 16"
  el "groups of 8, 1"; ab g8a ""
  el "groups of 16, 2"; ab g16b "--commit-group 16"
  el "groups of 8, 2"; ab g8b ""
  el "cold compile, groups of 16"; timeout 150 python benchmarks/startup.py --engine --cases 8b+draft --no-readme \
    --no-job --commit-group 16 --out $OUT/startup_g16.json 2>&1 | grep "^| 8b+draft" ;;
*) echo "usage: bash next_call.sh a|b|c"; exit 2 ;;
esac
el done
