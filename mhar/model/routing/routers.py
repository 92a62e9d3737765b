"""The routers: ``get_router(name)`` builds one per ``mhar.model.choices.ROUTING_IMPLS`` name (auto, eager, compile,
fused); ``DecodeRouter`` routes the few positions of a decode step (``mhar.model.inference``)."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from mhar.model.choices import ROUTING_IMPLS
from mhar.model.compile import compile_fn
from mhar.model.routing.decode import available as decode_kernel_available, decode_read
from mhar.model.routing.base import Router
from mhar.model.routing.names import resolve_routing_impl
from mhar.model.routing.reference import route_reference, route_slots_reference, write_slot


class EagerRouter(Router):
    """Reference: keeps a Python list of sources and stacks them per read."""

    name = "eager"
    traceable = True

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
    """Same math, the per-read function compiled (``mhar.model.compile.compile_fn``)."""

    name = "compile"

    def __init__(self):
        super().__init__(compile_fn(route_reference, dynamic=False))


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

    def traceable_on(self, device) -> bool:
        # builds the router for ``device`` now (kept), so a trace of the next forward finds it made
        return self.router_for(device).traceable_on(device)

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


class _Slots:
    """DecodeRouter state: a fixed-capacity source buffer, the mean squares, the slots written (host int) and the
    newest source, appended but not yet written (the next read writes it)."""

    __slots__ = ("buf", "ms", "n", "pending")

    def __init__(self, buf: Tensor, ms: Tensor, n: int, pending: Optional[Tensor] = None):
        self.buf, self.ms, self.n, self.pending = buf, ms, n, pending


class DecodeRouter(Router):
    """The routing of a few positions (a decode step): ``reference.route_slots_reference``'s function.

    State: one (capacity, B, T, D) buffer of this position's sources, each written once, and each source's mean
    square over D in fp32, computed once when it is written (``route_reference`` recomputes it at every read): a
    read costs O(N d) per token. An append only records the source; the next read writes it (a decode step has
    no launch per append).

    Two implementations of the read: ``kernel=True`` (default on CUDA with Triton): one launch of
    ``decode.decode_read`` (the custom op ``mhar::decode_read``); else ``route_slots_reference`` (plain operations
    dynamo traces; ``compile_fn``, e.g. ``torch.compile``, compiles it once, every read having the same shapes).
    Either way dynamo traces the router (``traceable``).
    """

    name = "decode"
    traceable = True

    def __init__(self, compile_fn: Optional[Callable[[Callable], Callable]] = None, kernel: Optional[bool] = None):
        self._write, self._read = write_slot, route_slots_reference
        if compile_fn is not None:
            self._write, self._read = compile_fn(write_slot), compile_fn(route_slots_reference)
        self.kernel = kernel
        self._slots: dict[torch.device, list[Tensor]] = {}

    def resolve(self, device: torch.device) -> "DecodeRouter":
        """Fix ``kernel`` for ``device`` (None: the kernel where it runs, i.e. CUDA with Triton)."""
        if self.kernel is None:
            self.kernel = decode_kernel_available(device) and device.type == "cuda"
        return self

    def _slot(self, n: int, device: torch.device) -> Tensor:
        """A 0-dim long tensor holding n (one per value: a graph input, never a specialised constant)."""
        slots = self._slots.setdefault(device, [])
        while len(slots) <= n:
            slots.append(torch.tensor(len(slots), dtype=torch.long, device=device))
        return slots[n]

    def _flush(self, state: _Slots) -> None:
        if state.pending is not None:
            self._write(state.buf, state.ms, state.pending, self._slot(state.n, state.buf.device))
            state.n, state.pending = state.n + 1, None

    def init(self, first: Tensor, capacity: int) -> _Slots:
        if first.dim() != 3:
            raise ValueError("DecodeRouter.init: the first source must be (B, T, D) (expand a (D,) null source)")
        buf = torch.zeros((capacity, *first.shape), dtype=first.dtype, device=first.device)
        ms = torch.zeros((capacity, *first.shape[:2], 1), dtype=torch.float32, device=first.device)
        return _Slots(buf, ms, 0, first)

    def append(self, state: _Slots, src: Tensor) -> _Slots:
        self._flush(state)  # two appends without a read between them: write the older one now
        if state.n >= state.buf.shape[0]:
            raise ValueError(f"DecodeRouter: capacity {state.buf.shape[0]} sources exceeded")
        return _Slots(state.buf, state.ms, state.n, src)

    def num_sources(self, state: _Slots) -> int:
        return state.n + (state.pending is not None)

    def read(self, state: _Slots, query: Tensor, norm_weight: Tensor, num_heads: int, eps: float = 1e-6, *,
             extra: Optional[Tensor] = None, return_weights: bool = False, lookahead=None):
        if self.kernel and not return_weights:
            out = decode_read(state.buf, state.ms.view(state.ms.shape[:-1]), state.n, query, norm_weight,
                                     int(num_heads), float(eps), pending=state.pending, extra=extra)
            if state.pending is not None:
                state.n, state.pending = state.n + 1, None
            return out
        out, w = self._read(state.buf, state.ms, self._slot(state.n, state.buf.device), query, norm_weight,
                            int(num_heads), float(eps), extra, state.pending)
        if state.pending is not None:
            state.n, state.pending = state.n + 1, None
        if return_weights:
            cap = state.buf.shape[0]
            keep = list(range(state.n)) + ([cap] if extra is not None else [])
            return out, w[keep].permute(1, 2, 3, 0).contiguous()  # (B, T, H, N)
        return out


def _fused() -> Router:
    try:  # lazy: fused imports triton, an optional dependency; mhar.hf.ship ships this module without it
        from mhar.model.routing.fused import FusedRouter
    except ImportError as e:  # pragma: no cover - depends on environment
        raise RuntimeError(
            f"routing_impl='fused' needs Triton, which failed to import ({e}). "
            "Install triton (pip install 'mhar[kernels]') or use routing_impl='auto' / 'eager'."
        ) from e
    return FusedRouter()


# a router for each name of mhar.model.choices.ROUTING_IMPLS, in its order
_FACTORIES: dict[str, Callable[[], Router]] = {"auto": AutoRouter, "eager": EagerRouter, "compile": CompiledRouter,
                                               "fused": _fused}
ROUTERS: dict[str, Callable[[], Router]] = {name: _FACTORIES[name] for name in ROUTING_IMPLS}


def get_router(impl: str) -> Router:
    """A new router of implementation ``impl`` (one of ``mhar.model.choices.ROUTING_IMPLS``)."""
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
        from mhar.model.routing._kernels import pdl_enabled  # lazy: triton, as _fused above
        pdl = pdl_enabled(torch.device(device))
    return {"impl": impl, "resolved": resolved, "pdl": pdl}


def routing_traceable(model, device) -> bool:
    """Whether dynamo traces the model's routing on ``device``: no router, or one whose ``traceable_on(device)``
    holds. What the training step and the inference paths decide their compile regions by."""
    router = getattr(getattr(model, "residual", None), "router", None)
    return router is None or router.traceable_on(device)
