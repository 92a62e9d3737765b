#!/usr/bin/env bash
# Call 2: where does v7 at 1B fault (CUDA_LAUNCH_BLOCKING); then the 1B / 100M training pairs.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
for cfg in "64 8 1280 73 0" "16 4 1280 73 0" "64 8 1280 60 0" "64 4 1280 73 0" "32 4 1280 73 0"; do
  CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 -W ignore .gpucmd/diag_score.py $cfg 2>&1 | grep -E "score|Error" | tail -2
done 2>&1 | tee $OUT/diag_score.log
CUDA_LAUNCH_BLOCKING=1 MHAR_ROUTING_AUTOTUNE=0 timeout 100 python3 -m benchmarks.bench_routing_op --graph 0 --impls fused_t_g4_sg8 --sizes 1B --out $OUT/diag_op.csv > $OUT/diag_op.log 2>&1
grep -E "fwd_bwd|Error|_kernel|File .*mhar" $OUT/diag_op.log | tail -8
timeout 330 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1
tail -4 $OUT/training_1B.log
