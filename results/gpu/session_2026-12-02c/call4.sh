#!/usr/bin/env bash
# GPU session 2026-12-02c, call 4 (given inline to the device tool): a second pair per size (warm caches, 30 steps).
export PYTHONUNBUFFERED=1 PYTHONPATH=.; git log -1 --format=%H > $OUT/gpu.txt
for s in 100M 350M 1B; do timeout 125 python3 -W ignore -m benchmarks.bench_training --sizes $s --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 30 --warmup 6 --out $OUT/training_rep_$s.csv > $OUT/training_rep_$s.log 2>&1; grep '"variant"' $OUT/training_rep_$s.log | cut -c1-190; done
