#!/bin/bash
# w7 GPU call 1
export PYTHONPATH=. PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16 MHAR_ROUTING_AUTOTUNE=0
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri TRITON_CACHE_AUTOTUNING=1
T0=$(date +%s)
el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
el start; nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
el bench1B-B8
timeout 120 python3 benchmarks/bench_inference.py --sizes 1B --shapes 8:1024:512 --repeats 3 --out $OUT/inf_1B_b8.csv > $OUT/b8.log 2>&1; grep -v -i warn $OUT/b8.log | tail -8
el profile
timeout 40 python3 benchmarks/profile_step.py forward 1B baseline hf --shape 1:2048 > $OUT/prof.log 2>&1; head -50 $OUT/prof.log
el whole
timeout 80 python3 benchmarks/bench_inference.py --sizes 1B --no-hf --compile whole --shapes 8:1024:512 --repeats 2 --out $OUT/inf_1B_whole.csv > $OUT/whole.log 2>&1; grep -v -i warn $OUT/whole.log | tail -6
el bench1B-B1
timeout 60 python3 benchmarks/bench_inference.py --sizes 1B --shapes 1:2048:2048 --repeats 2 --out $OUT/inf_1B_b1.csv > $OUT/b1.log 2>&1; grep -v -i warn $OUT/b1.log | tail -8
el tests
timeout 40 python3 -m pytest -q -x tests/test_inference.py -m gpu -k "mhar] or baseline] or fused" > $OUT/tests.log 2>&1; tail -15 $OUT/tests.log
el done
