#!/usr/bin/env bash
# Call 1 (cold): GPU tests of the side-stream paths with PDL on (the default on sm_90+ since 2026-12-03b; these
# tests last ran before that); then the 350M
# training step: baseline, fused_v7_sg8 + PDL (default), fused_v7_sg8_async + PDL, one run.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt; date -u +%T
timeout 150 python3 -m pytest -q -rf -k "side_stream or (cuda_graph_replay and async) or pdl_launches" tests/test_fused_routing.py > $OUT/tests.log 2>&1; echo pytest rc=$?; tail -5 $OUT/tests.log | cut -c1-300
date -u +%T
timeout 410 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8_pdl mhar_fused_v7_sg8_async_pdl --repeats 1 --heads 8 --steps 20 --warmup 6 --timeout 250 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error|wall_s" $OUT/training_350M.log | cut -c1-330 | tail -12
date -u +%T
