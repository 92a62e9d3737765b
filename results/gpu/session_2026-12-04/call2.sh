#!/usr/bin/env bash
# Call 2 (call 1's warm machine and caches): the 350M routing op side by side in one process, both kernel choices
# first, then the default kernels (the one-line command of the device call, unchanged).
export PYTHONUNBUFFERED=1 PYTHONPATH=. TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TRITON_CACHE_AUTOTUNING=1; date -u +%T; timeout 115 python3 -W ignore -m benchmarks.bench_routing_op --graph 1 --sizes 350M --impls fused_t_g4_sg8_p16_fs_pdl fused_t_g4_sg8_pdl --out $OUT/routing_op_350M.csv > $OUT/routing_op_350M.log 2>&1; echo op rc=$?; grep -E "^\{" $OUT/routing_op_350M.log | cut -c1-330; date -u +%T
