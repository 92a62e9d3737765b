"""Build one table with analysis.tables.build.make_table; writes <prefix>.{csv,md,tex}.

``params.kind`` names the table; its inputs are the rule's ``summaries`` (table1, seeds,
heads), ``results`` (downstream: their eval dirs) or ``csvs`` (cost); ``params.published`` names the published
source each table quotes (the config's ``published`` block).
"""

from pathlib import Path

from _glue import start
from analysis.tables.build import make_table

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

kind = sm.params.kind
if kind == "downstream":
    # .../seed<k>/<ehash>/<task>/results.json -> the eval dir .../seed<k>/<ehash>
    inputs = sorted({str(Path(p).parent.parent) for p in sm.input.results})
elif kind == "cost":
    inputs = list(sm.input.csvs)
else:
    inputs = list(sm.input.summaries)
if not inputs:
    raise RuntimeError(f"table {kind}: no inputs (check the config block of this table)")
prefix = Path(sm.output[0]).with_suffix("")
log.info("table %s from %d inputs -> %s.{csv,md,tex}", kind, len(inputs), prefix)
for path in make_table(kind, inputs, prefix, n_resamples=sm.params.resamples, published=dict(sm.params.published)):
    log.info("wrote %s", path)
missing = [o for o in sm.output if not Path(o).is_file()]
if missing:
    raise RuntimeError(f"analysis.tables did not write {missing}")
