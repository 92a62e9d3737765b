#!/usr/bin/env bash
export PYTHONPATH=. PYTHONUNBUFFERED=1
summ() { python3 -c "
import csv
for r in csv.DictReader(open('$1')): print(r['size'], r['variant'], r['step_ms'], r['tokens_per_s'], r['peak_mem_gib'], r['thr_ratio'], r['mem_ratio'], r['final_loss'], r['status'])
"; }
echo "=== tests $(date -u +%T)"
T=tests/test_fused_routing.py
MHAR_ROUTING_AUTOTUNE=0 timeout 170 python3 -m pytest -v --tb=long -rfs -p no:randomly "$T::test_gpu_v6_deep" \
  "$T::test_gpu_v6_every_launch_config[1-1280-8]" "$T::test_gpu_v6_every_launch_config[1-1024-8]" \
  "$T::test_gpu_v6_source_groups_deep" > $OUT/tests_gpu.log 2>&1
echo "rc $?"; grep -E "PASSED|FAILED|ERROR|passed|failed|AssertionError|assert err" $OUT/tests_gpu.log | tail -24
echo "=== op $(date -u +%T)"
timeout 170 python3 -m benchmarks.bench_routing_op --graph 1 --impls fused fused_v5 \
  --sizes 100M 350M 1B --out $OUT/routing_op.csv > $OUT/routing_op.log 2>&1
echo "rc $?"; grep -v Warn $OUT/routing_op.log | grep -v wrote | tail -9
echo "=== train 1B $(date -u +%T)"
python3 -m benchmarks.bench_training --sizes 1B --variants baseline mhar_fused --heads 8 --steps 20 --warmup 6 \
  --out $OUT/training_1B.csv > $OUT/training.log 2>&1; echo "rc $?"; summ $OUT/training_1B.csv
echo "=== end $(date -u +%T)"
