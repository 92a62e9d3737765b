#!/usr/bin/env bash
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/gpu.txt
echo "=== tests $(date -u +%T)"
MHAR_ROUTING_AUTOTUNE=0 timeout 210 python3 -m pytest -v --tb=short -rfs -m gpu tests/test_fused_routing.py \
  -k "source_groups_deep or every_launch_config or v6_prefix_sharing_realistic or v6_deep" > $OUT/tests_gpu.log 2>&1
echo "rc $?"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/tests_gpu.log | tail -20
echo "=== op $(date -u +%T)"
timeout 340 python3 -m benchmarks.bench_routing_op --graph 1 --impls fused fused_sg4 fused_g8_sg4 fused_v5 \
  --sizes 100M 350M 1B --out $OUT/routing_op.csv > $OUT/routing_op.log 2>&1
echo "rc $?"; grep -v Warn $OUT/routing_op.log | tail -20
echo "=== end $(date -u +%T)"
