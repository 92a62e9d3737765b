#!/usr/bin/env bash
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 10 110 python3 -m pytest -v --tb=short -rfs tests/test_fused_routing.py -k "source_group" 2>&1 | tee $OUT/tests_gpu.log | grep -E "PASS|FAIL|passed|failed|Error|assert" | tail -30
timeout 250 python3 -m benchmarks.bench_routing_op --graph 1 --impls fused fused_sg8 fused_t_g8_sg8 fused_sg4 --sizes 350M 1B --out $OUT/routing_op.csv > $OUT/routing_op.log 2>&1
grep "fwd_bwd" $OUT/routing_op.log | cut -c1-220
timeout 50 python3 -W ignore benchmarks/profile_step.py op 350M fused_sg8 2>&1 | grep -v Warn | head -30 > $OUT/profile_350M_sg8.txt
head -14 $OUT/profile_350M_sg8.txt
timeout 170 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_sg8 --heads 8 --steps 20 --warmup 6 --out $OUT/training_350M.csv > $OUT/training_350M.log 2>&1
grep step_ms $OUT/training_350M.log | cut -c1-400
