#!/usr/bin/env bash
# Call 2 (warm machine of call 1): 100M training step, baseline and fused_v7_sg8 + PDL (the default), two repeats (fresh processes each).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
date -u +%T
timeout 370 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_v7_sg8_pdl --repeats 2 --heads 8 --steps 20 --warmup 6 --timeout 200 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error|wall_s" $OUT/training_100M.log | cut -c1-330 | tail -12
date -u +%T
