"""The MHAR / AttnRes authors' Qwen3-AttnRes checkpoints -> our residual variants.

Their public ``modeling_qwen3_attnres.py`` (``Qwen3AttnResForCausalLM``, ``model_type: qwen3_attnres``;
read for names and semantics, never imported or executed here) is a Qwen3 decoder whose layers carry,
per sublayer, a pseudo-query ``attn_res_proj`` / ``mlp_res_proj`` (``nn.Linear(d, 1)``: weight (1, d))
and a key RMSNorm ``attn_res_norm`` / ``mlp_res_norm`` (Qwen3RMSNorm(d), eps = ``rms_norm_eps``), plus a
final read ``model.final_res_proj`` / ``model.final_res_norm`` before ``model.norm``. A read stacks its
sources V, keys K = RMSNorm(V) over the full width, logits = <q, K> (``full_mh``: q and K split into
``attnres_num_heads`` slices, one softmax per slice), softmax over the sources, output = weights x V;
the sublayer then applies its usual pre-norm (``input_layernorm`` / ``post_attention_layernorm``).
With ``attnres_gate_type: bias`` (the default) the routed mix is the sublayer's input as is.

Modes that are one of our variants (``attnres_mode``):

* ``full_mh`` -> ``mhar`` with H = ``attnres_num_heads``: sources = embedding, then every sublayer's
  raw output (their ``blocks`` list gets the previous ``partial_block``, which in this mode is the last
  output); the final read routes over all 2L + 1.
* ``full`` -> ``attnres`` (the same with one head).
* ``block`` -> ``block_attnres``: layers are grouped ``ceil(L / attnres_num_blocks)`` to a block; at the
  first layer of a block the running partial sum is closed (the embedding closes as block 0); every
  read routes over the closed blocks plus the partial sum; the final read over all closed blocks plus
  the last partial. Our ``block_attnres`` cuts the 2L sublayers into ``blocks`` near-equal groups, so
  the two agree exactly when the block size divides L (converted with ``blocks = L / block size``);
  otherwise their last block is shorter and the checkpoint is refused.
* ``full_hw`` -> ``mhar_hw`` when ``attnres_num_heads`` is 1: each attention sublayer has one full-width
  query per KV group (``attn_res_proj`` weight (G, d)) sharing one key norm (copied to each group's);
  its MLP and final reads are multi-head with ``attnres_num_heads`` heads, ours single-head.

Refused, naming the field: other modes (delta, delta_block, block_mh, *_v, hyper_connection, ...), a
gate other than ``bias``, the older layout with a recency bias (``attn_res_bias`` tensors or
``attnres_recency_bias_init``: there ``full`` routed over cumulative states), a ``full``-family checkpoint
without ``final_res_proj``, sliding-window attention, attention biases, a non-SiLU MLP.
"""
from __future__ import annotations

import re
from typing import Optional

import torch
from torch import Tensor

from mhar.model.config import ConfigError, ModelConfig, model_config
from mhar.hf.names import our_name

MODEL_TYPE = "qwen3_attnres"
MODES = {"full_mh": "mhar", "full": "attnres", "block": "block_attnres", "full_hw": "mhar_hw"}
_ROUTING = re.compile(r"^model\.layers\.(\d+)\.(attn|mlp)_res_(proj|norm)\.weight$")
_FINAL = {"model.final_res_proj.weight": "proj", "model.final_res_norm.weight": "norm"}
_IGNORED = re.compile(r"^model\.layers\.\d+\.(attn|mlp)_null_source$")  # unused by the full / block modes


class AuthorsFormatError(ValueError):
    """The checkpoint is not (convertibly) one of our variants; the message names the field."""


def _rope(hf: dict) -> tuple[float, Optional[dict]]:
    params = hf.get("rope_parameters") or {}
    legacy = hf.get("rope_scaling") or {}
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = {**legacy, **params}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise AuthorsFormatError(f"rope_parameters.rope_type {kind!r} is not supported (default, llama3)")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return float(theta), {k: scaling[k] for k in keys}


def block_size(n_layers: int, num_blocks: int) -> int:
    """Layers per block in their ``block`` mode: max(1, ceil(L / attnres_num_blocks))."""
    return max(1, -(-n_layers // num_blocks))


def authors_model_config(hf: dict, tensors: dict[str, Tensor],
                         routing_impl: str = "eager") -> tuple[ModelConfig, list[str]]:
    """Our ModelConfig for an authors' ``config.json`` (+ its tensors, for shapes); (config, notes)."""
    if hf.get("model_type") != MODEL_TYPE:
        raise AuthorsFormatError(f"model_type {hf.get('model_type')!r} is not {MODEL_TYPE!r}")
    notes: list[str] = []
    mode = hf.get("attnres_mode", "block")
    if mode not in MODES:
        raise AuthorsFormatError(
            f"attnres_mode {mode!r} has no equivalent residual variant here (convertible: "
            f"{', '.join(f'{k} -> {v}' for k, v in MODES.items())})")
    gate = hf.get("attnres_gate_type", "bias")
    if gate != "bias":
        raise AuthorsFormatError(f"attnres_gate_type {gate!r}: only 'bias' (the routed mix is the sublayer input "
                                 "as is) matches our variants")
    if "attnres_recency_bias_init" in hf or any(k.endswith("_res_bias") for k in tensors):
        raise AuthorsFormatError(
            "attnres_recency_bias_init / *_res_bias: the older recency-bias layout (its 'full' mode routes over "
            "cumulative states, its block mode keeps the embedding in the first partial sum); not convertible")
    if hf.get("hidden_act", "silu") != "silu":
        raise AuthorsFormatError(f"hidden_act {hf.get('hidden_act')!r}: only silu (SwiGLU)")
    if hf.get("attention_bias", False):
        raise AuthorsFormatError("attention_bias true: our attention has no biases")
    if hf.get("use_sliding_window", False) or any(t != "full_attention" for t in (hf.get("layer_types") or [])):
        raise AuthorsFormatError("use_sliding_window / layer_types: sliding-window layers are not supported")
    L, D = int(hf["num_hidden_layers"]), int(hf["hidden_size"])
    n_heads = int(hf["num_attention_heads"])
    n_kv = int(hf.get("num_key_value_heads") or n_heads)
    q = tensors.get("model.layers.0.self_attn.q_proj.weight")
    if q is None:
        raise AuthorsFormatError("tensor model.layers.0.self_attn.q_proj.weight is missing")
    head_dim = int(hf.get("head_dim") or q.shape[0] // n_heads)
    if head_dim * n_heads != q.shape[0]:
        raise AuthorsFormatError(f"head_dim {head_dim} x num_attention_heads {n_heads} != q_proj rows {q.shape[0]}")
    if mode in ("full", "full_mh", "full_hw", "block") and "model.final_res_proj.weight" not in tensors:
        raise AuthorsFormatError(f"attnres_mode {mode!r} without model.final_res_proj.weight: an older layout "
                                 "without the final read; not convertible")
    heads = int(hf.get("attnres_num_heads", 8))  # their config's default
    residual: dict = {"routing_impl": routing_impl, "routing_eps": float(hf.get("rms_norm_eps", 1e-6))}
    if mode == "full_mh":
        residual.update(variant="mhar", heads=heads)
    elif mode == "full":
        residual.update(variant="attnres")
    elif mode == "full_hw":
        if heads != 1:
            raise AuthorsFormatError(
                f"attnres_num_heads {heads}: in mode full_hw their MLP and final reads are multi-head; our mhar_hw's "
                "are single-head (convertible only with attnres_num_heads 1)")
        residual.update(variant="mhar_hw")
    else:
        nb = int(hf.get("attnres_num_blocks", 8))
        size = block_size(L, nb)
        if L % size:
            raise AuthorsFormatError(
                f"attnres_num_blocks {nb}: their blocks hold ceil({L}/{nb}) = {size} layers, so the last block has "
                f"{L % size}; our block_attnres splits the {2 * L} sublayers evenly (convertible when the block size "
                f"divides num_hidden_layers)")
        blocks = L // size
        ours = [i * blocks // (2 * L) for i in range(2 * L)]
        theirs = [(i // 2) // size for i in range(2 * L)]
        if ours != theirs:  # pragma: no cover - guaranteed by the divisibility above
            raise AuthorsFormatError(f"attnres_num_blocks {nb}: block assignment differs from block_attnres")
        residual.update(variant="block_attnres", blocks=blocks)
        if blocks != nb:
            notes.append(f"attnres_num_blocks {nb} with {L} layers gives {blocks} blocks of {size} layers")
    if hf.get("attnres_use_null_source"):
        notes.append("attnres_use_null_source: the *_null_source tensors are not read in mode "
                     f"{mode!r} and were dropped")
    theta, scaling = _rope(hf)
    if "lm_head.weight" in tensors:
        tied = bool(hf.get("tie_word_embeddings", False))
    else:
        tied = True
    try:
        cfg = model_config(
            vocab_size=int(hf["vocab_size"]), d_model=D, n_layers=L, n_heads=n_heads, n_kv_heads=n_kv,
            d_ff=int(hf["intermediate_size"]), head_dim=head_dim,
            max_seq_len=int(hf.get("max_position_embeddings", 32768)), rope_theta=theta, rope_scaling=scaling,
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)), init_std=float(hf.get("initializer_range", 0.02)),
            tie_embeddings=tied, qk_norm="model.layers.0.self_attn.q_norm.weight" in tensors, residual=residual)
    except ConfigError as e:
        raise AuthorsFormatError(f"converted config is invalid: {e}") from e
    return cfg, notes


def map_authors_state_dict(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Their tensors -> ``Transformer.state_dict()`` names (fp32); refuses a tensor it cannot place."""
    L, D, S = cfg.n_layers, cfg.d_model, cfg.n_sublayers
    hw = cfg.residual.variant == "mhar_hw"
    G = cfg.n_kv_heads
    out: dict[str, Tensor] = {}
    routing: dict[tuple[int, str], Tensor] = {}  # (site, proj|norm) -> tensor
    for name, t in tensors.items():
        t = t.detach().to(torch.float32)
        m = _ROUTING.match(name)
        if m:
            layer, kind, what = int(m.group(1)), m.group(2), m.group(3)
            routing[(2 * layer + (kind == "mlp"), what)] = t
        elif name in _FINAL:
            routing[(S, _FINAL[name])] = t
        elif _IGNORED.match(name):
            continue
        else:
            ours = our_name(name)
            if ours is None or ours.startswith("residual."):
                raise AuthorsFormatError(f"tensor {name!r} has no place in a {cfg.residual.variant} model")
            if not (cfg.tie_embeddings and ours == "lm_head.weight"):
                out[ours] = t
    missing = [f"site {s} {w}" for s in range(S + 1) for w in ("proj", "norm") if (s, w) not in routing]
    if missing:
        raise AuthorsFormatError(f"routing tensors missing: {missing[:4]} (attn_res_proj/norm, mlp_res_proj/norm "
                                 "per layer, final_res_proj/norm)")
    if hw:
        out["residual.attn_queries"] = torch.stack([routing[(2 * i, "proj")].view(G, D) for i in range(L)])
        out["residual.attn_key_norms"] = torch.stack([routing[(2 * i, "norm")].view(1, D).expand(G, D)
                                                      for i in range(L)]).contiguous()
        sites = [2 * i + 1 for i in range(L)] + [S]
        out["residual.queries"] = torch.stack([routing[(s, "proj")].reshape(D) for s in sites])
        out["residual.key_norms"] = torch.stack([routing[(s, "norm")].reshape(D) for s in sites])
    else:
        for s in range(S + 1):
            if routing[(s, "proj")].numel() != D:
                raise AuthorsFormatError(f"routing query of site {s} has shape {tuple(routing[(s, 'proj')].shape)}, "
                                         f"expected (1, {D})")
        out["residual.queries"] = torch.stack([routing[(s, "proj")].reshape(D) for s in range(S + 1)])
        out["residual.key_norms"] = torch.stack([routing[(s, "norm")].reshape(D) for s in range(S + 1)])
    if cfg.tie_embeddings:
        out["lm_head.weight"] = out["embed.weight"]
    return out


def convert_authors(hf: dict, tensors: dict[str, Tensor], routing_impl: str = "eager"):
    """(ModelConfig, our state dict, notes) of an authors' checkpoint; AuthorsFormatError when not ours."""
    cfg, notes = authors_model_config(hf, tensors, routing_impl)
    return cfg, map_authors_state_dict(tensors, cfg), notes


__all__ = ["MODEL_TYPE", "MODES", "AuthorsFormatError", "authors_model_config", "map_authors_state_dict",
           "convert_authors", "block_size"]
