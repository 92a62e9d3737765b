"""Publish the pretrained stand-in base as a transformers Llama directory with its tokenizer (mhar.hf.export_hf)."""

from pathlib import Path

from _glue import start
from mhar.hf import export_hf

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

rep = export_hf(sm.input.model, Path(sm.output.config).parent)
log.info("exported %s (%d params) as a transformers %s -> %s (reload check: max |logits diff| %s)",
         sm.input.model, rep["params"], rep["architecture"], Path(sm.output.config).parent,
         rep["check"]["max_abs_diff"])
