"""The one ``torch.compile`` setup of the project: the training step (``mhar.training.step``) and inference
(``mhar.model.inference``) compile through ``compile_fn``.

Dynamo's recompile limits are raised once: a graph per sublayer kind (each block's method a frame of its own
where routing calls break the graph), per batch bucket or per cache capacity is expected, and dynamo's default
of 8 would silently fall back to eager after that. Inference asks inductor to keep eager's 16-bit roundings
between fused operations (``emulate_precision_casts``), so compiled bf16 results follow the eager path's; the
training step compiles with inductor's defaults.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

DYNAMO_LIMITS = {"cache_size_limit": 1024, "recompile_limit": 1024, "accumulated_cache_size_limit": 8192,
                 "accumulated_recompile_limit": 8192}


def raise_dynamo_limits() -> None:
    """Raise dynamo's cache / recompile limits to ``DYNAMO_LIMITS`` (a higher setting is kept)."""
    for name, val in DYNAMO_LIMITS.items():
        if hasattr(torch._dynamo.config, name) and getattr(torch._dynamo.config, name) < val:
            setattr(torch._dynamo.config, name, val)


def compile_fn(fn: Callable, backend: str = "inductor", *, inference: bool = False, **kwargs: Any) -> Callable:
    """``torch.compile(fn)`` with the project's settings (see the module docstring); ``kwargs`` go to
    ``torch.compile`` (``fullgraph``, ``dynamic``)."""
    raise_dynamo_limits()
    if backend != "inductor":
        kwargs["backend"] = backend
    elif inference:
        kwargs["options"] = {"emulate_precision_casts": True}
    return torch.compile(fn, **kwargs)


__all__ = ["DYNAMO_LIMITS", "compile_fn", "raise_dynamo_limits"]
