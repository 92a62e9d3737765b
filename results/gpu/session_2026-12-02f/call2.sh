#!/usr/bin/env bash
# Call 2: the 1B routing op, current kernels beside v5 and the table-score group pass, one call; then Nsight Compute of the 1B group kernel.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 330 python3 -W ignore -m benchmarks.bench_routing_op --graph 1 --impls fused_v5 fused_t_g4_sg8 fused_t_g4_sg8_ts --sizes 1B --out $OUT/routing_op_1B.csv > $OUT/routing_op_1B.log 2>&1; echo op rc=$?
grep -E "fwd_bwd|TUNED src_group" $OUT/routing_op_1B.log | cut -c1-220
SECS="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats"
timeout 200 ncu --clock-control none --profile-from-start off -k regex:_src_group_bwd --launch-skip 3 --launch-count 1 $SECS \
    python3 -m benchmarks.ncu_routing 1B fused_t_g4_sg8 > $OUT/ncu_1B_group.txt 2>&1; echo ncu rc=$?
grep -E "TUNED src_group|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Block Size|Grid Size|Eligible|Issued Warp|Dynamic Shared|Executed Ipc|Block Limit|Stall|Compute \(SM\)" $OUT/ncu_1B_group.txt | head -40
