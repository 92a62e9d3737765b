#!/usr/bin/env bash
# Call 4: the product path at 350M: `python -m mhar.train` rows only (--trainer-only), baseline and fused_v7_sg8, one call.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 480 python3 -W ignore -m benchmarks.bench_training --sizes 350M --variants baseline mhar_fused_v7_sg8 --heads 8 --trainer-steps 150 --trainer-only --timeout 235 --out $OUT/training_350M_trainer.csv > $OUT/training_350M_trainer.log 2>&1; echo bench rc=$?
grep SUMMARY $OUT/training_350M_trainer.log
python3 - <<'PY'
import csv, os
for r in csv.DictReader(open(os.environ["OUT"] + "/training_350M_trainer.csv")):
    print(r.get("mode"), r.get("variant"), r.get("step_ms"), r.get("tokens_per_s"), r.get("thr_ratio"), r.get("peak_mem_gib"), r.get("mem_ratio"), r.get("wall_s"), r.get("status"))
PY
