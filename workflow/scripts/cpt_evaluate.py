"""Evaluate one CPT model (base / plain / mhar) on one task (eval.cpt.evaluate_cpt_model -> eval.run)."""

from pathlib import Path

import torch

from _glue import data_dir, start
from eval.cpt import evaluate_cpt_model
from mhar.cpt import cpt_config_from_dict

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)
torch.set_num_threads(max(1, sm.threads))

ev = cpt_config_from_dict(sm.config["cpt"]).eval
task = sm.wildcards.task
out = Path(sm.output.results).parent.parent  # writes <out>/<task>/{results.json,samples.jsonl}
log.info("evaluate %s (%s) on %s, subset %s", sm.wildcards.cpt_model, sm.input.model, task, ev.subset)
res = evaluate_cpt_model(sm.input.model, task, out, ev, data_dir=data_dir(sm))
log.info("%s: n=%s %s", task, res.get("n"), {k: v for k, v in res.get("metrics", {}).items() if "stderr" not in k})
