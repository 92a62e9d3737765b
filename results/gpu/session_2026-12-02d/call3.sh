#!/usr/bin/env bash
# Next GPU session, call 3: 350M and 100M triples (baseline, fused_v7_sg8, fused_v7_sg8_norm), one run per size.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
for s in 350M 100M; do timeout 290 python3 -W ignore -m benchmarks.bench_training --sizes $s --variants baseline mhar_fused_v7_sg8 mhar_fused_v7_sg8_norm --heads 8 --steps 30 --warmup 6 --out $OUT/training_$s.csv > $OUT/training_$s.log 2>&1; grep '"variant"' $OUT/training_$s.log | cut -c1-200; done
