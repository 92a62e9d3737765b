"""Continued pretraining (CPT): Hugging Face Llama -> mhar_delta, exactly.

Conversion (the paper's 8B mid-training design, PAPER.md "8B continued pretraining")::

    from mhar.cpt import convert_hf_llama
    model, report = convert_hf_llama("marin-community/marin-8b-base", heads=8, delta_block_layers=4)

maps a ``LlamaForCausalLM`` (local directory, hub name, or an in-memory model)
onto ``mhar.model.transformer.Transformer`` with ``qk_norm=False`` and the checkpoint's own
embedding tying / RoPE (incl. Llama-3 scaling) / RMSNorm epsilon, adds the
``mhar_delta`` residual (learnable zero null source, one delta per block of
``delta_block_layers`` layers, ``heads`` routing heads, zero-init gates), and
then *checks* that the converted model's fp32 logits on a fixed token batch
equal the original's bit for bit (max abs difference 0). Any other difference
raises :class:`CPTConversionError`; nothing is written.

``variant="baseline"`` converts the same checkpoint for the plain-CPT control
arm (the same check applies). :func:`export_hf_llama` goes the other way for a
Llama-shaped baseline model (the CPU default pretrains a tiny base with
``mhar.train`` and publishes it as a Hugging Face checkpoint).

CLI::

    python -m mhar.cpt convert --src marin-community/marin-8b-base --out DIR \
        [--variant mhar_delta|baseline] [--heads 8] [--block-layers 4] [--tokenizer SPEC]
    python -m mhar.cpt export-hf --model RUN_DIR/model.pt --out HF_DIR

    python -m mhar.cpt check-batches RUN_DIR_PLAIN RUN_DIR_MHAR

Training: both arms are ordinary ``python -m mhar.train`` runs whose configs come from
:func:`arm_run_config` (same data/train sections, ``train.init_from`` = the converted checkpoint,
plus the CPT options ``decay_filter``, ``z_loss``, ``ema_decay``, ``log_batch_hash`` that the
trainer implements in ``mhar.training.optim``). :func:`compare_batch_logs` proves the arms saw
byte-identical batches. The ``cpt:`` config block is :class:`CPTConfig` (workflow/rules/cpt.smk);
evaluating the arms and the CPT gain / MHAR gain table are analysis, in ``eval.cpt``.
"""
from __future__ import annotations

from mhar.cpt.convert import (CPTConversionError, ConversionReport, check_logits, check_tokens, convert_hf_llama,
                              export_hf_llama, load_hf_llama, save_converted)
from mhar.hf.stock import hf_state_dict_from_model, llama_model_config, map_llama_state_dict  # the mapping's home
from mhar.cpt.batches import batch_hashes, compare_batch_logs
from mhar.cpt.config import CPTBaseConfig, CPTConfig, CPTEvalConfig, arm_run_config, base_run_config, cpt_config_from_dict

__all__ = [
    "CPTConversionError", "ConversionReport", "llama_model_config", "map_llama_state_dict", "hf_state_dict_from_model",
    "load_hf_llama", "check_tokens", "check_logits", "convert_hf_llama", "export_hf_llama", "save_converted",
    "batch_hashes", "compare_batch_logs", "CPTBaseConfig", "CPTEvalConfig", "CPTConfig", "cpt_config_from_dict",
    "base_run_config", "arm_run_config",
]
