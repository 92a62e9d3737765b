#!/usr/bin/env bash
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 265 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1
grep step_ms $OUT/training_350M.log | cut -c1-330
timeout 240 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1
grep step_ms $OUT/training_100M.log | cut -c1-330
