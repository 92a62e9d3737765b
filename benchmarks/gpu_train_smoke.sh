#!/usr/bin/env bash
# GPU training smoke test (one H200): baseline vs MHAR (eager routing) at the paper's 100M shapes,
# seq 2048, microbatch 8, bf16, vocab 151936, on a synthetic token stream (no data files, no hub).
# Usage (repo root):  OUT=/some/dir bash benchmarks/gpu_train_smoke.sh [--steps 200] [key=value ...]
# Prints tokens/s and peak memory; writes $OUT/gpu_train_smoke.json and $OUT/runs/<variant>/.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output directory}"
PY="${PYTHON:-python}"
"$PY" -c "import torch, numpy, yaml, tqdm" 2>/dev/null || {
  echo "error: needs torch, numpy, pyyaml, tqdm in $PY (pip install pyyaml tqdm numpy)" >&2; exit 2; }
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
exec "$PY" benchmarks/gpu_train_smoke.py --out "$OUT" "$@"
