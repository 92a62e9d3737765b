"""Typed, validated configuration for models (and helpers shared by training/workflow).

Every config object is a dataclass. ``from_dict`` rejects unknown keys and wrong
types with a :class:`ConfigError` that names the offending field, so a typo in
YAML never silently falls back to a default.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from mhar.model.choices import ROUTING_IMPLS, ConfigError, brief, stored_routing_impl
from mhar.model.presets import PRESETS


@dataclass
class ResidualConfig:
    """Which residual scheme connects the sublayers, and its knobs."""

    # A name registered in mhar.model.residuals (``mhar.model.residuals.variant_names()``).
    variant: str = "baseline"
    # Python module that registers ``variant`` when it is defined outside mhar.model.residuals (e.g.
    # mypkg.my_variant): imported when the config is validated or a checkpoint of it is loaded.
    module: Optional[str] = None
    # Routing heads H for `mhar` / `mhar_delta` (must divide d_model). `attnres` is H=1.
    heads: int = 1
    # Hyper-Connections: expansion rate n and static vs dynamic form.
    hyper_n: int = 4
    hyper_dynamic: bool = True
    # Block AttnRes: number of blocks the 2L sublayers are grouped into.
    blocks: int = 8
    # mhar_delta: consecutive transformer layers per delta source (paper: 4).
    delta_block_layers: int = 4
    # open_attnres / open_attnres_full: the gate of the depth read (bias | sigmoid_scalar | sigmoid_vector |
    # learnable_alpha; None: bias) and the initial recency bias on the current state's logit (None: 0.0).
    gate_type: Optional[str] = None
    recency_bias_init: Optional[float] = None
    # Routing implementation (ROUTING_IMPLS): auto (fused on CUDA with Triton, else eager), eager (PyTorch
    # reference), compile (torch.compile of it), fused (Triton kernels). How it runs, not what it computes.
    routing_impl: str = "auto"
    # Key-norm epsilon of the routing RMSNorm.
    routing_eps: float = 1e-6


# The knobs of ResidualConfig that belong to some variants only (each variant class lists those it reads in
# ``knobs``); variant, module, routing_impl and routing_eps apply to every variant (or change nothing).
VARIANT_KNOBS = ("heads", "hyper_n", "hyper_dynamic", "blocks", "delta_block_layers", "gate_type", "recency_bias_init")


def inapplicable_knobs(residual: dict) -> dict[str, str]:
    """The knobs set in a ``model.residual`` mapping that its variant does not read (its class's ``knobs``), each
    with the reason in words; {} for a variant that declares no ``knobs`` (every knob may matter to it)."""
    # Imported here, not above: the registry needs torch, and this module must import without it (as validate).
    from mhar.model.residuals import residual_class

    cls = residual_class(residual.get("variant", ResidualConfig.variant), residual.get("module"))
    if cls.knobs is None:
        return {}
    out = {}
    for knob in VARIANT_KNOBS:
        if knob in residual and knob not in cls.knobs:
            out[knob] = (f"{cls.name} has {cls.fixed_heads} routing head{'s' * (cls.fixed_heads != 1)}"
                         if knob == "heads" and cls.fixed_heads is not None
                         else f"{cls.name} reads {' and '.join(cls.knobs) + ' only' if cls.knobs else 'no such knob'}")
    return out


@dataclass
class ModelConfig:
    """Qwen3-style decoder (Llama-style when qk_norm=False, tie_embeddings=False)."""

    vocab_size: int = 257
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 192
    head_dim: Optional[int] = None  # default d_model // n_heads
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    # Optional Llama-3 style RoPE frequency scaling, e.g.
    # {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    #  "original_max_position_embeddings": 8192}
    rope_scaling: Optional[dict] = None
    norm_eps: float = 1e-6
    init_std: float = 0.02
    tie_embeddings: bool = True
    qk_norm: bool = True
    residual: ResidualConfig = field(default_factory=ResidualConfig)

    @property
    def n_sublayers(self) -> int:
        return 2 * self.n_layers

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    def validate(self) -> "ModelConfig":
        def need(cond: bool, fld: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"model.{fld}: {msg}")

        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            need(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        need(self.n_heads % self.n_kv_heads == 0, "n_kv_heads",
             f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim is None:
            need(self.d_model % self.n_heads == 0, "n_heads",
                 f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; set head_dim explicitly")
        need(self.resolved_head_dim % 2 == 0, "head_dim", "must be even for RoPE")
        r = self.residual
        # The registry is the one list of variant names. Imported here, not above: it needs torch, and this
        # module must import without it (the analysis environment reads configs; residuals/ never imports it).
        from mhar.model.residuals import residual_class

        variant_cls = residual_class(r.variant, r.module)
        need(r.routing_impl in ROUTING_IMPLS, "residual.routing_impl",
             f"unknown routing implementation {brief(r.routing_impl)}; choose one of {', '.join(ROUTING_IMPLS)}"
             + (" (a name of the fused kernels: write fused)" if stored_routing_impl(r.routing_impl) == "fused"
                and r.routing_impl != "fused" else ""))
        need(r.heads >= 1, "residual.heads", f"must be >= 1, got {r.heads}")
        need(self.d_model % r.heads == 0, "residual.heads",
             f"routing heads H={r.heads} must divide d_model={self.d_model}")
        need(r.hyper_n >= 1, "residual.hyper_n", f"must be >= 1, got {r.hyper_n}")
        need(r.routing_eps > 0, "residual.routing_eps", f"must be > 0, got {r.routing_eps}")
        need(self.norm_eps > 0, "norm_eps", f"must be > 0, got {self.norm_eps}")
        need(self.init_std > 0, "init_std", f"must be > 0, got {self.init_std}")
        if self.rope_scaling is not None:
            need("factor" in self.rope_scaling, "rope_scaling",
                 f"needs a 'factor' key (Llama-3 style scaling), got keys {sorted(self.rope_scaling)}")
        need(r.delta_block_layers >= 1, "residual.delta_block_layers", "must be >= 1")
        variant_cls.check_config(self)  # the variant's own constraints (e.g. block_attnres: blocks <= 2L)
        return self


# --- generic dataclass <-> dict with validation ---------------------------------------
def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is bool:
        return isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _key_text(key: Any) -> str:
    """A mapping key as an error message names it: itself when a short string, else :func:`brief`."""
    return key if isinstance(key, str) and len(key) <= 60 and key.isprintable() else brief(key)


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from a plain dict, rejecting unknown keys and bad types."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        where = f"{path}." if path else ""
        named = ", ".join(where + _key_text(k) for k in unknown[:5]) + (
            f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else "")
        raise ConfigError(
            f"unknown config key(s) {named}; "
            f"valid keys{' of ' + path if path else ''}: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for key, value in data.items():
        tp = hints[key]
        fpath = f"{path}.{key}" if path else key
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value, fpath)
            continue
        if not _type_ok(value, tp):
            tname = getattr(tp, "__name__", str(tp))
            raise ConfigError(f"{fpath}: expected {tname}, got {type(value).__name__} ({brief(value)})")
        if tp is float and isinstance(value, int):
            value = float(value)
        kwargs[key] = value
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def model_config(preset: Optional[str] = None, **overrides: Any) -> ModelConfig:
    """Named preset plus overrides; ``residual`` may be a dict or ResidualConfig.

    >>> model_config("debug", residual={"variant": "mhar", "heads": 4})
    """
    data: dict[str, Any] = {}
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise ConfigError(f"model.preset: unknown preset {brief(preset)}; choose one of {', '.join(PRESETS)}")
        data.update(PRESETS[preset].model)
    res = overrides.pop("residual", None)
    data.update(overrides)
    if isinstance(res, ResidualConfig):
        res = dataclasses.asdict(res)
    if res is not None:
        data["residual"] = res
    cfg = from_dict(ModelConfig, data, "model")
    return cfg.validate()


def model_config_from_dict(d: dict) -> ModelConfig:
    """``{"preset": "tiny", "residual": {...}, <overrides>}`` -> validated ModelConfig."""
    d = dict(d)
    preset = d.pop("preset", None)
    return model_config(preset, **d)


def config_hash(obj: Any, length: int = 10) -> str:
    """Stable short hash of a (resolved) config: sha256 of canonical JSON."""
    blob = json.dumps(to_dict(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]
