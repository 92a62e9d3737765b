"""The AttnRes authors' Qwen3-AttnRes checkpoints (``model_type: qwen3_attnres``) -> our residual variants.

Two layouts share the model type; their ``modeling_*.py`` files are read for names and semantics, never
imported or executed here. The tensors decide which one a checkpoint is: ``model.final_res_proj.weight``
(a final read) is the MHAR layout, ``model.layers.{l}.attn_res_bias`` (a recency bias) the released one.

**MHAR layout** (the MHAR repository's ``modeling_qwen3_attnres.py``; modes ``full_mh``, ``full``,
``block``, ``full_hw``). A Qwen3 decoder whose layers carry, per sublayer, a pseudo-query
``attn_res_proj`` / ``mlp_res_proj`` (``nn.Linear(d, 1)``: weight (1, d)) and a key RMSNorm
``attn_res_norm`` / ``mlp_res_norm`` (eps = ``rms_norm_eps``), plus a final read ``model.final_res_proj`` /
``model.final_res_norm`` before ``model.norm``. A read stacks its sources V, keys K = RMSNorm(V) over the full
width, logits = <q, K> (``full_mh``: q and K split into ``attnres_num_heads`` slices, one softmax per slice),
softmax over the sources, output = weights x V; the routed mix is the sublayer's input (``attnres_gate_type:
bias``, the only gate accepted). Sources are sublayer *outputs*:

* ``full_mh`` -> ``mhar`` with H = ``attnres_num_heads``: the embedding, then every sublayer's raw output;
  the final read routes over all 2L + 1.
* ``full`` -> ``attnres`` (the same with one head).
* ``block`` -> ``block_attnres``: layers are grouped ``ceil(L / attnres_num_blocks)`` to a block; at the
  first layer of a block the running partial sum is closed (the embedding closes as block 0); our
  ``block_attnres`` cuts the 2L sublayers into ``blocks`` near-equal groups, so the two agree exactly when
  the block size divides L (converted with ``blocks = L / block size``; otherwise refused).
* ``full_hw`` -> ``mhar_hw`` when ``attnres_num_heads`` is 1 (one full-width query per KV group on the
  attention sublayers: ``attn_res_proj`` weight (G, d), one key norm copied to each group's).

**Released layout** (Open AttnRes, repository ``wdlctc/open-attention-residuals``, ``modeling_attnres.py``:
the published ``wdlctc/open-attnres-*`` models; modes ``block`` -> ``open_attnres``, ``full`` ->
``open_attnres_full``, see :mod:`mhar.model.residuals.open_attnres` for the equations). The residual stream
is kept and the sources are cumulative *states*; per sublayer ``{attn,mlp}_res_proj.weight`` (1, d) ->
``residual.queries[s]``, ``{attn,mlp}_res_norm.weight`` (d,) -> ``residual.key_norms[s]``,
``{attn,mlp}_res_bias`` () -> ``residual.recency_bias[s]`` (s = 2 l for attn, 2 l + 1 for mlp) and the gate of
``attnres_gate_type``: ``sigmoid_scalar``: ``{attn,mlp}_res_gate_logit`` () -> ``residual.gate_logits[s]``;
``sigmoid_vector``: ``{attn,mlp}_res_gate_proj.weight`` (d, d) / ``.bias`` (d,) -> ``residual.gate_weight[s]`` /
``residual.gate_bias[s]``; ``learnable_alpha``: ``{attn,mlp}_res_alpha`` () -> ``residual.alphas[s]``;
``bias``: none. ``attnres_num_blocks`` -> ``residual.blocks`` (same block rule),
``attnres_recency_bias_init`` -> ``residual.recency_bias_init`` (an init value; the stored biases are loaded).

Both: every config.json field read is checked for type and range first (:func:`check_config_fields`: named
as written, with the value and what is allowed); every tensor is placed or the checkpoint is refused naming it
(the MHAR layout's ``*_null_source``, unused by its full / block modes, is dropped with a note); refused, naming
the field: other modes, other gate types, sliding-window attention, attention biases, a non-SiLU MLP, a tensor
whose shape disagrees with config.json.
"""
from __future__ import annotations

import json
import math
import re
from typing import Optional

import torch
from torch import Tensor

from mhar.model.config import ConfigError, ModelConfig, model_config
from mhar.model.residuals.open_attnres import GATE_TYPES
from mhar.hf.names import our_name

MODEL_TYPE = "qwen3_attnres"
MODES = {"full_mh": "mhar", "full": "attnres", "block": "block_attnres", "full_hw": "mhar_hw"}
RELEASED_MODES = {"block": "open_attnres", "full": "open_attnres_full"}
_ROUTING = re.compile(r"^model\.layers\.(\d+)\.(attn|mlp)_res_(proj|norm)\.weight$")
_FINAL = {"model.final_res_proj.weight": "proj", "model.final_res_norm.weight": "norm"}
_IGNORED = re.compile(r"^model\.layers\.\d+\.(attn|mlp)_null_source$")  # unused by the full / block modes
_RELEASED = re.compile(r"^model\.layers\.(\d+)\.(attn|mlp)_res_(.+)$")
_RECENCY = re.compile(r"^model\.layers\.\d+\.(attn|mlp)_res_bias$")
# released layout: tensor suffix (after ``{attn,mlp}_res_``) -> (our parameter, its shape per site, gate types)
_RELEASED_TENSORS = {
    "proj.weight": ("queries", "1d", None), "norm.weight": ("key_norms", "d", None),
    "bias": ("recency_bias", "", None), "gate_logit": ("gate_logits", "", "sigmoid_scalar"),
    "gate_proj.weight": ("gate_weight", "dd", "sigmoid_vector"), "gate_proj.bias": ("gate_bias", "d", "sigmoid_vector"),
    "alpha": ("alphas", "", "learnable_alpha")}


class AuthorsFormatError(ValueError):
    """The checkpoint is not (convertibly) one of our variants; the message names the field."""


# --- config.json: the type and range of every field read, checked before anything is built -----------------
_WHOLE, _POSITIVE, _NONNEG, _REAL = "a whole number >= 1", "a finite number > 0", "a finite number >= 0", \
    "a finite number"
_BOOL, _TEXT = "true or false", "a string"
# field -> (what is allowed, null allowed (their code reads it as unset), required)
_FIELDS: dict[str, tuple[str, bool, bool]] = {
    "vocab_size": (_WHOLE, False, True), "hidden_size": (_WHOLE, False, True),
    "intermediate_size": (_WHOLE, False, True), "num_hidden_layers": (_WHOLE, False, True),
    "num_attention_heads": (_WHOLE, False, True), "num_key_value_heads": (_WHOLE, True, False),
    "head_dim": (_WHOLE, True, False), "max_position_embeddings": (_WHOLE, False, False),
    "rms_norm_eps": (_POSITIVE, False, False), "initializer_range": (_NONNEG, False, False),
    "rope_theta": (_POSITIVE, False, False), "tie_word_embeddings": (_BOOL, False, False),
    "attention_bias": (_BOOL, False, False), "use_sliding_window": (_BOOL, False, False),
    "hidden_act": (_TEXT, False, False), "attnres_mode": (_TEXT, False, False),
    "attnres_gate_type": (_TEXT, False, False), "attnres_num_blocks": (_WHOLE, False, False),
    "attnres_num_heads": (_WHOLE, False, False), "attnres_recency_bias_init": (_REAL, True, False),
    "attnres_use_null_source": (_BOOL, True, False)}
_ROPE_FIELDS = {"rope_theta": _POSITIVE, "rope_type": _TEXT, "type": _TEXT, "factor": _POSITIVE,
                "low_freq_factor": _POSITIVE, "high_freq_factor": _POSITIVE, "original_max_position_embeddings": _WHOLE}
_LLAMA3 = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _fits(value, kind: str) -> bool:
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _TEXT:
        return isinstance(value, str)
    if isinstance(value, bool):  # JSON true is not the number 1
        return False
    if kind == _WHOLE:
        return isinstance(value, int) and value >= 1
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > 0 if kind == _POSITIVE else value >= 0 if kind == _NONNEG else True


def _shown(value) -> str:
    """The value as config.json writes it (JSON), at most 60 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_config_fields(hf: dict) -> None:
    """Refuse (AuthorsFormatError naming the field as config.json writes it, its value and what is allowed) a
    field read by the conversion that has the wrong type or range, before anything is built: whole numbers >= 1
    for the sizes and ``attnres_num_blocks`` (their blocks hold max(1, ceil(L / attnres_num_blocks)) layers: 0
    divides by zero in their code, 1.5 is not a count), finite numbers for the epsilon, RoPE and
    ``attnres_recency_bias_init``, booleans and strings where their config has them; ``num_key_value_heads``
    divides ``num_attention_heads``; ``layer_types`` has one entry per layer."""
    for name, (kind, nullable, required) in _FIELDS.items():
        if name not in hf:
            if required:
                raise AuthorsFormatError(f"config.json has no {name} ({kind})")
            continue
        value = hf[name]
        if not (value is None and nullable) and not _fits(value, kind):
            raise AuthorsFormatError(f"{name} {_shown(value)} in config.json is not {kind}")
    for group in ("rope_parameters", "rope_scaling"):
        sub = hf.get(group)
        if sub is not None and not isinstance(sub, dict):
            raise AuthorsFormatError(f"{group} {_shown(sub)} in config.json is not an object (or null)")
        for key, kind in _ROPE_FIELDS.items():
            if sub and key in sub and not _fits(sub[key], kind):
                raise AuthorsFormatError(f"{group}.{key} {_shown(sub[key])} in config.json is not {kind}")
    L, heads, kv = hf["num_hidden_layers"], hf["num_attention_heads"], hf.get("num_key_value_heads")
    if kv is not None and heads % kv:
        raise AuthorsFormatError(f"num_key_value_heads {kv} in config.json does not divide num_attention_heads "
                                 f"{heads} (each key/value head serves a whole group of query heads)")
    types = hf.get("layer_types")
    if types is not None and not (isinstance(types, list) and len(types) == L and all(isinstance(t, str)
                                                                                     for t in types)):
        raise AuthorsFormatError(f"layer_types {_shown(types)} in config.json is not a list of num_hidden_layers "
                                 f"({L}) strings (or null)")


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
    missing = [k for k in _LLAMA3 if k not in scaling]
    if missing:
        raise AuthorsFormatError(f"rope_parameters.{missing[0]} is missing (rope_type llama3 needs "
                                 f"{', '.join(_LLAMA3)})")
    return float(theta), {k: scaling[k] for k in _LLAMA3}


def block_size(n_layers: int, num_blocks: int) -> int:
    """Layers per block in their ``block`` mode: max(1, ceil(L / attnres_num_blocks))."""
    return max(1, -(-n_layers // num_blocks))


def layout(hf: dict, tensors: dict[str, Tensor]) -> str:
    """``"mhar"`` (a final read: ``model.final_res_proj.weight``) or ``"released"`` (recency biases
    ``model.layers.{l}.{attn,mlp}_res_bias``); refuses a checkpoint that is neither or both."""
    final = "model.final_res_proj.weight" in tensors
    recency = any(_RECENCY.match(k) for k in tensors)
    if final and recency:
        raise AuthorsFormatError("the checkpoint holds both model.final_res_proj.weight (MHAR layout) and *_res_bias "
                                 "tensors (released Open AttnRes layout): not one of the two layouts")
    if final:
        if "attnres_recency_bias_init" in hf:
            raise AuthorsFormatError("attnres_recency_bias_init is a field of the released Open AttnRes layout, but "
                                     "the checkpoint has model.final_res_proj.weight (MHAR layout)")
        return "mhar"
    if recency:
        return "released"
    raise AuthorsFormatError(
        f"attnres_mode {hf.get('attnres_mode', 'block')!r} without model.final_res_proj.weight (MHAR layout) or "
        "model.layers.0.attn_res_bias (released Open AttnRes layout): not a layout we can convert")


def _decoder_config(hf: dict, tensors: dict[str, Tensor]) -> dict:
    """``model_config`` fields of the Qwen3 decoder shared by both layouts (everything but ``residual``)."""
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
    theta, scaling = _rope(hf)
    tied = bool(hf.get("tie_word_embeddings", False)) if "lm_head.weight" in tensors else True
    return dict(vocab_size=int(hf["vocab_size"]), d_model=D, n_layers=L, n_heads=n_heads, n_kv_heads=n_kv,
                d_ff=int(hf["intermediate_size"]), head_dim=head_dim,
                max_seq_len=int(hf.get("max_position_embeddings", 32768)), rope_theta=theta, rope_scaling=scaling,
                norm_eps=float(hf.get("rms_norm_eps", 1e-6)), init_std=float(hf.get("initializer_range", 0.02)),
                tie_embeddings=tied, qk_norm="model.layers.0.self_attn.q_norm.weight" in tensors)


def _model_config(fields: dict, residual: dict) -> ModelConfig:
    try:
        return model_config(**fields, residual=residual)
    except ConfigError as e:
        raise AuthorsFormatError(f"converted config is invalid: {e}") from e


def _mhar_layout_config(hf: dict, tensors: dict[str, Tensor], routing_impl: str) -> tuple[ModelConfig, list[str]]:
    notes: list[str] = []
    mode = hf.get("attnres_mode", "block")
    if mode not in MODES:
        raise AuthorsFormatError(
            f"attnres_mode {mode!r} has no equivalent residual variant here (convertible: "
            f"{', '.join(f'{k} -> {v}' for k, v in MODES.items())})")
    gate = hf.get("attnres_gate_type", "bias")
    if gate != "bias":
        raise AuthorsFormatError(f"attnres_gate_type {gate!r}: in the MHAR layout only 'bias' (the routed mix is the "
                                 "sublayer input as is) matches our variants")
    fields = _decoder_config(hf, tensors)
    L, D = fields["n_layers"], fields["d_model"]
    heads = int(hf.get("attnres_num_heads", 8))  # their config's default
    residual: dict = {"routing_impl": routing_impl, "routing_eps": float(hf.get("rms_norm_eps", 1e-6))}
    if mode == "full_mh":
        if D % heads:
            raise AuthorsFormatError(f"attnres_num_heads {heads} in config.json does not divide hidden_size {D} (one "
                                     "depth softmax per equal slice of the width)")
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
        residual.update(variant="block_attnres", blocks=blocks)
        if blocks != nb:
            notes.append(f"attnres_num_blocks {nb} with {L} layers gives {blocks} blocks of {size} layers")
    if hf.get("attnres_use_null_source"):
        notes.append("attnres_use_null_source: the *_null_source tensors are not read in mode "
                     f"{mode!r} and were dropped")
    return _model_config(fields, residual), notes


def _released_layout_config(hf: dict, tensors: dict[str, Tensor]) -> tuple[ModelConfig, list[str]]:
    mode = hf.get("attnres_mode", "block")
    if mode not in RELEASED_MODES:
        raise AuthorsFormatError(
            f"attnres_mode {mode!r} is not a mode of the released Open AttnRes layout (convertible: "
            f"{', '.join(f'{k} -> {v}' for k, v in RELEASED_MODES.items())})")
    gate = hf.get("attnres_gate_type", "bias")
    if gate not in GATE_TYPES:
        raise AuthorsFormatError(f"attnres_gate_type {gate!r} is not a gate of the released Open AttnRes layout "
                                 f"(convertible: {', '.join(GATE_TYPES)})")
    fields = _decoder_config(hf, tensors)
    residual: dict = {"variant": RELEASED_MODES[mode], "gate_type": gate, "routing_impl": "eager",
                      "routing_eps": float(hf.get("rms_norm_eps", 1e-6))}
    if mode == "block":
        residual["blocks"] = int(hf.get("attnres_num_blocks", 8))  # their config's default
    if hf.get("attnres_recency_bias_init") is not None:
        residual["recency_bias_init"] = float(hf["attnres_recency_bias_init"])
    notes = []
    if mode == "block":
        L, nb = fields["n_layers"], residual["blocks"]
        P = block_size(L, nb)
        if -(-L // P) != nb:
            notes.append(f"attnres_num_blocks {nb} with {L} layers gives {-(-L // P)} blocks of up to {P} layers")
    return _model_config(fields, residual), notes


def authors_model_config(hf: dict, tensors: dict[str, Tensor],
                         routing_impl: str = "eager") -> tuple[ModelConfig, list[str]]:
    """Our ModelConfig for an authors' ``config.json`` (+ its tensors, for the layout and shapes); (config, notes)."""
    if hf.get("model_type") != MODEL_TYPE:
        raise AuthorsFormatError(f"model_type {hf.get('model_type')!r} is not {MODEL_TYPE!r}")
    check_config_fields(hf)
    if layout(hf, tensors) == "released":
        return _released_layout_config(hf, tensors)
    return _mhar_layout_config(hf, tensors, routing_impl)


def _decoder_tensor(name: str, t: Tensor, cfg: ModelConfig, out: dict[str, Tensor]) -> None:
    ours = our_name(name)
    if ours is None or ours.startswith("residual."):
        raise AuthorsFormatError(f"tensor {name!r} has no place in a {cfg.residual.variant} model")
    if not (cfg.tie_embeddings and ours == "lm_head.weight"):
        out[ours] = t


def _map_mhar_layout(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
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
            want = D if what == "norm" else (G * D if hw and kind == "attn" else D)
            if layer >= L or t.numel() != want:
                raise AuthorsFormatError(f"tensor {name!r} has shape {tuple(t.shape)}; config.json (hidden_size {D}, "
                                         f"num_hidden_layers {L}) has no such routing tensor")
            routing[(2 * layer + (kind == "mlp"), what)] = t
        elif name in _FINAL:
            if t.numel() != D:
                raise AuthorsFormatError(f"tensor {name!r} has shape {tuple(t.shape)}, config.json implies ({D},)")
            routing[(S, _FINAL[name])] = t
        elif _IGNORED.match(name):
            continue
        else:
            _decoder_tensor(name, t, cfg, out)
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
        out["residual.queries"] = torch.stack([routing[(s, "proj")].reshape(D) for s in range(S + 1)])
        out["residual.key_norms"] = torch.stack([routing[(s, "norm")].reshape(D) for s in range(S + 1)])
    return out


def _map_released_layout(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    L, D, S = cfg.n_layers, cfg.d_model, cfg.n_sublayers
    gate = cfg.residual.gate_type or "bias"
    shapes = {"1d": (1, D), "d": (D,), "dd": (D, D), "": ()}
    wanted = {ours: shapes[shape] for ours, shape, g in _RELEASED_TENSORS.values() if g in (None, gate)}
    out: dict[str, Tensor] = {}
    per_site: dict[str, dict[int, Tensor]] = {ours: {} for ours in wanted}
    for name, t in tensors.items():
        t = t.detach().to(torch.float32)
        m = _RELEASED.match(name)
        if m is None:
            _decoder_tensor(name, t, cfg, out)
            continue
        layer, kind, suffix = int(m.group(1)), m.group(2), m.group(3)
        ours, shape, g = _RELEASED_TENSORS.get(suffix, (None, None, None))
        if ours is None or layer >= L:
            raise AuthorsFormatError(f"tensor {name!r} has no place in a {cfg.residual.variant} model "
                                     f"(num_hidden_layers {L})")
        if ours not in wanted:
            raise AuthorsFormatError(f"tensor {name!r} belongs to attnres_gate_type {g!r}, but config.json says "
                                     f"{gate!r}")
        if tuple(t.shape) != wanted[ours]:
            raise AuthorsFormatError(f"tensor {name!r} has shape {tuple(t.shape)}, config.json (hidden_size {D}) "
                                     f"implies {wanted[ours]}")
        per_site[ours][2 * layer + (kind == "mlp")] = t
    for ours, sites in per_site.items():
        missing = [s for s in range(S) if s not in sites]
        if missing:
            s = missing[0]
            suffix = next(k for k, v in _RELEASED_TENSORS.items() if v[0] == ours)
            raise AuthorsFormatError(f"tensor model.layers.{s // 2}.{'mlp' if s % 2 else 'attn'}_res_{suffix} is "
                                     f"missing ({len(missing)} of the {S} {ours} tensors of a {gate!r} checkpoint)")
        stack = torch.stack([sites[s] for s in range(S)])
        out[f"residual.{ours}"] = stack.reshape(S, D) if ours == "queries" else stack
    return out


def map_authors_state_dict(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Their tensors -> ``Transformer.state_dict()`` names (fp32); refuses a tensor it cannot place."""
    if cfg.residual.variant in RELEASED_MODES.values():
        out = _map_released_layout(tensors, cfg)
    else:
        out = _map_mhar_layout(tensors, cfg)
    if cfg.tie_embeddings and "embed.weight" in out:
        out["lm_head.weight"] = out["embed.weight"]
    return out


def convert_authors(hf: dict, tensors: dict[str, Tensor], routing_impl: str = "eager"):
    """(ModelConfig, our state dict, notes) of an authors' checkpoint; AuthorsFormatError when not ours."""
    cfg, notes = authors_model_config(hf, tensors, routing_impl)
    return cfg, map_authors_state_dict(tensors, cfg), notes


__all__ = ["MODEL_TYPE", "MODES", "RELEASED_MODES", "AuthorsFormatError", "layout", "check_config_fields",
           "authors_model_config", "map_authors_state_dict", "convert_authors", "block_size"]
