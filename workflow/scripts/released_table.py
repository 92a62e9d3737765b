"""Build the released-models table (analysis.released) from the released arms' evaluations; writes <prefix>.{csv,md,tex}."""

from pathlib import Path

from _glue import start
from analysis.released import make_released_table

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

prefix = Path(sm.output[0]).with_suffix("")
log.info("released table from %d arms -> %s.{csv,md,tex}", len(sm.params.eval_dirs), prefix)
for path in make_released_table(list(sm.params.eval_dirs), dict(sm.params.arms), prefix,
                                n_resamples=sm.params.resamples):
    log.info("wrote %s", path)
