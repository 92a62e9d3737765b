export PYTHONPATH=. PYTHONUNBUFFERED=1
SECS="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters"
for cfg in 350M:_src_bwd:20 350M:_fwd6:24 100M:_src_bwd:8 1B:_src_bwd:30; do
  IFS=: read -r size name skip <<< "$cfg"
  timeout 110 ncu --clock-control none --profile-from-start off -k regex:$name --launch-skip $skip --launch-count 1 $SECS \
    python3 -m benchmarks.ncu_routing $size fused > $OUT/ncu_${size}_${name}.txt 2>&1
  echo "$size $name rc $?"; grep -E "TUNED|Duration|DRAM Throughput|L1/TEX Cache|Registers Per|Achieved Occupancy|Theoretical Occ|Block Size|Grid Size|Eligible|Issued Warp|Dynamic Shared|Static Shared|Executed Ipc" $OUT/ncu_${size}_${name}.txt | head -30
done
