"""Write REPORT.md from the rule's inputs: this config's tables, figures and probe JSONs (analysis.report)."""
from pathlib import Path

from _glue import start
from analysis.report import build_report

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

reports = Path(sm.output[0]).parent
build_report(reports, sm.output[0], list(sm.input))  # this config's own outputs only
log.info("wrote %s from %d tables/figures", sm.output[0], len(sm.input))
