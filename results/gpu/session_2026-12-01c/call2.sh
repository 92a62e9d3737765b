#!/usr/bin/env bash
export PYTHONPATH=. PYTHONUNBUFFERED=1
echo "=== tests $(date -u +%T)"
timeout 200 python3 -m pytest -v --tb=short -rfs -m gpu tests/test_fused_routing.py -k "v6_every or v6_deep or (realistic_shapes and v6)" 2>&1 | tee $OUT/tests_gpu.log | grep -E "PASSED|FAILED|ERROR|passed|failed|Error" | tail -20
echo "=== op $(date -u +%T)"
timeout 240 python3 -m benchmarks.bench_routing_op --graph 1 --impls fused fused_v5 --sizes 100M 350M 1B --out $OUT/routing_op.csv 2>&1 | tee $OUT/routing_op.log | tail -12
echo "=== ncu $(date -u +%T)"
SECS="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
for k in _fwd6:60 _src_bwd:60; do
  name=${k%%:*}; skip=${k##*:}
  timeout 100 ncu --clock-control none --profile-from-start off -k regex:$name --launch-skip $skip --launch-count 1 $SECS \
    python3 -m benchmarks.ncu_routing 1B fused > $OUT/ncu_1B_${name}.txt 2>&1
  echo "$name rc $?"; grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Block Size|Grid Size|Eligible|Dynamic Shared" $OUT/ncu_1B_${name}.txt | head -12
done
echo "=== end $(date -u +%T)"
