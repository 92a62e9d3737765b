#!/usr/bin/env bash
# Call 4: the training step at 100M, baseline and fused_v7_sg8 paired per repeat (the kernels of c4c127d: the group layout stays rows).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 375 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 50 --warmup 6 --repeats 2 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1; echo 100M rc=$?
grep -E '"variant"|SUMMARY' $OUT/training_100M.log | cut -c1-260
