"""Stock Hugging Face Llama / Qwen3 checkpoints <-> the harness's ``ModelConfig`` and weight names.

The one home of the mapping both directions use: ``import-hf`` (:mod:`mhar.hf.importer`: a stock ``llama`` /
``qwen3`` directory as the ``baseline`` variant) and continued pretraining (:mod:`mhar.cpt.convert`: a Llama
checkpoint as ``mhar_delta`` or ``baseline``, proven exact). RoPE (default or Llama-3 scaling), tying, RMSNorm
epsilon and head size come from the checkpoint's config; a feature ``mhar.model.transformer`` has no
equivalent for (biases, another activation, tensor-parallel slicing, sliding windows, another RoPE type) is
refused with :class:`StockCheckpointError` naming it. Weight names: :mod:`mhar.hf.names` (Qwen3 / Llama share
the decoder's names; Llama has no q/k norms).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from mhar.hf.names import hf_name
from mhar.model.config import ConfigError, ModelConfig, model_config

__all__ = ["StockCheckpointError", "hf_rope", "llama_model_config", "qwen3_model_config", "map_llama_state_dict",
           "hf_state_dict_from_model"]


class StockCheckpointError(ValueError):
    """A stock checkpoint has a feature without an equivalent here (the message names it)."""


def hf_rope(hf_cfg) -> tuple[float, Optional[dict]]:
    """(rope_theta, Llama-3 scaling dict or None) from a transformers 4.x or 5.x Llama config."""
    params = getattr(hf_cfg, "rope_parameters", None) or {}
    legacy = getattr(hf_cfg, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(hf_cfg, "rope_theta", None))
    if theta is None:
        raise StockCheckpointError("Llama config has no rope_theta (rope_parameters.rope_theta or rope_theta)")
    scaling = {**legacy, **params}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise StockCheckpointError(
            f"RoPE type {rope_type!r} is not supported by mhar.model.transformer (supported: default, llama3); "
            "convert a checkpoint with one of those RoPE types")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if k not in scaling]
    if missing:
        raise StockCheckpointError(f"llama3 RoPE scaling lacks {missing} in the checkpoint config")
    return float(theta), {k: scaling[k] for k in keys}


def llama_model_config(hf_cfg, variant: str = "mhar_delta", heads: int = 8,
                       delta_block_layers: int = 4, routing_impl: str = "auto") -> ModelConfig:
    """ModelConfig reproducing a transformers ``LlamaConfig`` (+ the chosen residual variant)."""
    if getattr(hf_cfg, "model_type", None) != "llama":
        raise StockCheckpointError(
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
        raise StockCheckpointError(f"Llama features without an mhar.model.transformer equivalent: {bad} "
                                 "(need silu MLP, no biases, pretraining_tp 1)")
    theta, scaling = hf_rope(hf_cfg)
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
        raise StockCheckpointError(f"converted config is invalid: {e}") from e


def qwen3_model_config(hf_cfg, tied: bool) -> ModelConfig:
    """ModelConfig (the ``baseline`` variant, q/k norms on) reproducing a transformers ``Qwen3Config``;
    ``tied``: whether the checkpoint ties its output head to the embedding. An invalid result raises
    ``ConfigError``."""
    bad = {"hidden_act": getattr(hf_cfg, "hidden_act", "silu") != "silu",
           "attention_bias": bool(getattr(hf_cfg, "attention_bias", False)),
           "use_sliding_window": bool(getattr(hf_cfg, "use_sliding_window", False)),
           "layer_types": any(t != "full_attention" for t in (getattr(hf_cfg, "layer_types", None) or []))}
    if any(bad.values()):
        raise StockCheckpointError(f"Qwen3 features without an equivalent here: {[k for k, v in bad.items() if v]} "
                                   "(need silu MLP, no attention bias, no sliding window)")
    theta, scaling = hf_rope(hf_cfg)
    d, nh = hf_cfg.hidden_size, hf_cfg.num_attention_heads
    return model_config(  # a ConfigError names the field
        vocab_size=hf_cfg.vocab_size, d_model=d, n_layers=hf_cfg.num_hidden_layers, n_heads=nh,
        n_kv_heads=getattr(hf_cfg, "num_key_value_heads", None) or nh, d_ff=hf_cfg.intermediate_size,
        head_dim=None if (getattr(hf_cfg, "head_dim", None) or d // nh) == d // nh else hf_cfg.head_dim,
        max_seq_len=hf_cfg.max_position_embeddings,
        rope_theta=theta, rope_scaling=scaling, norm_eps=float(hf_cfg.rms_norm_eps),
        init_std=float(getattr(hf_cfg, "initializer_range", 0.02)), tie_embeddings=tied, qk_norm=True,
        residual={"variant": "baseline"})


# --- weights ----------------------------------------------------------------------------------
# the Llama decoder's parameters (ours, under layers.{i}.): Qwen3's less the q/k norms; names by mhar.hf.names
_LLAMA_LAYER = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                "mlp.down_proj", "attn_norm", "mlp_norm")


def _name_pairs(n_layers: int, tied: bool) -> list[tuple[str, str]]:
    """(ours, transformers') of every decoder weight of a Llama checkpoint (the tied head left out)."""
    ours = [f"{m}.weight" for m in ("embed", "final_norm", "lm_head") if not (tied and m == "lm_head")]
    ours += [f"layers.{i}.{m}.weight" for i in range(n_layers) for m in _LLAMA_LAYER]
    return [(o, hf_name(o)) for o in ours]


def map_llama_state_dict(hf_sd: dict[str, Tensor], n_layers: int, tied: bool) -> dict[str, Tensor]:
    """transformers ``LlamaForCausalLM`` state dict -> ``mhar.model.transformer.Transformer`` names (fp32).

    The tensors alias the source's where they already are fp32 (no copy of an 8B model);
    ``load_state_dict`` copies them into the converted model.
    """
    missing = [t for _, t in _name_pairs(n_layers, tied) if t not in hf_sd]
    if missing:
        raise StockCheckpointError(f"checkpoint lacks {len(missing)} expected tensors, e.g. {missing[:3]}")
    return {o: hf_sd[t].detach().to(torch.float32) for o, t in _name_pairs(n_layers, tied)}


def hf_state_dict_from_model(model) -> dict[str, Tensor]:
    """The inverse map: a baseline Llama-shaped ``Transformer`` -> transformers names."""
    sd = model.state_dict()
    return {t: sd[o].detach().clone() for o, t in _name_pairs(model.cfg.n_layers, model.cfg.tie_embeddings)}


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
        raise StockCheckpointError(f"checkpoint lacks {len(missing)} expected tensors, e.g. {missing[:3]}")
    return {o: hf_sd[t].detach().to(torch.float32) for o, t in _name_pairs(n_layers, tied)}


def hf_state_dict_from_model(model: Transformer) -> dict[str, Tensor]:
    """The inverse map: a baseline Llama-shaped Transformer -> transformers names."""
    sd = model.state_dict()
    return {t: sd[o].detach().clone() for o, t in _name_pairs(model.cfg.n_layers, model.cfg.tie_embeddings)}


