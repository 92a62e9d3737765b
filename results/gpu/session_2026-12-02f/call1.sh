#!/usr/bin/env bash
# Call 1: GPU tests of the table-score group pass (every launch config), then the 1B MHAR step's kernels with fused_v7_sg8_ts.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $OUT/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider "tests/test_fused_routing.py::test_gpu_group_scores_every_launch_config" > $OUT/tests_gpu.log 2>&1; echo tests rc=$?
tail -5 $OUT/tests_gpu.log
timeout 330 python3 -W ignore benchmarks/profile_step.py train 1B mhar_fused_v7_sg8_ts --json $OUT/prof_train_1B_ts.json > $OUT/prof_train_1B_ts.log 2>&1; echo prof rc=$?
grep -E "PROFILE|_kernel" $OUT/prof_train_1B_ts.log | head -30
