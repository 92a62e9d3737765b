"""Measure training throughput and peak memory on this machine's GPU
(``python -m benchmarks.bench_training``); writes the benchmark CSV the cost table reads."""
import sys

from _glue import run_logged, start

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

# cost.providers -> benchmark variants (routing implementations of MHAR vs the baseline)
# (the library's training step, mhar.training.step.TrainStep; see benchmarks/bench_training.py)
cmd = [sys.executable, "-m", "benchmarks.bench_training", "--sizes", *sm.params.sizes,
       "--variants", *[p if p == "baseline" else f"mhar_{p}" for p in sm.params.providers], "--heads", sm.params.heads,
       "--out", sm.output[0]]
log.info("benchmark %s x %s", sm.params.sizes, sm.params.providers)
run_logged(cmd, sm.log[0], threads=sm.threads)
