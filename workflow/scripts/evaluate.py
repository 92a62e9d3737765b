"""Evaluate one trained model on one task: ``python -m eval.run`` into the task's eval dir.

A separate process per job keeps lm-eval's memory out of the Snakemake process.
"""

import sys
from pathlib import Path

from _glue import data_dir, run_logged, start

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

p = sm.params
out = Path(sm.output.results).parent.parent  # eval.run writes <out>/<task>/{results.json,samples.jsonl,lm_eval/}
cmd = [sys.executable, "-m", "eval.run", "--model", sm.input.model, "--tasks", sm.wildcards.task,
       "--out", out, "--subset", p.subset, "--batch-size", p.batch_size, "--bootstrap-iters", p.bootstrap_iters]
if data_dir(sm):
    cmd += ["--data-dir", data_dir(sm)]
if p.tasks_dir:
    cmd += ["--tasks-dir", Path(p.tasks_dir).expanduser().resolve()]
if p.device != "auto":
    cmd += ["--device", p.device]
if p.wandb_args:  # lm-eval's own W&B logging (config eval_wandb_args)
    cmd += ["--wandb-args", p.wandb_args]
log.info("evaluate %s on %s (%s)", sm.input.model, sm.wildcards.task, p.subset)
run_logged(cmd, sm.log[0], threads=sm.threads)
