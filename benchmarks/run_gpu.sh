#!/usr/bin/env bash
# GPU record of the fused routing work: tests at realistic shapes, routing-op and training benchmarks.
# Usage (repo root, on the GPU machine):  OUT=dir bash benchmarks/run_gpu.sh [tests] [op] [op:IMPLS:MODES[:TAG]]
#                                              [train:SIZES:VARIANTS[:TAG]]
#   e.g. bash benchmarks/run_gpu.sh tests op "train:100M 350M 1B:baseline mhar_fused_sub mhar_compile_sub:final"
#   OP_GRAPH=1: op stages time CUDA-graph replays (kernel time only)
#   (one (size, variant) takes ~1-2 min, mostly torch.compile; a run has at most 10 min)
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
for stage in "$@"; do
  case "$stage" in
    tests)
      MHAR_ROUTING_AUTOTUNE=0 python3 -m pytest -q -rs tests/test_fused_routing.py 2>&1 | tee "$OUT/tests_gpu.log" ;;
    op)
      python3 benchmarks/bench_routing_op.py --out "$OUT/routing_op.csv" 2>&1 | tee "$OUT/routing_op.log" ;;
    op:*)  # op:IMPLS:MODES[:TAG]
      IFS=: read -r _ impls modes tag <<< "$stage"
      python3 benchmarks/bench_routing_op.py --graph ${OP_GRAPH:-0} --impls $impls --modes $modes --out "$OUT/routing_op${tag:+_$tag}.csv" \
        2>&1 | tee -a "$OUT/routing_op.log" ;;
    train:*)
      IFS=: read -r _ sizes variants tag <<< "$stage"
      python3 -m benchmarks.bench_training --sizes $sizes --variants $variants --heads 8 \
        --out "$OUT/training${tag:+_$tag}_${sizes// /-}.csv" 2>&1 | tee -a "$OUT/training.log" ;;
  esac
done
