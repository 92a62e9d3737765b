#!/usr/bin/env bash
# Pilot of the paper recipe on ONE GPU (benchmarks/pilot.py): 100M and 1B (config/train/paper_*.yaml) trained
# at the paper's global batch, stopped half way and resumed, evaluated (wikitext), projected to 20K steps.
#
# Here (CPU machine, once):  bash benchmarks/pilot.sh prepare
#     copies the files it needs from $MHAR_DATA_DIR (Gutenberg, the GPT-2 tokenizer, WikiText-2 for the
#     evaluation; about 17 MB) into .gpudata/data (git-ignored: carry it, e.g. the device tool's
#     carry: [".gpudata"] -- and ".whl" when the GPU machine lacks lm-eval / tokenizers / datasets).
# GPU machine (repo root; torch + triton there, no snakemake needed):
#     OUT=/some/dir bash benchmarks/pilot.sh [pilot.py options, e.g. --steps 100M=300 1B=40 --budget-s 330]
#     -> $OUT/pilot.csv (one row per size), $OUT/pilot.log, $OUT/runs/<size>/ (metrics, summary, eval);
#     checkpoints stay in $PILOT_WORK (default /tmp/mhar_pilot), never under $OUT.
# Then here:  python -m benchmarks.pilot_record --from <fetched>/pilot.csv --session "..."  (results/bench/pilot.csv)
#
# Time (one H200, cold compile caches; results/bench/training.csv): 100M 300 steps with stop + resume +
# evaluation about 4-4.5 minutes; 1B needs about 3 minutes of warm-up (compile, autotuning) before its
# first step, then about 0.9 s per step: with the default --budget-s 330 the 1B stage runs only when that
# much time is left (warm caches in .gpucache, see gpu_session.sh packcache), else its row says skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "prepare" ]; then
    src=${MHAR_DATA_DIR:?set MHAR_DATA_DIR to the local data mirror}
    dst=.gpudata/data
    mkdir -p "$dst/nltk_gutenberg" "$dst/tokenizers/gpt2" "$dst/wikitext-2-raw-v1"
    cp -r "$src/nltk_gutenberg/gutenberg" "$dst/nltk_gutenberg/"
    cp "$src/tokenizers/gpt2/tokenizer.json" "$dst/tokenizers/gpt2/"
    cp "$src/wikitext-2-raw-v1/validation.jsonl" "$src/wikitext-2-raw-v1/test.jsonl" "$dst/wikitext-2-raw-v1/"
    chmod -R u+w "$dst"
    du -sh "$dst"
    exit 0
fi

: "${OUT:?set OUT to the output directory}"
mkdir -p "$OUT"
export PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
export PATH="/tmp/site/bin:$PATH"
# the resumed run's compile and autotuning come from the first run's caches (and from a carried .gpucache)
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
if [ -z "${MHAR_DATA_DIR:-}" ]; then
    [ -d .gpudata/data ] || { echo "error: no data: run 'bash benchmarks/pilot.sh prepare' where the data is and carry .gpudata, or set MHAR_DATA_DIR" >&2; exit 2; }
    export MHAR_DATA_DIR=$PWD/.gpudata/data
fi
if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c "import lm_eval, tokenizers" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        2>&1 | tail -3
fi
python3 -c "import torch, numpy, yaml, tokenizers" 2>/dev/null || {
    echo "error: needs torch, numpy, pyyaml, tokenizers in python3 (carry .whl or pip install them)" >&2; exit 2; }
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tail -1
} | tee "$OUT/gpu.txt"
exec python3 -m benchmarks.pilot --out "$OUT" "$@"
