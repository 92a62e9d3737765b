"""Hugging Face Llama <-> mhar.model.transformer.Transformer, with a bit-exactness check.

``convert_hf_llama`` maps a ``LlamaForCausalLM`` (directory, hub name or model object)
onto ``Transformer`` (``qk_norm=False``, the checkpoint's tying / RoPE incl. Llama-3 scaling /
RMSNorm epsilon) in the ``mhar_delta`` or ``baseline`` form, then compares fp32 logits on a fixed
token batch and raises :class:`CPTConversionError` unless the maximum absolute difference is 0.
``export_hf_llama`` writes a Llama-shaped baseline model as a transformers directory (through
``mhar.hf.export_model``, which exports every variant).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor

from mhar.model.config import ConfigError, ModelConfig, model_config
from mhar.model.transformer import Transformer
from mhar.runs.checkpoint import save_model
from mhar.runs.provenance import collect_provenance

__all__ = ["CPTConversionError", "ConversionReport", "llama_model_config", "map_llama_state_dict",
           "hf_state_dict_from_model", "load_hf_llama", "check_tokens", "check_logits", "convert_hf_llama",
           "save_converted", "export_hf_llama"]


class CPTConversionError(RuntimeError):
    """A Hugging Face checkpoint cannot be converted exactly (unsupported, or logits differ)."""


# --- config -----------------------------------------------------------------------------------
def _hf_rope(hf_cfg) -> tuple[float, Optional[dict]]:
    """(rope_theta, Llama-3 scaling dict or None) from a transformers 4.x or 5.x Llama config."""
    params = getattr(hf_cfg, "rope_parameters", None) or {}
    legacy = getattr(hf_cfg, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(hf_cfg, "rope_theta", None))
    if theta is None:
        raise CPTConversionError("Llama config has no rope_theta (rope_parameters.rope_theta or rope_theta)")
    scaling = {**legacy, **params}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise CPTConversionError(
            f"RoPE type {rope_type!r} is not supported by mhar.model.transformer (supported: default, llama3); "
            "convert a checkpoint with one of those RoPE types")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if k not in scaling]
    if missing:
        raise CPTConversionError(f"llama3 RoPE scaling lacks {missing} in the checkpoint config")
    return float(theta), {k: scaling[k] for k in keys}


def llama_model_config(hf_cfg, variant: str = "mhar_delta", heads: int = 8,
                       delta_block_layers: int = 4, routing_impl: str = "auto") -> ModelConfig:
    """ModelConfig reproducing a transformers ``LlamaConfig`` (+ the chosen residual variant)."""
    if getattr(hf_cfg, "model_type", None) != "llama":
        raise CPTConversionError(
            f"expected a Llama-family checkpoint (model_type 'llama'), got {getattr(hf_cfg, 'model_type', None)!r}")
    act = getattr(hf_cfg, "hidden_act", "silu")
    unsupported = {
        "hidden_act": (act, act == "silu"),
        "attention_bias": (getattr(hf_cfg, "attention_bias", False), not getattr(hf_cfg, "attention_bias", False)),
        "mlp_bias": (getattr(hf_cfg, "mlp_bias", False), not getattr(hf_cfg, "mlp_bias", False)),
        "pretraining_tp": (getattr(hf_cfg, "pretraining_tp", 1), getattr(hf_cfg, "pretraining_tp", 1) == 1),
    }
    bad = {k: v for k, (v, ok) in unsupported.items() if not ok}
    if bad:
        raise CPTConversionError(f"Llama features without an mhar.model.transformer equivalent: {bad} "
                                 "(need silu MLP, no biases, pretraining_tp 1)")
    theta, scaling = _hf_rope(hf_cfg)
    d, nh = hf_cfg.hidden_size, hf_cfg.num_attention_heads
    head_dim = getattr(hf_cfg, "head_dim", None) or d // nh
    try:
        return model_config(
            vocab_size=hf_cfg.vocab_size, d_model=d, n_layers=hf_cfg.num_hidden_layers, n_heads=nh,
            n_kv_heads=getattr(hf_cfg, "num_key_value_heads", None) or nh, d_ff=hf_cfg.intermediate_size,
            head_dim=head_dim, max_seq_len=hf_cfg.max_position_embeddings, rope_theta=theta,
            rope_scaling=scaling, norm_eps=float(hf_cfg.rms_norm_eps),
            init_std=float(getattr(hf_cfg, "initializer_range", 0.02)),
            tie_embeddings=bool(getattr(hf_cfg, "tie_word_embeddings", False)), qk_norm=False,
            residual={"variant": variant, "heads": heads, "delta_block_layers": delta_block_layers,
                      "routing_impl": routing_impl},
        )
    except ConfigError as e:
        raise CPTConversionError(f"converted config is invalid: {e}") from e


# --- weights ----------------------------------------------------------------------------------
_LAYER_MAP = {  # ours (under layers.{i}.) <- transformers (under model.layers.{i}.)
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
}
_TOP_MAP = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight",
            "lm_head.weight": "lm_head.weight"}


def _name_pairs(n_layers: int, tied: bool) -> list[tuple[str, str]]:
    pairs = [(ours, theirs) for ours, theirs in _TOP_MAP.items() if not (tied and ours == "lm_head.weight")]
    for i in range(n_layers):
        pairs += [(f"layers.{i}.{o}", f"model.layers.{i}.{t}") for o, t in _LAYER_MAP.items()]
    return pairs


def map_llama_state_dict(hf_sd: dict[str, Tensor], n_layers: int, tied: bool) -> dict[str, Tensor]:
    """transformers ``LlamaForCausalLM`` state dict -> ``mhar.model.transformer.Transformer`` names (fp32).

    The tensors alias the source's where they already are fp32 (no copy of an 8B model);
    ``load_state_dict`` copies them into the converted model.
    """
    missing = [t for _, t in _name_pairs(n_layers, tied) if t not in hf_sd]
    if missing:
        raise CPTConversionError(f"checkpoint lacks {len(missing)} expected tensors, e.g. {missing[:3]}")
    return {o: hf_sd[t].detach().to(torch.float32) for o, t in _name_pairs(n_layers, tied)}


def hf_state_dict_from_model(model: Transformer) -> dict[str, Tensor]:
    """The inverse map: a baseline Llama-shaped Transformer -> transformers names."""
    sd = model.state_dict()
    return {t: sd[o].detach().clone() for o, t in _name_pairs(model.cfg.n_layers, model.cfg.tie_embeddings)}


# --- loading ----------------------------------------------------------------------------------
LlamaSource = Union[str, Path, "torch.nn.Module"]


def load_hf_llama(src: LlamaSource, revision: Optional[str] = None):
    """A ``LlamaForCausalLM`` in fp32 eval mode from a directory, a hub name, or a model object."""
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
    import transformers

    t0 = time.time()
    hf = load_hf_llama(src, revision)
    hf_cfg = hf.config
    cfg = llama_model_config(hf_cfg, variant, heads, delta_block_layers, routing_impl)
    weights = map_llama_state_dict(hf.state_dict(), cfg.n_layers, cfg.tie_embeddings)
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
    (out / "conversion.json").write_text(json.dumps(blob, indent=2, default=str))
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
