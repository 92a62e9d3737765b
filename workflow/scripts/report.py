"""Write REPORT.md from the generated tables and figures (analysis.report.build_report)."""
from pathlib import Path

from _glue import start
from analysis.report import build_report

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

reports = Path(sm.output[0]).parent
build_report(reports, sm.output[0])
log.info("wrote %s from %d tables/figures", sm.output[0], len(sm.input))
