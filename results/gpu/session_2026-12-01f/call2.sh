#!/usr/bin/env bash
export PYTHONUNBUFFERED=1
timeout 100 python3 -W ignore benchmarks/profile_step.py op 350M fused_t_g8 2>&1 | grep -v Warn | head -40 > $OUT/profile_350M_t_g8.txt
cat $OUT/profile_350M_t_g8.txt | head -30
timeout 400 python3 -W ignore -m benchmarks.bench_routing_op --graph 1 --impls fused fused_t_g8 fused_t_g4 \
  --sizes 350M 1B 100M --out $OUT/routing_op.csv 2>&1 | tee $OUT/routing_op.log | grep -v Warn | grep "{" | cut -c1-200
