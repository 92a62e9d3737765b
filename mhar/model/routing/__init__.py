"""Depth routing: one operation behind one Router interface (``base.Router``).

A *Router* owns the storage of the sources (so the fused kernels keep one shared buffer written once) and
computes routed reads:

    router = get_router("auto")             # one of mhar.model.choices.ROUTING_IMPLS: auto | eager | compile | fused
    st = router.init(emb, capacity=N_max)   # s_0; capacity = most sources ever held
    h  = router.read(st, query, norm_weight, num_heads, eps)            # (B, T, D)
    h  = router.read(st, q, g, H, eps, extra=partial)   # + one transient source (Block AttnRes)
    h, w = router.read(..., return_weights=True)        # w: (B, T, H, N) fp32
    h  = router.read(st, q, g, H, eps, lookahead=(Q_next, G_next))  # hint: the next reads' queries
    st = router.append(st, out)             # out becomes a new source

``eager`` is the PyTorch reference (``reference.route_reference``), ``compile`` the same compiled, ``fused``
the Triton kernels (``fused.FusedRouter``), ``auto`` fused on CUDA when Triton imports, else eager, decided
from the device of each forward's first source (``resolve_routing_impl``). ``DecodeRouter`` routes the few
positions of a decode step (``reference.route_slots_reference``; the Triton kernel ``decode.decode_read`` as its
fast path); the inference paths swap it in for the model's router. ``routing_traceable(model, device)``: whether
dynamo traces a model's routing there (each router's ``traceable_on``), which decides the compile regions of the
training step and of inference.
"""
from __future__ import annotations

from mhar.model.routing.names import check_kernel_env, kernel_env, resolve_routing_impl
from mhar.model.routing.reference import route_reference
from mhar.model.routing.base import Router
from mhar.model.routing.routers import (ROUTERS, AutoRouter, CompiledRouter, DecodeRouter, EagerRouter, get_router,
                                        routing_info, routing_traceable)

__all__ = ["Router", "EagerRouter", "CompiledRouter", "AutoRouter", "DecodeRouter", "ROUTERS", "get_router",
           "route_reference", "resolve_routing_impl", "routing_info", "routing_traceable", "check_kernel_env",
           "kernel_env"]
