#!/usr/bin/env bash
# Call 1: the split source-group pass's GPU tests (every launch configuration of both halves at the 1B and 350M
# widths; the CPU tests of the split pass run on the GPU too), then the 1B routing op side by side in one process:
# fused_t_g4_sg8 + PDL (default), + split group pass, + split with the table's scores.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt; date -u +%T
timeout 170 python3 -m pytest -q -rf -k "split_group" tests/test_fused_routing.py > $OUT/tests_split.log 2>&1; echo pytest rc=$?; tail -4 $OUT/tests_split.log | cut -c1-300
date -u +%T
timeout 200 python3 -W ignore -m benchmarks.bench_routing_op --graph 1 --sizes 1B --impls fused_t_g4_sg8_pdl fused_t_g4_sg8_split_pdl fused_t_g4_sg8_ts_split_pdl --out $OUT/routing_op_1B.csv > $OUT/routing_op_1B.log 2>&1; echo op rc=$?
grep -E "^\{|GB/s\)" $OUT/routing_op_1B.log | cut -c1-330 | tail -8
date -u +%T
