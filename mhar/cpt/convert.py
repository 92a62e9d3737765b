"""Hugging Face Llama <-> mhar.model.transformer.Transformer, with a bit-exactness check.

``convert_hf_llama`` maps a ``LlamaForCausalLM`` (directory, hub name or model object)
onto ``Transformer`` (``qk_norm=False``, the checkpoint's tying / RoPE incl. Llama-3 scaling /
RMSNorm epsilon) in the ``mhar_delta`` or ``baseline`` form, then compares fp32 logits on a fixed
token batch and raises :class:`CPTConversionError` unless the maximum absolute difference is 0.
``export_hf_llama`` writes a Llama-shaped baseline model as a transformers directory (through
``mhar.hf.export_model``, which exports every variant). The config and weight-name mapping is
:mod:`mhar.hf.stock`'s (``llama_model_config``, ``map_llama_state_dict``, ``hf_state_dict_from_model``).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor

from mhar.atomic import atomic_write_json
from mhar.hf.stock import StockCheckpointError, hf_state_dict_from_model, llama_model_config, map_llama_state_dict
from mhar.model.config import ConfigError
from mhar.model.transformer import Transformer
from mhar.runs.checkpoint import save_model
from mhar.runs.provenance import collect_provenance

__all__ = ["CPTConversionError", "ConversionReport", "load_hf_llama", "check_tokens", "check_logits", "convert_hf_llama",
           "save_converted", "export_hf_llama"]


class CPTConversionError(RuntimeError):
    """A Hugging Face checkpoint cannot be converted exactly (unsupported, or logits differ)."""


# --- loading ----------------------------------------------------------------------------------
LlamaSource = Union[str, Path, "torch.nn.Module"]


def load_hf_llama(src: LlamaSource, revision: Optional[str] = None):
    """A ``LlamaForCausalLM`` in fp32 eval mode from a directory, a hub name, or a model object."""
    # lazy: transformers, only to load a checkpoint (the CPT config imports without it)
    from transformers import AutoModelForCausalLM

    if isinstance(src, torch.nn.Module):
        return src.float().eval()
    where = "local directory" if Path(src).is_dir() else "Hugging Face hub"
    try:
        model = AutoModelForCausalLM.from_pretrained(str(src), revision=revision, dtype=torch.float32)
    except Exception as e:  # not found, no network, not a causal LM
        raise CPTConversionError(
            f"could not load {src!r} from the {where} ({type(e).__name__}: {e}); give a directory holding "
            "config.json + weights, or a hub name reachable from this machine") from e
    return model.eval()


# --- check ------------------------------------------------------------------------------------
def check_tokens(vocab_size: int, batch: int = 2, seq_len: int = 64, seed: int = 0) -> Tensor:
    """The fixed token batch of the exactness check (B, T), reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=g)


@torch.no_grad()
def check_logits(hf_model, model: Transformer, ids: Tensor, device: str | torch.device = "cpu") -> float:
    """Max |logits_hf - logits_ours| in fp32 on ``ids`` (0.0 = bitwise equal)."""
    ids = ids.to(device)
    a = hf_model(input_ids=ids).logits.float()  # (B, T, V)
    b = model(ids).logits.float()  # (B, T, V)
    if a.shape != b.shape:
        raise CPTConversionError(f"logit shapes differ: transformers {tuple(a.shape)} vs converted {tuple(b.shape)}")
    if not torch.isfinite(a).all():
        raise CPTConversionError("the source checkpoint produces non-finite logits on the check batch")
    diff = (a - b).abs()
    return float(diff.max()) if torch.isfinite(diff).all() else float("inf")


@dataclass
class ConversionReport:
    """What was converted and the proof that it is exact."""

    source: str
    source_revision: Optional[str]
    variant: str
    heads: int
    delta_block_layers: int
    n_sources_final: int
    model_config: dict
    params_source: int
    params_converted: int
    params_added: int
    check_batch: list[int]
    check_seed: int
    check_dtype: str
    check_device: str
    max_abs_diff: float
    exact: bool
    transformers_version: str
    torch_version: str
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def convert_hf_llama(src: LlamaSource, heads: int = 8, delta_block_layers: int = 4, *,
                     variant: str = "mhar_delta", revision: Optional[str] = None, check_batch: int = 2,
                     check_seq_len: int = 64, check_seed: int = 0, device: str | torch.device = "cpu",
                     routing_impl: str = "auto") -> tuple[Transformer, ConversionReport]:
    """Convert a transformers Llama checkpoint and prove the logits are unchanged.

    Returns ``(model, report)`` with the model in fp32 on ``device``. Raises
    :class:`CPTConversionError` when the checkpoint is unsupported or when the
    converted logits differ from the original's by anything at all in fp32.
    """
    import transformers  # lazy: transformers (see load_hf_llama)

    t0 = time.time()
    hf = load_hf_llama(src, revision)
    hf_cfg = hf.config
    try:  # the Llama mapping is mhar.hf.stock's; its refusals are this conversion's
        cfg = llama_model_config(hf_cfg, variant, heads, delta_block_layers, routing_impl)
        weights = map_llama_state_dict(hf.state_dict(), cfg.n_layers, cfg.tie_embeddings)
    except StockCheckpointError as e:
        raise CPTConversionError(str(e)) from e
    try:
        model = Transformer(cfg)
    except ConfigError as e:
        raise CPTConversionError(f"converted config is invalid: {e}") from e
    missing, unexpected = model.load_state_dict(weights, strict=False)
    own = [k for k in missing if not k.startswith("residual.") and not (cfg.tie_embeddings and k == "lm_head.weight")]
    if own or unexpected:
        raise CPTConversionError(f"weight mapping incomplete: missing={own[:5]} unexpected={unexpected[:5]}")
    model.float().eval().to(device)
    hf.to(device)
    ids = check_tokens(cfg.vocab_size, check_batch, min(check_seq_len, cfg.max_seq_len), check_seed)
    diff = check_logits(hf, model, ids, device)
    n_src = sum(p.numel() for p in hf.parameters())
    n_ours = model.num_params()
    report = ConversionReport(
        source=str(src if not isinstance(src, torch.nn.Module) else getattr(hf_cfg, "_name_or_path", "") or
                   type(src).__name__),
        source_revision=revision or getattr(hf_cfg, "_commit_hash", None), variant=variant, heads=heads,
        delta_block_layers=delta_block_layers,
        n_sources_final=(1 + cfg.n_layers // delta_block_layers) if variant == "mhar_delta" else 0,
        model_config=asdict(cfg), params_source=n_src, params_converted=n_ours, params_added=n_ours - n_src,
        check_batch=list(ids.shape), check_seed=check_seed, check_dtype="float32", check_device=str(device),
        max_abs_diff=diff, exact=diff == 0.0, transformers_version=str(transformers.__version__),
        torch_version=str(torch.__version__), seconds=round(time.time() - t0, 3),
    )
    if diff != 0.0:
        raise CPTConversionError(
            f"converted {variant} model is not exact: max |logits - original| = {diff:.3e} in fp32 on a "
            f"{tuple(ids.shape)} token batch (seed {check_seed}); refusing to continue. The weight mapping or "
            "an op order in mhar/model/transformer.py differs from transformers' LlamaModel (RMSNorm, RoPE, attention).")
    return model, report


def save_converted(model: Transformer, report: ConversionReport, out: str | Path, tokenizer: str) -> Path:
    """Write ``out/model.pt`` (mhar export format, report in ``extra``) and ``out/conversion.json``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = save_model(out / "model.pt", model, tokenizer, extra={"conversion": report.to_dict()})
    blob = {"report": report.to_dict(), "tokenizer": tokenizer, "provenance": collect_provenance(report.model_config)}
    atomic_write_json(out / "conversion.json", blob, indent=2)
    return path


# --- export (tiny CPU base) -------------------------------------------------------------------
def export_hf_llama(model: Transformer, out: str | Path, tokenizer_json: Optional[str | Path] = None,
                    tokenizer: Optional[str] = None) -> Path:
    """Write a Llama-shaped baseline model as a transformers ``LlamaForCausalLM`` directory.

    Delegates to :func:`mhar.hf.export_model` (safetensors, config, generation config, tokenizer files,
    model card, reload check); ``tokenizer`` is a harness tokenizer spec, ``tokenizer_json`` a tokenizer.json
    path (either one writes the tokenizer files). Any other model: ``python -m mhar export-hf``."""
    from mhar.hf.export import export_model  # lazy: transformers and safetensors, only for this export

    cfg = model.cfg
    if cfg.residual.variant != "baseline" or cfg.qk_norm:
        raise CPTConversionError(
            f"export_hf_llama needs a Llama-shaped baseline model (residual baseline, qk_norm false); got "
            f"variant={cfg.residual.variant!r}, qk_norm={cfg.qk_norm} (python -m mhar export-hf exports any model)")
    export_model(model, out, tokenizer if tokenizer is not None else
                 (str(tokenizer_json) if tokenizer_json is not None else None))
    return Path(out)
