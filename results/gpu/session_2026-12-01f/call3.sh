#!/usr/bin/env bash
export PYTHONUNBUFFERED=1 PYTHONPATH=.
for s in 350M 1B; do
timeout 80 python3 -W ignore benchmarks/profile_step.py op $s fused_t_g8 2>&1 | grep -v Warn | head -45 > $OUT/profile_${s}_t_g8.txt
head -30 $OUT/profile_${s}_t_g8.txt
done
MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 10 130 python3 -m pytest -v --tb=short -rfs -m gpu tests/test_fused_routing.py -k "v7" 2>&1 | tee $OUT/tests_gpu.log | grep -E "PASS|FAIL|passed|failed|Error" | tail -20
timeout 240 python3 -W ignore -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused --heads 8 --steps 20 --warmup 6 --out $OUT/training_1B.csv > $OUT/training_1B.log 2>&1
tail -5 $OUT/training_1B.log
