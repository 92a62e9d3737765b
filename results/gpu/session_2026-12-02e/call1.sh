#!/usr/bin/env bash
# 1B training step kernel breakdown, baseline vs fused_v7_sg8 in one process (no CUDA graph so the profiler sees kernels).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; git log -1 --format=%H >> $OUT/gpu.txt; git status --short >> $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $OUT/gpu.txt
timeout 500 python3 -W ignore benchmarks/profile_step.py train 1B baseline mhar_fused_v7_sg8 --json $OUT/prof_train_1B.json > $OUT/prof_train_1B.log 2>&1
echo rc=$?
tail -c 9000 $OUT/prof_train_1B.log
