"""Publish the pretrained stand-in base as a transformers Llama directory (mhar.cpt.export_hf_llama)."""

from pathlib import Path

from _glue import start
from mhar.checkpoint import load_model
from mhar.cpt import export_hf_llama

sm = snakemake  # noqa: F821  (injected by Snakemake)
log = start(sm)

model, _, _ = load_model(sm.input.model)
out = export_hf_llama(model, Path(sm.output.config).parent)
log.info("exported %s (%d params) as a transformers LlamaForCausalLM -> %s", sm.input.model, model.num_params(), out)
