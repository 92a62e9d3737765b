#!/usr/bin/env bash
# Call 1: who launches the unattributed float fill (100M MHAR training step, profiler with stacks); the GPU greedy-decoding test.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 300 python3 -W ignore -m benchmarks.profile_step train 100M mhar_fused_v7_sg8 --stack 'FillFunctor' --json $OUT/prof_train_100M_stack.json > $OUT/prof_train_100M_stack.log 2>&1; echo prof rc=$?
grep -A60 "launch sites" $OUT/prof_train_100M_stack.log | cut -c1-900 | head -60
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bench_inference.py > $OUT/tests_gpu.log 2>&1; echo tests rc=$?
tail -5 $OUT/tests_gpu.log
