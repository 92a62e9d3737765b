#!/usr/bin/env bash
# Call 2: 350M baseline, fused_v7_sg8, fused_v7_sg8 + PDL side by side, two repeats (one process each).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt
date -u +%T
timeout 480 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8 mhar_fused_v7_sg8_pdl --heads 8 --steps 20 --warmup 6 --repeats 2 --timeout 170 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error|wall_s" $OUT/training_350M.log | cut -c1-400 | tail -12
date -u +%T
ls -la $OUT
