#!/usr/bin/env bash
# Call 2 (warm machine of call 1): the 1B training step: baseline, fused_v7_sg8 + PDL (default),
# fused_v7_sg8_async + PDL, one run (1B caches cold).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt; date -u +%T
date -u +%T
timeout 500 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_v7_sg8_pdl mhar_fused_v7_sg8_async_pdl --repeats 1 --heads 8 --steps 20 --warmup 6 --timeout 250 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error|wall_s" $OUT/training_1B.log | cut -c1-330 | tail -12
date -u +%T
