"""Weight names and config fields: ``mhar.model.transformer.Transformer`` <-> the Hugging Face layout.

The decoder's tensors take Qwen3 / Llama names (``model.embed_tokens``, ``model.layers.{i}.self_attn.q_proj``,
``input_layernorm``, ``post_attention_layernorm``, ``model.norm``, ``lm_head``); a residual variant's own
parameters keep their harness names under ``model.residual.`` (``modeling_mhar.py`` builds the same tree).
A tied ``lm_head.weight`` is not stored (transformers ties it to ``model.embed_tokens.weight``).
"""
from __future__ import annotations

import re
from typing import Optional

from torch import Tensor

from mhar.model.config import ModelConfig, model_config, stored_routing_impl

_TOP = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight"}
_LAYER = {  # ours under layers.{i}. -> theirs under model.layers.{i}.
    "attn.q_proj.weight": "self_attn.q_proj.weight", "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight", "attn.o_proj.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight", "attn.k_norm.weight": "self_attn.k_norm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight", "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
}
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
    """``modeling_mhar.MharConfig`` fields of a model config."""
    r = cfg.residual
    return dict(hf_common_fields(cfg), rope_theta=cfg.rope_theta,
                rope_llama3=dict(cfg.rope_scaling) if cfg.rope_scaling else None, qk_norm=cfg.qk_norm,
                residual={"variant": r.variant, "heads": r.heads, "hyper_n": r.hyper_n,
                          "hyper_dynamic": r.hyper_dynamic, "blocks": r.blocks,
                          "delta_block_layers": r.delta_block_layers, "routing_eps": r.routing_eps},
                routing_impl="auto", mhar_routing_impl=r.routing_impl)


def model_config_from_mhar_fields(d: dict) -> ModelConfig:
    """The inverse of :func:`mhar_config_fields` (a ``model_type: mhar`` config.json)."""
    r = dict(d.get("residual") or {})
    residual = {k: r[k] for k in ("variant", "heads", "hyper_n", "hyper_dynamic", "blocks", "delta_block_layers",
                                  "routing_eps") if k in r}
    # an execution choice: an export written before the routing registry may name a withdrawn fused variant
    residual["routing_impl"] = stored_routing_impl(d.get("mhar_routing_impl") or "eager")
    if residual["routing_impl"] not in _routing_impls():
        residual["routing_impl"] = "eager"
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


def _routing_impls() -> tuple:
    from mhar.model.config import ROUTING_IMPLS

    return ROUTING_IMPLS
