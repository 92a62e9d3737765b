#!/usr/bin/env bash
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
timeout 150 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1
grep step_ms $OUT/training_100M.log | cut -c1-330
MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 5 80 python3 -m pytest -v --tb=short -rfs tests/test_fused_routing.py -k "source_groups_deep or (model and sg4)" 2>&1 | tee $OUT/tests_gpu.log | grep -E "PASS|FAIL|passed|failed|Error|assert" | tail -20
