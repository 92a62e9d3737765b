#!/usr/bin/env bash
# Call 3: the all-heads scoring kernel's GPU tests (every launch configuration; both kernels at the presets'
# shapes), the scoring kernels alone side by side (bench_score), then the 350M training step: baseline,
# fused_v7_sg8 + PDL (default), the same with MHAR_ROUTING_SCORE=heads, one process each.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCHINDUCTOR_COMPILE_THREADS=16 TRITON_CACHE_AUTOTUNING=1
{ cat .gpucmd/commit.txt; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt; date -u +%T
timeout 120 python3 -m pytest -q -rf -k "score_heads_every_launch_config or v7_scores_all_reads" tests/test_fused_routing.py > $OUT/tests_score.log 2>&1; echo pytest rc=$?; tail -4 $OUT/tests_score.log | cut -c1-300
date -u +%T
timeout 70 python3 -m benchmarks.bench_score --sizes 350M 1B --kernels head heads > $OUT/bench_score.log 2>&1; echo score rc=$?; cut -c1-330 $OUT/bench_score.log | tail -6
date -u +%T
timeout 330 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8_pdl mhar_fused_v7_sg8_heads_pdl --heads 8 --steps 20 --warmup 6 --timeout 200 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1; echo bench rc=$?
grep -E "^\{|error|Error" $OUT/training_350M.log | cut -c1-170 | tail -8
date -u +%T
