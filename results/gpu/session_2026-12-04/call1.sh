#!/usr/bin/env bash
# Call 1 (cold): GPU tests of the two new kernel choices (MHAR_ROUTING_PARTS=grad, MHAR_ROUTING_STASH=fused), then
# the 350M routing op side by side in one process (default kernels vs both choices), then the 350M training step:
# baseline, fused_v7_sg8 + PDL (the default), fused_v7_sg8 + PDL + both choices, one run.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt; date -u +%T
MHAR_ROUTING_AUTOTUNE=0 timeout 75 python3 -m pytest -q -rf -k "gpu_kernel_choices_deep" tests/test_fused_routing.py > $OUT/tests_deep.log 2>&1; echo pytest rc=$?; tail -3 $OUT/tests_deep.log | cut -c1-300
date -u +%T
MHAR_ROUTING_AUTOTUNE=0 timeout 60 python3 -m pytest -q -rf -x -k "gpu_fused_stash_every_launch_config and 1280" tests/test_fused_routing.py > $OUT/tests_configs.log 2>&1; echo pytest rc=$?; tail -3 $OUT/tests_configs.log | cut -c1-300
date -u +%T
timeout 110 python3 -W ignore -m benchmarks.bench_routing_op --graph 1 --sizes 350M --impls fused_t_g4_sg8_pdl fused_t_g4_sg8_p16_fs_pdl --out $OUT/routing_op_350M.csv > $OUT/routing_op_350M.log 2>&1; echo op rc=$?
grep -E "^\{|GB/s\)" $OUT/routing_op_350M.log | cut -c1-330 | tail -6
date -u +%T
timeout 280 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8_pdl mhar_fused_v7_sg8_p16_fs_pdl --repeats 1 --heads 8 --steps 20 --warmup 6 --timeout 200 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error" $OUT/training_350M.log | cut -c1-330 | tail -8
date -u +%T
