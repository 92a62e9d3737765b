"""The Router interface and its implementations; ``get_router(name)`` builds one (names: ``mhar.model.config.ROUTING_IMPLS``)."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from mhar.model.config import ROUTING_IMPLS
from mhar.model.routing.names import resolve_routing_impl
from mhar.model.routing.reference import route_reference


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
        will issue in order, on this state plus the sources it appends meanwhile. A hint: the fused router
        scores each source once for all of them and shares passes among them; the others ignore it."""
        raise NotImplementedError

    def num_sources(self, state) -> int:
        raise NotImplementedError

    def impl_for(self, device) -> str:
        """The implementation that runs on ``device`` (its name; ``auto`` resolves)."""
        return self.name


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


class AutoRouter(Router):
    """``auto``: each forward's ``init`` picks the router for the device of its first source
    (``resolve_routing_impl``: fused on CUDA when Triton imports, else eager); that forward's appends and reads
    go to it. ``active`` is the router of the latest forward (None before the first)."""

    name = "auto"

    def __init__(self):
        self._by_device: dict[str, Router] = {}
        self.active: Optional[Router] = None

    def impl_for(self, device) -> str:
        return resolve_routing_impl("auto", device)

    def router_for(self, device) -> Router:
        key = getattr(device, "type", str(device))
        router = self._by_device.get(key)
        if router is None:
            router = self._by_device[key] = get_router(self.impl_for(device))
        return router

    def init(self, first: Tensor, capacity: int):
        router = self.router_for(first.device)
        if router is not self.active:
            self.active = router
        return router.init(first, capacity)

    def append(self, state, src: Tensor):
        return self.active.append(state, src)

    def read(self, state, query, norm_weight, num_heads, eps=1e-6, *, extra=None, return_weights=False,
             lookahead=None):
        return self.active.read(state, query, norm_weight, num_heads, eps, extra=extra,
                                return_weights=return_weights, lookahead=lookahead)

    def num_sources(self, state) -> int:
        return self.active.num_sources(state)


def _fused() -> Router:
    try:
        from mhar.model.routing.fused import FusedRouter
    except ImportError as e:  # pragma: no cover - depends on environment
        raise RuntimeError(
            f"routing_impl='fused' needs Triton, which failed to import ({e}). "
            "Install triton (pip install 'mhar[kernels]') or use routing_impl='auto' / 'eager'."
        ) from e
    return FusedRouter()


# a router for each name of the registry (mhar.model.config.ROUTING_IMPLS), in its order
_FACTORIES: dict[str, Callable[[], Router]] = {"auto": AutoRouter, "eager": EagerRouter, "compile": CompiledRouter,
                                               "fused": _fused}
ROUTERS: dict[str, Callable[[], Router]] = {name: _FACTORIES[name] for name in ROUTING_IMPLS}


def get_router(impl: str) -> Router:
    """A new router of implementation ``impl`` (one of ``mhar.model.config.ROUTING_IMPLS``)."""
    if impl not in ROUTERS:
        raise ValueError(f"unknown routing implementation {impl!r}; choose one of {', '.join(ROUTERS)}")
    return ROUTERS[impl]()


def routing_info(model, device) -> dict:
    """What provenance records about a model's routing on ``device``: ``impl`` (its ``routing_impl``), ``resolved``
    (the implementation that runs there; None for a variant without routing) and ``pdl`` (whether the fused kernels
    launch with programmatic dependent launch)."""
    residual = getattr(model, "residual", None)
    router = getattr(residual, "router", None)
    impl = getattr(getattr(getattr(model, "cfg", None), "residual", None), "routing_impl", None)
    resolved = router.impl_for(device) if router is not None else None
    pdl = False
    if resolved == "fused":
        from mhar.model.routing._kernels import pdl_enabled
        pdl = pdl_enabled(torch.device(device))
    return {"impl": impl, "resolved": resolved, "pdl": pdl}
