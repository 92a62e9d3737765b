#!/usr/bin/env bash
# Call 2: the product path at 100M: TrainStep rows (bench_training) and `python -m mhar.train` rows (--trainer-steps), baseline and fused_v7_sg8, one call.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
cat .gpucmd/commit.txt > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
timeout 540 python3 -W ignore -m benchmarks.bench_training --sizes 100M --variants baseline mhar_fused_v7_sg8 --heads 8 --steps 50 --warmup 6 --trainer-steps 150 --timeout 260 --out $OUT/training_100M_trainer.csv > $OUT/training_100M_trainer.log 2>&1; echo bench rc=$?
grep -vE "^\s*$" $OUT/training_100M_trainer.log | grep -iE "row|ratio|tok|error|SUMMARY" | cut -c1-300 | tail -20
python3 - <<'PY'
import csv, os
for r in csv.DictReader(open(os.environ["OUT"] + "/training_100M_trainer.csv")):
    print(r.get("mode"), r.get("variant"), r.get("step_ms"), r.get("tokens_per_s"), r.get("thr_ratio"), r.get("peak_mem_gib"), r.get("mem_ratio"), r.get("wall_s"), r.get("status"))
PY
