#!/usr/bin/env bash
# Next GPU session, call 2: the 1B training step, baseline / fused_v7_sg8 / fused_v7_sg8_norm in one run.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
timeout 560 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_v7_sg8 mhar_fused_v7_sg8_norm --heads 8 --steps 30 --warmup 6 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1
grep '"variant"' $OUT/training_1B.log | cut -c1-200
