#!/usr/bin/env bash
# Next GPU session, call 1 (results/bench/NOTES.md "Next GPU session"): v7 launch configurations, then the op with
# per-loop-length autotuning side by side (v5 included) and a 1B profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
git log -1 --format=%H > $OUT/gpu.txt
MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 10 300 python3 -m pytest -v --tb=short -rfs -m gpu tests/test_fused_routing.py -k "v7_every_launch_config or v7_scores_all_reads" 2>&1 | tee $OUT/tests_gpu.log | grep -E "PASS|FAIL|passed|failed|Error" | tail -20
timeout 200 python3 -m benchmarks.bench_routing_op --graph 1 --impls fused fused_sg8 fused_t_g4_sg8 fused_t_g8_sg8 fused_v5 --sizes 350M 1B --out $OUT/routing_op.csv > $OUT/routing_op.log 2>&1
grep fwd_bwd $OUT/routing_op.log | cut -c1-200
timeout 60 python3 -W ignore benchmarks/profile_step.py op 1B fused_t_g4_sg8 2>&1 | grep -v Warn | head -30 > $OUT/profile_1B.txt; head -12 $OUT/profile_1B.txt
