#!/usr/bin/env bash
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt
MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 10 170 python3 -m pytest -v --tb=short -rfs -m gpu tests/test_fused_routing.py -k "v7_deep or v6_deep or realistic_shapes" 2>&1 | tee $OUT/tests_gpu.log | grep -E "PASS|FAIL|passed|failed|Error" | tail -30
timeout 200 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused --heads 8 --steps 20 --warmup 6 --out $OUT/training_100M.csv > $OUT/training_100M.log 2>&1
tail -4 $OUT/training_100M.log
timeout 90 python3 -m benchmarks.bench_routing_op --graph 1 --impls fused fused_t_g8 --sizes 350M --out $OUT/routing_op.csv > $OUT/routing_op.log 2>&1
tail -4 $OUT/routing_op.log
timeout 60 python3 -W ignore benchmarks/profile_step.py op 350M fused_t_g8 2>&1 | grep -v Warn | head -45 > $OUT/profile_350M_t_g8.txt
head -25 $OUT/profile_350M_t_g8.txt
