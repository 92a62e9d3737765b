"""Registry of residual variants. ``build_residual(cfg)`` picks by ``cfg.residual.variant``."""
from __future__ import annotations

from typing import Callable

from ..config import ConfigError, ModelConfig
from .base import Residual

RESIDUALS: dict[str, type[Residual]] = {}


def register(name: str) -> Callable[[type[Residual]], type[Residual]]:
    def deco(cls: type[Residual]) -> type[Residual]:
        cls.name = name
        RESIDUALS[name] = cls
        return cls

    return deco


def build_residual(cfg: ModelConfig) -> Residual:
    variant = cfg.residual.variant
    if variant not in RESIDUALS:
        raise ConfigError(
            f"model.residual.variant: {variant!r} has no implementation; registered: {', '.join(sorted(RESIDUALS))}"
        )
    return RESIDUALS[variant](cfg)


# Import modules so they register themselves. Each module is optional while under construction.
import importlib as _importlib

for _mod in ("baseline", "routed", "hyper", "block", "headwise", "delta"):
    try:
        _importlib.import_module(f"{__name__}.{_mod}")
    except ModuleNotFoundError as _e:  # a variant module not written yet
        if _e.name != f"{__name__}.{_mod}":
            raise

__all__ = ["Residual", "RESIDUALS", "register", "build_residual"]
