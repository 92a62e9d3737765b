#!/usr/bin/env bash
# Call C: 350M training step, baseline + fused_v7_sg8 in one run (kernels of d64015e; the autotune candidates reverted).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; git diff --stat HEAD >> $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 320 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 60 --warmup 6 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1; echo 350M rc=$?
grep -E '"variant"|SUMMARY' $OUT/training_350M.log | cut -c1-300
