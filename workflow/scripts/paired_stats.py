"""One paired comparison (treatment - baseline on the same documents) -> JSON record.

Uses eval.tables.compare_task (bootstrap CI; exact McNemar for 0/1 scores, document
bootstrap for perplexities) on the task's primary metric.
"""

import dataclasses
import json
from pathlib import Path

from _glue import start
from eval import results_io as io
from eval.tables import compare_task, primary_metric

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

task = sm.wildcards.task
dirs = {arm: Path(sm.input[arm]).parent.parent for arm in ("treatment", "baseline")}
arms = {arm: io.load_eval_task(d, task) for arm, d in dirs.items()}
metric = primary_metric(arms["treatment"])
cmp = compare_task(arms["treatment"], arms["baseline"], metric, n_resamples=sm.params.resamples)
record = {
    "task": task,
    "metric": metric,
    "treatment": {"label": sm.wildcards.variant, "eval_dir": str(dirs["treatment"]), **io.identify_eval(dirs["treatment"])},
    "baseline": {"label": sm.wildcards.baseline, "eval_dir": str(dirs["baseline"]), **io.identify_eval(dirs["baseline"])},
    "comparison": dataclasses.asdict(cmp),
    "provenance": io.provenance([str(p) for p in sm.input]),
}
Path(sm.output[0]).write_text(json.dumps(record, indent=1, default=str))
log.info("%s %s: %s - %s = %.4g [%.4g, %.4g], p=%.3g (%s)", task, metric, sm.wildcards.variant,
         sm.wildcards.baseline, cmp.result.estimate, cmp.result.ci_low, cmp.result.ci_high, cmp.result.p_value,
         cmp.result.method)
