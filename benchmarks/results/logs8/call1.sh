# Session 8, call 1: issue 19 closing measurements (head at batch 1: INT2 held-out K=4 + auto + 8B head step;
# BF16 edit-style; then batch 8: head/model/ngram auto, INT2).
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
el "=== b: INT2 held-out, batch 1 over 8 prompts: plain, head auto, head K=4; then the 8B head step"
timeout 250 python benchmarks/speculative.py --modes head --kvs int2 --batches 1 --parts auto --workloads held_out \
  --llama8b --budget-s 150 --out $OUT/spec_head_b1_int2_s8.json 2>&1 | grep -v "^{" | tail -5
el "=== a: BF16 edit-style, batch 1 over 8 prompts: plain, head auto, head K=4"
timeout 110 python benchmarks/speculative.py --modes head --kvs bf16 --batches 1 --parts auto --workloads edit \
  --budget-s 60 --out $OUT/spec_head_b1_bf16_s8.json 2>&1 | grep -v "^{" | tail -4
el "=== c: batch 8, INT2: plain, head, model, ngram at auto"
timeout $(( 575 - ($(date +%s) - t0) )) python benchmarks/speculative.py --modes head,model,ngram --kvs int2 --batches 8 \
  --parts auto --budget-s 150 --out $OUT/spec_b8_s8.json 2>&1 | grep -v "^{" | tail -5
el "done"
