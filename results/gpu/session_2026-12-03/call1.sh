#!/usr/bin/env bash
# Call 1: GPU tests of PDL / side-stream / graph replay; 1B training step side by side: baseline, fused_v7_sg8, _overlap.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt
date -u +%T
MHAR_ROUTING_AUTOTUNE=0 TRITON_CACHE_AUTOTUNING=0 timeout -s INT -k 10 100 python3 -m pytest -v --tb=short -rfs -k 'pdl or side_stream or graph_replay' tests/test_fused_routing.py > $OUT/tests_gpu.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/tests_gpu.log | tail -25
date -u +%T
timeout 450 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_v7_sg8 mhar_fused_v7_sg8_overlap --heads 8 --steps 20 --warmup 6 --timeout 220 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error|wall_s" $OUT/training_1B.log | cut -c1-400 | tail -12
date -u +%T
tar czf $OUT/gpucache.tgz -C .gpucache . 2>/dev/null; ls -la $OUT
