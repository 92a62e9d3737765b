#!/usr/bin/env bash
export PYTHONPATH=. PYTHONUNBUFFERED=1
echo "=== tests $(date -u +%T)"
timeout 100 python3 -m pytest -v --tb=short -rfs -m gpu tests/test_fused_routing.py -k "v6_every and 1280" 2>&1 | tee $OUT/tests_gpu_call3.log | grep -E "PASSED|FAILED|ERROR|passed|failed|Error" | tail -5
echo "=== train $(date -u +%T)"
python3 -m benchmarks.bench_training --sizes 350M 1B --variants baseline mhar_fused --heads 8 --steps 20 --warmup 6 \
  --out $OUT/training_350M-1B.csv > $OUT/training_call3.log 2>&1; echo "rc $?"
python3 -c "
import csv,sys
for r in csv.DictReader(open('$OUT/training_350M-1B.csv')): print(r['size'], r['variant'], r['step_ms'], r['tokens_per_s'], r['peak_mem_gib'], r['thr_ratio'], r['mem_ratio'], r['final_loss'], r['status'])
"
echo "=== memory $(date -u +%T)"
timeout 170 python3 -m benchmarks.memory_step 350M baseline mhar_fused --graph 2>&1 | grep -v "^\[" | tee $OUT/memory_graph_350M.log | tail -34
echo "=== end $(date -u +%T)"
