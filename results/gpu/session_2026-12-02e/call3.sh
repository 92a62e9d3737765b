#!/usr/bin/env bash
# Call B: the training step (what python -m mhar.train runs), baseline and fused_v7_sg8 paired per repeat: 1B then 350M.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 370 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 50 --warmup 6 --repeats 2 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1; echo 1B rc=$?
grep -E '"variant"|SUMMARY' $OUT/training_1B.log | cut -c1-260
timeout 215 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 50 --warmup 6 --repeats 2 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1; echo 350M rc=$?
grep -E '"variant"|SUMMARY' $OUT/training_350M.log | cut -c1-260
