"""Depth routing: one operation, several implementations behind one Router interface.

A *Router* owns the storage of the sources (so a fused kernel can keep one
shared buffer written once) and computes routed reads:

    router = get_router("eager")            # "eager" | "compile" | "fused" | "fused_v7" | "fused_v5" | "fused_sg4"
    st = router.init(emb, capacity=N_max)   # s_0; capacity = most sources ever held
    h  = router.read(st, query, norm_weight, num_heads, eps)            # (B, T, D)
    h  = router.read(st, q, g, H, eps, extra=partial)   # + one transient source (Block AttnRes)
    h, w = router.read(..., return_weights=True)        # w: (B, T, H, N) fp32
    h  = router.read(st, q, g, H, eps, lookahead=(Q_next, G_next))  # hint: the next reads' queries
    st = router.append(st, out)             # out becomes a new source

Implementations register themselves in ``ROUTERS``; ``mhar.routing.fused``
registers "fused" (kernels v6: source-major, write-once backward), "fused_v5"
(the previous read-major kernels, kept for side-by-side benchmarks) and "fused_sg4"
(v6 with source groups of 4: four sources' gradients from one pass over the later
reads' douts; fewer bytes but slower on the H200, off by default) and "fused_v7" (v6 with a score
table: each source scored once for all reads, forward groups of 4; off by default) when Triton is importable.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch
from torch import Tensor

from .reference import route_reference

__all__ = ["kernel_env", "Router", "EagerRouter", "CompiledRouter", "ROUTERS", "get_router", "route_reference",
           "register_router"]


class Router:
    """Interface. State is opaque to callers."""

    name = "abstract"

    def init(self, first: Tensor, capacity: int):  # -> state
        raise NotImplementedError

    def append(self, state, src: Tensor):  # -> state
        raise NotImplementedError

    def read(self, state, query: Tensor, norm_weight: Tensor, num_heads: int, eps: float = 1e-6, *,
             extra: Optional[Tensor] = None, return_weights: bool = False, lookahead=None):
        """``lookahead``: optional (Q, G), each (M, D), the queries / key norms of the next M reads the caller
        will issue in order, on this state plus the sources it appends meanwhile. A hint: an implementation
        may share one pass over the common prefix of sources among them (fused); others ignore it."""
        raise NotImplementedError

    def num_sources(self, state) -> int:
        raise NotImplementedError


class EagerRouter(Router):
    """Reference: keeps a Python list of sources and stacks them per read."""

    name = "eager"

    def __init__(self, fn: Callable = route_reference):
        self.fn = fn

    def init(self, first: Tensor, capacity: int):
        return [first]

    def append(self, state, src: Tensor):
        return state + [src]

    def num_sources(self, state) -> int:
        return len(state)

    def read(self, state, query, norm_weight, num_heads, eps=1e-6, *, extra=None, return_weights=False,
             lookahead=None):
        srcs = state if extra is None else state + [extra]
        shape = torch.broadcast_shapes(*(s.shape for s in srcs))  # a learnable null source broadcasts
        srcs = [s if s.shape == shape else s.expand(shape) for s in srcs]
        return self.fn(torch.stack(srcs, 0), query, norm_weight, num_heads, eps, return_weights)


class CompiledRouter(EagerRouter):
    """Same math, the per-read function compiled with torch.compile."""

    name = "compile"

    def __init__(self):
        super().__init__(torch.compile(route_reference, dynamic=False))


ROUTERS: dict[str, Callable[[], Router]] = {"eager": EagerRouter, "compile": CompiledRouter}
V7_GROUP = 4  # reads per forward group of routing_impl "fused_v7" (the score table; byte model: traffic_bound)
SOURCE_GROUP = 8  # consecutive sources per backward group pass of routing_impls "fused_sg8" / "fused_v7_sg8"
# defer_groups of routing_impls "fused_v7_sg8_defer" / "_overlap": each source-group pass starts at the backward of
# the read after its newest source's first reader (a side stream), so it overlaps one sublayer's backward; each
# member's completion then covers one read more (byte model: bench_routing_op.v6_bytes(defer_groups=...))
DEFER_READS = 1
KERNEL_ENV_PREFIX = "MHAR_ROUTING_"


# The fused kernels' choice knobs and their values (the first is what an unset variable means; ``_kernels``
# reads them): programmatic dependent launch (MHAR_ROUTING_PDL: unset = on where supported) and the scoring kernel.
KERNEL_CHOICES = {"MHAR_ROUTING_PDL": ("", "0", "1"), "MHAR_ROUTING_SCORE": ("head", "heads")}


def check_kernel_env() -> None:
    """Raise ValueError naming the variable and its values if a ``KERNEL_CHOICES`` knob has another value (the
    trainer checks this before any work, so a typo is one ``error:`` line, not a traceback mid-step)."""
    for var, values in KERNEL_CHOICES.items():
        got = os.environ.get(var, "").strip()
        if got and got not in values:
            raise ValueError(f"{var}={got!r}: set it to one of {', '.join(v for v in values if v)} (or leave it "
                             f"unset: {values[0] or 'on where the GPU supports it'})")


def kernel_env() -> dict[str, str]:
    """The fused kernels' knobs set in this process (``MHAR_ROUTING_*``: autotuning, prefetch, groups,
    programmatic dependent launch; docs/ARCHITECTURE.md), for provenance: they change speed, not results."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(KERNEL_ENV_PREFIX)}


def register_router(name: str, factory: Callable[[], Router]) -> None:
    ROUTERS[name] = factory


def get_router(impl: str) -> Router:
    if impl.startswith("fused") and impl not in ROUTERS:
        try:
            from . import fused  # noqa: F401  (registers itself)
        except ImportError as e:  # pragma: no cover - depends on environment
            raise RuntimeError(
                f"routing_impl='fused' needs Triton, which failed to import ({e}). "
                "Install triton (pip install 'mhar[kernels]') or use routing_impl='eager'/'compile'."
            ) from e
    if impl not in ROUTERS:
        raise ValueError(f"unknown routing implementation {impl!r}; available: {', '.join(ROUTERS)}")
    return ROUTERS[impl]()
