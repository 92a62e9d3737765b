#!/usr/bin/env bash
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $OUT/gpu.txt
timeout 530 python3 -W ignore -m benchmarks.bench_routing_op --graph 1 --impls fused fused_t_g4 fused_t_g8 fused_t fused_v5 \
  --sizes 350M 1B 100M --out $OUT/routing_op.csv 2>&1 | tee $OUT/routing_op.log | grep -v Warn | tail -30
