"""Build one table with analysis.tables.build.make_table; writes <prefix>.{csv,md,tex}.

The table is the output's name (a record of analysis/tables/registry.py); ``params.inputs`` its input kind: summary
files (table1_runs, heads_runs) and benchmark CSVs (bench) are passed as they are, evaluation results
(downstream_evals, released_evals: .../<task>/results.json) as their eval dirs; ``params.published`` names the
published source each table quotes (the config's ``published`` block), ``params.options`` the builder's options.
"""

from pathlib import Path

from _glue import start
from analysis.tables.build import make_table

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

kind = sm.wildcards.table
if sm.params.inputs.endswith("_evals"):
    # .../<run or arm>/<ehash>/<task>/results.json -> the eval dir .../<ehash>
    inputs = sorted({str(Path(p).parent.parent) for p in sm.input})
else:
    inputs = list(sm.input)
if not inputs:
    raise RuntimeError(f"table {kind}: no inputs (check the config block of this table)")
prefix = Path(sm.output[0]).with_suffix("")
log.info("table %s from %d inputs -> %s.{csv,md,tex}", kind, len(inputs), prefix)
for path in make_table(kind, inputs, prefix, n_resamples=sm.params.resamples, published=dict(sm.params.published),
                       options=dict(sm.params.options) or None):
    log.info("wrote %s", path)
missing = [o for o in sm.output if not Path(o).is_file()]
if missing:
    raise RuntimeError(f"analysis.tables did not write {missing}")
