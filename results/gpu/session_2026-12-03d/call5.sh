#!/usr/bin/env bash
# Call 5 (warm machine and caches of calls 2-4): 1B then 100M training step, baseline and fused_v7_sg8 + PDL (the default), fresh processes each.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
date -u +%T
timeout 185 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_v7_sg8_pdl --repeats 2 --heads 8 --steps 20 --warmup 6 --timeout 120 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error" $OUT/training_1B.log | cut -c1-330 | tail -6
date -u +%T
timeout 105 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_v7_sg8_pdl --repeats 2 --heads 8 --steps 20 --warmup 6 --timeout 100 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error" $OUT/training_100M.log | cut -c1-330 | tail -6
date -u +%T
