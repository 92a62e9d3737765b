#!/usr/bin/env bash
export PYTHONPATH=. PYTHONUNBUFFERED=1
summ() { python3 -c "
import csv
for r in csv.DictReader(open('$1')): print(r['size'], r['variant'], r['step_ms'], r['tokens_per_s'], r['peak_mem_gib'], r['thr_ratio'], r['mem_ratio'], r['final_loss'], r['status'])
"; }
echo "=== train 100M $(date -u +%T)"
python3 -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused --heads 8 --steps 20 --warmup 6 \
  --out $OUT/training_100M.csv > $OUT/training_call4.log 2>&1; echo "rc $?"; summ $OUT/training_100M.csv
echo "=== train 350M mhar $(date -u +%T)"
python3 -m benchmarks.bench_training --sizes 350M --variants mhar_fused --heads 8 --steps 20 --warmup 6 \
  --out $OUT/training_350M_mhar.csv >> $OUT/training_call4.log 2>&1; echo "rc $?"; summ $OUT/training_350M_mhar.csv
echo "=== memory $(date -u +%T)"
timeout 45 python3 -m benchmarks.memory_step 350M mhar_fused --graph 2>&1 | grep -v "^\[" | grep -v Warn | tee $OUT/memory_graph_350M_fix.log | head -12
echo "=== end $(date -u +%T)"
