#!/usr/bin/env bash
# GPU session 2026-12-02c, call 3 (given inline to the device tool): training pairs 1B and 350M, fused_v7_sg8.
export PYTHONUNBUFFERED=1 PYTHONPATH=.; git log -1 --format=%H > $OUT/gpu.txt
timeout 290 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1
grep '"variant"' $OUT/training_1B.log | cut -c1-200
timeout 260 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1
grep '"variant"' $OUT/training_350M.log | cut -c1-200
