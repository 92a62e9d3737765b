#!/usr/bin/env bash
# Next GPU session, call 1: the fused pre-norm (fused_v7_sg8_norm) kernels and model on the GPU (every launch configuration).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 10 300 python3 -m pytest -v --tb=short -rfs tests/test_fused_routing.py -k "prenorm or (model_fused_matches_eager and norm) or inference_matches" 2>&1 | tee $OUT/tests_gpu.log | grep -E "PASS|FAIL|passed|failed|Error" | tail -30
timeout -s INT -k 10 120 python3 -m pytest -q --tb=short -rfs -m gpu tests/test_step.py tests/test_bench_inference.py -k "cuda_graph_replay or generation" 2>&1 | tee -a $OUT/tests_gpu.log | tail -5
