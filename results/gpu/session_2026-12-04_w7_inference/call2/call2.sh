#!/bin/bash
# w7 GPU call 2
export PYTHONPATH=. PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16 MHAR_ROUTING_AUTOTUNE=0
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri TRITON_CACHE_AUTOTUNING=1
T0=$(date +%s)
el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
el bench
timeout 190 python3 benchmarks/bench_inference.py --sizes 100M 350M 1B --repeats 3 --out $OUT/inference.csv > $OUT/bench.log 2>&1; grep -v -i warn $OUT/bench.log | grep -v "^ " | tail -24
el kernel-off
timeout 40 python3 benchmarks/bench_inference.py --sizes 1B --shapes 8:1024:512 --variants mhar --no-hf --decode-kernel 0 --repeats 3 --out $OUT/inference_kernel0.csv > $OUT/k0.log 2>&1; grep -v -i warn $OUT/k0.log | grep "B=8"
el tests
timeout 95 python3 -m pytest -q -rA tests/test_inference.py -m gpu -p no:cacheprovider > $OUT/tests.log 2>&1; grep -E "bf16 |passed|failed|PASSED|FAILED|Error" $OUT/tests.log | tail -40
el done
