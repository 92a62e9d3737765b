"""Hugging Face format: models leave (``export_hf``) and enter (``import_hf``) the harness.

    python -m mhar export-hf RUN_DIR_OR_MODEL_PT --out HF_DIR [--tokenizer SPEC] [--no-check]
    python -m mhar import-hf HF_DIR_OR_HUB_NAME --out MODEL_PT [--tokenizer SPEC] [--no-check]

* :mod:`mhar.hf.export`: safetensors + config + generation config + tokenizer files + model card; the
  baseline as a stock ``Qwen3ForCausalLM`` / ``LlamaForCausalLM``, every other variant with
  ``modeling_mhar.py`` (:mod:`mhar.hf.modeling_mhar`, a ``transformers`` wrapper over the harness's
  ``Transformer``) via ``auto_map`` and the model package's own modules beside it (:mod:`mhar.hf.ship`).
* :mod:`mhar.hf.importer`: our exports (identical weights), stock Qwen3 / Llama, and the authors'
  Qwen3-AttnRes checkpoints (:mod:`mhar.hf.authors`).
* :mod:`mhar.hf.names`: the weight-name and config-field map shared by both directions.
* :mod:`mhar.hf.stock`: stock Llama / Qwen3 configs and weights <-> the harness's (import-hf and ``mhar.cpt``).

The package's names below load on first use: ``mhar.hf.export`` and ``mhar.hf.importer`` import transformers
and safetensors, which ``mhar.hf.stock`` / ``mhar.hf.names`` (what ``mhar.cpt`` and the Snakefile's CPT config
reach) do not need.
"""
from __future__ import annotations

_EXPORT = ("export_hf", "export_model", "architecture", "ExportError")
_IMPORT = ("import_hf", "convert_folder", "ImportHFError")


def __getattr__(name: str):
    if name in _EXPORT:
        from mhar.hf import export  # lazy: transformers and safetensors (see the module docstring)

        return getattr(export, name)
    if name in _IMPORT:
        from mhar.hf import importer  # lazy: transformers and safetensors (see the module docstring)

        return getattr(importer, name)
    raise AttributeError(f"module 'mhar.hf' has no attribute {name!r}")


__all__ = ["export_hf", "export_model", "architecture", "ExportError", "import_hf", "convert_folder", "ImportHFError"]
