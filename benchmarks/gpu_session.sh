#!/usr/bin/env bash
# One GPU session in stages (repo root of the GPU machine; each stage appends to $OUT), e.g.
#   OUT=dir bash benchmarks/gpu_session.sh setup tests op "train:100M 1B:baseline mhar_fused:40" infer pack
# Stages
#   setup                     install carried wheels (.whl/) into /tmp/site; print versions
#   tests                     the GPU-marked tests, then the others, of the routing kernels, step, generation
#                             (MHAR_ROUTING_AUTOTUNE=0; each half capped at $TESTS_SECONDS, default 240)
#   op[:SIZES[:IMPLS]]        bench_routing_op.py (default impls: eager fused), capped at $OP_SECONDS (330)
#   train:SIZES:VARIANTS[:N]  bench_training.py (variants baseline, mhar_<impl>, mhar_fused_nopdl), then N trainer steps
#   trainer:SIZES:VARIANTS:N  bench_training.py --trainer-only
#   infer                     bench_inference.py
#   memory:SIZE:VARIANTS      memory_step.py --graph
#   workflow:TARGET:SECONDS   snakemake --configfile config/gpu_small.yaml TARGET (bgworkflow: in the background;
#                             wait: join it); dryrun: snakemake -n all; summary: snakemake --summary all
#   pytest:ARGS               python -m pytest ARGS, appended to tests_gpu.log
#   pack / packcache          the workflow's small records -> $OUT/gpu_small.tgz / the compile caches (.gpucache) ->
#                             $OUT/gpucache.tgz if at most $CACHE_MB (15) MiB (carry .gpucache to start warm)
# Data for the workflow: $MHAR_DATA_DIR (default .gpudata/data when present).
set -o pipefail
export PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
# (exported only when the folder is there: the trainer refuses a data directory that does not exist)
if [ -z "${MHAR_DATA_DIR:-}" ] && [ -d .gpudata/data ]; then export MHAR_DATA_DIR=$PWD/.gpudata/data; fi
export PATH="/tmp/site/bin:$PATH"
# compile caches in the repository's .gpucache/ (git-ignored; see packcache): a carried one starts warm
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton
# Triton keeps each autotuning result in TRITON_CACHE_DIR: a later process with the same kernels skips the search
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
OUT=${OUT:-results/gpu/session}
mkdir -p "$OUT"
SMK=(python3 -m snakemake --configfile config/gpu_small.yaml --profile profiles/local --resources nvidia_gpu=${GPU_JOBS:-4}
     --cores 16 --scheduler greedy)
for stage in "$@"; do
  echo "=== $(date -u +%H:%M:%S) stage $stage" | tee -a "$OUT/session.log"
  case "$stage" in
    setup)
      if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
          2>&1 | tail -3
      fi
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
      python3 -c "import snakemake, lm_eval, datasets; print('snakemake', snakemake.__version__, 'lm_eval', lm_eval.__version__, 'datasets', datasets.__version__)" 2>&1 | tail -1 | tee -a "$OUT/gpu.txt" ;;
    tests)
      # the GPU-marked tests first (realistic shapes, graph replay, trainer), then the small-shape kernel tests
      MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 15 "${TESTS_SECONDS:-240}" python3 -m pytest -v --tb=short -rfs -m gpu \
        tests/model/test_fused_routing.py tests/model/test_routing.py tests/training/test_step.py tests/model/test_generate.py \
        tests/benchmarks/test_bench_inference.py 2>&1 | tee "$OUT/tests_gpu.log" | grep -E "FAILED|ERROR|passed|failed|Error" | tail -15
      MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 15 "${TESTS_SECONDS:-240}" python3 -m pytest -v --tb=short -rfs -m "not gpu" \
        tests/model/test_fused_routing.py tests/model/test_routing.py tests/training/test_step.py tests/model/test_generate.py \
        tests/benchmarks/test_bench_inference.py 2>&1 | tee -a "$OUT/tests_gpu.log" | grep -E "FAILED|ERROR|passed|failed|Error" | tail -15 ;;
    op|op:*)
      IFS=: read -r _ sizes impls <<< "$stage"
      timeout "${OP_SECONDS:-330}" python3 -m benchmarks.bench_routing_op --graph 1 --impls ${impls:-eager fused} \
        --sizes ${sizes:-100M 350M 1B} --out "$OUT/routing_op.csv" --append 2>&1 | tee "$OUT/routing_op.log" | tail -20 ;;
    train:*)
      IFS=: read -r _ sizes variants nsteps <<< "$stage"
      python3 -m benchmarks.bench_training --sizes $sizes --variants $variants --heads 8 --steps 20 --warmup 6 \
        --trainer-steps "${nsteps:-0}" --out "$OUT/training_${sizes// /-}.csv" --append 2>&1 | tee -a "$OUT/training.log" \
        | grep -v "^\[mhar.train\]" | tail -20 ;;
    trainer:*)
      IFS=: read -r _ sizes variants nsteps <<< "$stage"
      python3 -m benchmarks.bench_training --sizes $sizes --variants $variants --heads 8 --trainer-only \
        --trainer-steps "$nsteps" --out "$OUT/trainer_${sizes// /-}.csv" --append 2>&1 | tee -a "$OUT/training.log" \
        | grep -v "^\[mhar.train\]" | tail -20 ;;
    memory:*)
      IFS=: read -r _ size variants <<< "$stage"
      timeout 240 python3 -m benchmarks.memory_step $size $variants --graph 2>&1 | tee -a "$OUT/memory.log" | grep -v "^\[" | tail -30 ;;
    infer)
      timeout 90 python3 -m benchmarks.bench_inference --out "$OUT/inference.csv" --append 2>&1 | tee "$OUT/inference.log" | tail -12 ;;
    workflow:*)
      IFS=: read -r _ target secs <<< "$stage"
      "${SMK[@]}" --unlock "$target" > /dev/null 2>&1
      timeout "${secs:-540}" "${SMK[@]}" --keep-going "$target" > "$OUT/workflow_$target.log" 2>&1
      echo "snakemake exit $?"; grep -E "steps \([0-9]+%\) done|Error|error:" "$OUT/workflow_$target.log" | tail -8 ;;
    bgworkflow:*)
      IFS=: read -r _ target secs <<< "$stage"
      "${SMK[@]}" --unlock "$target" > /dev/null 2>&1
      (timeout "${secs:-540}" "${SMK[@]}" --keep-going "$target" > "$OUT/workflow_$target.log" 2>&1
       echo "background snakemake exit $?" | tee -a "$OUT/session.log" > "$OUT/bgworkflow.rc") &
      BG=$! ;;
    wait)
      [ -n "${BG:-}" ] && wait "$BG"; cat "$OUT/bgworkflow.rc" 2>/dev/null
      grep -E "steps \([0-9]+%\) done|Error|error:" "$OUT"/workflow_*.log | tail -8 ;;
    summary)
      ls -d results/runs/*/*/*/* 2>/dev/null | wc -l | sed 's/^/run folders: /' | tee "$OUT/summary.log"
      "${SMK[@]}" --summary all >> "$OUT/summary.log" 2>&1
      awk -F'\t' 'NF > 4 {print $(NF-1) " / " $NF}' "$OUT/summary.log" | sort | uniq -c | tail -8 ;;
    pytest:*)
      eval "pargs=(${stage#pytest:})"  # shell words: -k "a or b" stays one argument
      MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 15 "${TESTS_SECONDS:-240}" python3 -m pytest -v --tb=short -rfs "${pargs[@]}" \
        2>&1 | tee -a "$OUT/tests_gpu.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Error|assert" | tail -40 ;;
    dryrun)
      "${SMK[@]}" -n all 2>&1 | tee "$OUT/dryrun_after.log" | tail -5 ;;
    pack)
      find results/runs results/eval results/logs reports/gpu_small -type f \
        ! -name '*.pt' ! -name '*.safetensors' ! -path '*/checkpoint/*' 2>/dev/null > /tmp/pack.list
      tar czf "$OUT/gpu_small.tgz" -T /tmp/pack.list && ls -la "$OUT/gpu_small.tgz" ;;
    packcache)
      tar czf /tmp/gpucache.tgz -C .gpucache . 2>/dev/null
      mb=$(( $(stat -c %s /tmp/gpucache.tgz 2>/dev/null || echo 0) / 1048576 ))
      if [ "$mb" -le "${CACHE_MB:-15}" ]; then mv /tmp/gpucache.tgz "$OUT/gpucache.tgz"; echo "gpucache.tgz: $mb MiB"
      else echo "compile caches: $mb MiB packed, over CACHE_MB=${CACHE_MB:-15}: not kept"; fi ;;
  esac
done
