"""Export one trained run as a Hugging Face directory (mhar.hf.export_hf, which checks the reload)."""

from pathlib import Path

from _glue import start
from mhar.hf import export_hf

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

run_dir = Path(sm.input.model).parent
rep = export_hf(run_dir, sm.output[0])
log.info("exported %s (%s, %d params) as %s -> %s; reload check: max |logits diff| %s",
         run_dir, rep["variant"], rep["params"], rep["architecture"], sm.output[0], rep["check"]["max_abs_diff"])
