"""Weight names and config fields: ``mhar.model.transformer.Transformer`` <-> the Hugging Face layout.

The decoder's tensors take Qwen3 / Llama names (``model.embed_tokens``, ``model.layers.{i}.self_attn.q_proj``,
``input_layernorm``, ``post_attention_layernorm``, ``model.norm``, ``lm_head``); a residual variant's own
parameters keep their harness names under ``model.residual.`` (``TOP_MODULES`` / ``LAYER_MODULES``).
A tied ``lm_head.weight`` is not stored (transformers ties it to ``model.embed_tokens.weight``).
"""
from __future__ import annotations

import re
from typing import Optional

from torch import Tensor

from mhar.model.config import ROUTING_IMPLS, ModelConfig, model_config, stored_routing_impl, to_dict

# ours -> theirs, per module: the decoder's modules take Qwen3 / Llama names (``modeling_mhar`` registers the
# harness model's modules under these names, so its state dict is the export's)
TOP_MODULES = {"embed": "model.embed_tokens", "final_norm": "model.norm", "residual": "model.residual",
               "lm_head": "lm_head"}
LAYER_MODULES = {"attn": "self_attn", "attn_norm": "input_layernorm", "mlp": "mlp",
                 "mlp_norm": "post_attention_layernorm"}  # under layers.{i}. / model.layers.{i}.
_TOP = {f"{m}.weight": f"{TOP_MODULES[m]}.weight" for m in ("embed", "final_norm", "lm_head")}
_LAYER = {f"{m}.{leaf}.weight": f"{LAYER_MODULES[m]}.{leaf}.weight"
          for m, leaves in (("attn", ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")),
                            ("mlp", ("gate_proj", "up_proj", "down_proj"))) for leaf in leaves}
_LAYER.update({f"{m}.weight": f"{LAYER_MODULES[m]}.weight" for m in ("attn_norm", "mlp_norm")})
_LAYER_BACK = {v: k for k, v in _LAYER.items()}
_TOP_BACK = {v: k for k, v in _TOP.items()}
_OURS_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def hf_name(ours: str) -> str:
    """The Hugging Face name of a ``Transformer.state_dict()`` key."""
    if ours in _TOP:
        return _TOP[ours]
    m = _OURS_LAYER.match(ours)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}"
    if ours.startswith("residual."):
        return "model." + ours
    raise KeyError(f"no Hugging Face name for parameter {ours!r}")


def our_name(hf: str) -> Optional[str]:
    """The ``Transformer`` key of a Hugging Face tensor name (None: not one of ours)."""
    if hf in _TOP_BACK:
        return _TOP_BACK[hf]
    m = _HF_LAYER.match(hf)
    if m and m.group(2) in _LAYER_BACK:
        return f"layers.{m.group(1)}.{_LAYER_BACK[m.group(2)]}"
    if hf.startswith("model.residual."):
        return hf[len("model."):]
    return None


def to_hf_state_dict(state: dict[str, Tensor], tied: bool) -> dict[str, Tensor]:
    """Our state dict -> Hugging Face names (contiguous tensors; the tied head left out)."""
    out = {}
    for k, v in state.items():
        if tied and k == "lm_head.weight":
            continue
        out[hf_name(k)] = v.detach().contiguous()
    return out


def from_hf_state_dict(tensors: dict[str, Tensor], tied: bool) -> tuple[dict[str, Tensor], list[str]]:
    """Hugging Face names -> ours; returns (state dict, names that are not ours).

    With ``tied``, ``lm_head.weight`` is the embedding (a stored copy is dropped: transformers ties it)."""
    out, unknown = {}, []
    for k, v in tensors.items():
        o = our_name(k)
        if o is None:
            unknown.append(k)
        elif not (tied and o == "lm_head.weight"):
            out[o] = v
    if tied and "embed.weight" in out:
        out["lm_head.weight"] = out["embed.weight"]
    return out, unknown


# --- config fields ---------------------------------------------------------------------------------
def hf_common_fields(cfg: ModelConfig) -> dict:
    """The Qwen3 / Llama config fields shared by every export."""
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                head_dim=cfg.resolved_head_dim, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
                initializer_range=cfg.init_std, tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu")


def mhar_config_fields(cfg: ModelConfig) -> dict:
    """``modeling_mhar.MharConfig`` fields of a model config: Qwen3's, plus the residual config as it is
    (``routing_impl`` apart: how the export runs, ``auto``, and how the model was trained, ``mhar_routing_impl``)."""
    residual = {k: v for k, v in to_dict(cfg.residual).items() if k != "routing_impl"}
    return dict(hf_common_fields(cfg), rope_theta=cfg.rope_theta,
                rope_llama3=dict(cfg.rope_scaling) if cfg.rope_scaling else None, qk_norm=cfg.qk_norm,
                residual=residual, routing_impl="auto", mhar_routing_impl=cfg.residual.routing_impl)


def model_config_from_mhar_fields(d: dict, routing_impl: Optional[str] = None) -> ModelConfig:
    """The inverse of :func:`mhar_config_fields` (a ``model_type: mhar`` config.json); ``routing_impl``: the
    implementation to build it with (default: the one it was trained with, as a current name)."""
    residual = dict(d.get("residual") or {})
    # an execution choice: an export written before the routing registry may name a withdrawn fused variant
    trained = stored_routing_impl(d.get("mhar_routing_impl") or "eager")
    residual["routing_impl"] = routing_impl or (trained if trained in ROUTING_IMPLS else "eager")
    head_dim = d.get("head_dim")
    if head_dim == d["hidden_size"] // d["num_attention_heads"]:
        head_dim = None  # the default, as the harness writes it
    return model_config(
        vocab_size=d["vocab_size"], d_model=d["hidden_size"], n_layers=d["num_hidden_layers"],
        n_heads=d["num_attention_heads"], n_kv_heads=d["num_key_value_heads"], d_ff=d["intermediate_size"],
        head_dim=head_dim, max_seq_len=d["max_position_embeddings"], rope_theta=float(d["rope_theta"]),
        rope_scaling=d.get("rope_llama3") or None, norm_eps=float(d["rms_norm_eps"]),
        init_std=float(d.get("initializer_range", 0.02)), tie_embeddings=bool(d.get("tie_word_embeddings", True)),
        qk_norm=bool(d.get("qk_norm", True)), residual=residual)
