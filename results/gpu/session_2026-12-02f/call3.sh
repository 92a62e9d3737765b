#!/usr/bin/env bash
# Call 3: routing op 1B and 350M, the source-group kernel's two layouts side by side (rows = current default, cols = new); GPU tests of the cols kernel at 1B width.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
for size in 1B 350M; do
for lay in rows cols; do
MHAR_GROUP_LAYOUT=$lay timeout 150 python3 -W ignore -m benchmarks.bench_routing_op --graph 1 --impls fused_t_g4_sg8 --sizes $size --out $OUT/op_${size}_$lay.csv > $OUT/op_${size}_$lay.log 2>&1; echo $size $lay rc=$?
grep -E "fwd_bwd|TUNED src_group" $OUT/op_${size}_$lay.log | cut -c1-230
done; done
timeout 170 python3 -m pytest -q -p no:cacheprovider "tests/test_fused_routing.py::test_gpu_group_cols_every_launch_config" -k "1280" > $OUT/tests_gpu.log 2>&1; echo tests rc=$?
tail -5 $OUT/tests_gpu.log
