"""Draw one figure with analysis.figures.make_figure; writes <prefix>.{png,pdf}.

The figure kind is the ``figure`` wildcard; its inputs are the rule's input files
(summary.json files, table CSVs or benchmark CSVs, see workflow/rules/common.smk).
"""

from pathlib import Path

from _glue import start
from analysis.figures import make_figure

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

kind = sm.wildcards.figure
prefix = Path(sm.output[0]).with_suffix("")
log.info("figure %s from %d inputs -> %s.{png,pdf}", kind, len(sm.input), prefix)
for path in make_figure(kind, list(sm.input), prefix):
    log.info("wrote %s", path)
