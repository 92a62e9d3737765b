#!/usr/bin/env bash
# Next GPU session, call 2: training pairs (one run per size).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
timeout 330 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_sg8 mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1
grep '"variant"' $OUT/training_1B.log | cut -c1-240
timeout 250 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1
grep '"variant"' $OUT/training_100M.log | cut -c1-240
