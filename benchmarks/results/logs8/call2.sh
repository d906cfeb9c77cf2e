# Session 8, call 2: issue 19 (head K=4 at batch 1 on INT2 held-out; BF16 edit-style head row), issue 18 (OSCAR
# rotations recalibrated in descending order on the real split, KV quality over 256 validation windows).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
D=/tmp/data18
(nice -n 19 python -m jspec.data --out $D --tokenizer checkpoints/code-target --filter > $OUT/data.log 2>&1; echo "data rc=$?" >> $OUT/data.log) &
el "=== 19a: INT2 held-out, batch 1 over 8 prompts: plain vs head at K=4"
timeout 140 python benchmarks/speculative.py --modes head --kvs int2 --batches 1 --parts sweep --sweep-ks 4 \
  --workloads held_out --budget-s 100 --out $OUT/spec_head_b1_k4_s8.json 2>&1 | grep -v "^{" | tail -3
el "=== 19b: BF16 edit-style, batch 1 over 8 prompts: plain, head auto, head K=4"
timeout 210 python benchmarks/speculative.py --modes head --kvs bf16 --batches 1 --parts auto --workloads edit \
  --budget-s 150 --out $OUT/spec_head_b1_bf16_s8.json 2>&1 | grep -v "^{" | tail -3
wait; tail -2 $OUT/data.log
el "=== 18: calibrate (desc; 131K tokens as round 2, and 524K), then KV quality on 256 windows"
files=$(python -c "
from jspec.data import stdlib_root, corpus_files, is_validation
root = stdlib_root()
print(' '.join(str(root / f) for f in [f for f in corpus_files(root) if not is_validation(f)][::20]))")
timeout 80 python -m jspec.calibrate --model checkpoints/code-target --data $files --tokens 131072 --seq-len 2048 \
  --order desc --out $OUT/rot_desc.safetensors > $OUT/cal_desc.log 2>&1 &
timeout 120 python -m jspec.calibrate --model checkpoints/code-target --data $files --tokens 524288 --seq-len 2048 \
  --order desc --out $OUT/rot_desc4.safetensors > $OUT/cal_desc4.log 2>&1 &
wait; tail -1 $OUT/cal_desc.log $OUT/cal_desc4.log
el "kv_quality"
ex=""; for r in desc desc4; do [ -f $OUT/rot_$r.safetensors ] && ex="$ex $r=$OUT/rot_$r.safetensors"; done
timeout $(( 570 - ($(date +%s) - t0) )) python benchmarks/kv_quality.py --data $D --windows 256 --sr 64,256 --clip on \
  --extra $ex --out $OUT/kv_quality_s8.json > $OUT/kvq.log 2>&1; tail -12 $OUT/kvq.log
el done
