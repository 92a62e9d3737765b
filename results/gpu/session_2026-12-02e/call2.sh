#!/usr/bin/env bash
# Call A: GPU tests of the new launch configurations, then the 1B MHAR step's kernel breakdown (new autotuning).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 210 python3 -m pytest -q -p no:cacheprovider "tests/test_fused_routing.py::test_gpu_score_every_launch_config" "tests/test_fused_routing.py::test_gpu_v6_every_launch_config[8-1280-8]" > $OUT/tests_gpu.log 2>&1; echo tests rc=$?
tail -4 $OUT/tests_gpu.log
timeout 300 python3 -W ignore benchmarks/profile_step.py train 1B mhar_fused_v7_sg8 --json $OUT/prof_train_1B_new.json > $OUT/prof_train_1B_new.log 2>&1; echo prof rc=$?
grep -E "PROFILE|_kernel" $OUT/prof_train_1B_new.log | head -24
