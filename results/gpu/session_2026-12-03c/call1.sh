#!/usr/bin/env bash
# Call 1: PDL launch tests (default path); Nsight Compute of the v7 scoring kernel (1B); the scoring kernel alone
# (bench_score); 100M training step baseline / fused_v7_sg8 + PDL (default) / PDL off, side by side.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt; date -u +%T
timeout 110 python3 -m pytest -q -x -k pdl_launches tests/test_fused_routing.py > $OUT/tests_pdl.log 2>&1; echo pytest rc=$?; tail -3 $OUT/tests_pdl.log
date -u +%T
SECS="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats"
timeout 120 ncu --clock-control none --profile-from-start off -k regex:_score_kernel --launch-skip 4 --launch-count 1 $SECS \
    python3 -m benchmarks.ncu_routing 1B fused_t_g4_sg8 > $OUT/ncu_1B_score.txt 2>&1; echo ncu rc=$?
grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache|Registers Per|Achieved Occupancy|Theoretical Occ|Block Size|Grid Size|Eligible|Issued Warp|Stall|uncoalesced|excessive|sectors" $OUT/ncu_1B_score.txt | cut -c1-250 | head -40
date -u +%T
timeout 60 python3 -m benchmarks.bench_score --sizes 350M 1B > $OUT/bench_score.log 2>&1; echo score rc=$?; tail -4 $OUT/bench_score.log | cut -c1-300
date -u +%T
timeout 200 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_v7_sg8_pdl mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --timeout 170 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1; echo bench rc=$?
grep -E "SUMMARY|error|Error|wall_s" $OUT/training_100M.log | cut -c1-400 | tail -12
date -u +%T
ls -la $OUT
