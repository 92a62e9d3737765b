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
"""
from __future__ import annotations

from mhar.hf.export import ExportError, architecture, export_hf, export_model
from mhar.hf.importer import ImportHFError, convert_folder, import_hf

__all__ = ["export_hf", "export_model", "architecture", "ExportError", "import_hf", "convert_folder", "ImportHFError"]
