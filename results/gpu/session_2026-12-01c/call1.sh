#!/usr/bin/env bash
# diagnostics: ncu of the v6 routing kernels at 1B and 350M; memory decomposition at 350M
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
SECS="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
for size in 1B 350M; do
  for k in _route_fwd:60 _src_bwd:60 _stash:30; do
    name=${k%%:*}; skip=${k##*:}
    echo "=== $size $name"
    timeout 150 $NCU --clock-control none --profile-from-start off -k regex:$name --launch-skip $skip --launch-count 1 \
      $SECS python3 -m benchmarks.ncu_routing $size fused > $OUT/ncu_${size}_${name}.txt 2>&1
    echo "rc $?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Block Limit Registers|One or More Eligible|Local Memory|No Eligible|Issued Warp" $OUT/ncu_${size}_${name}.txt | head -20
  done
done
echo "=== memory"
timeout 240 python3 -m benchmarks.memory_step 350M baseline mhar_fused mhar_fused_v5 2>&1 | grep -v "^\[" | tail -45 | tee $OUT/memory.log
