#!/usr/bin/env bash
# Call 3: the scoring-kernel fix on the GPU (test at the presets' read counts), then 100M and 1B training pairs
# with fused_v7_sg8.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 5 75 python3 -m pytest -v --tb=short -rfs -m gpu tests/test_fused_routing.py -k "v7_scores_all_reads" 2>&1 | tee $OUT/tests_gpu.log | grep -E "PASS|FAIL|passed|failed|Error" | tail -12
timeout 140 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1
grep '"variant"' $OUT/training_100M.log | cut -c1-260
timeout 310 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1
grep '"variant"' $OUT/training_1B.log | cut -c1-260; tail -3 $OUT/training_1B.log | cut -c1-300
