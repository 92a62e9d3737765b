"""Attention residuals: single-head AttnRes (Kimi) and multi-head MHAR.

Sources: s_0 = embedding, then the raw output of every sublayer. Each sublayer
and one final read own a pseudo-query q (zero-init: uniform depth softmax at
init) and a key RMSNorm weight g (init 1). Replacement routing: the routed mix
is the sublayer's input; nothing is added to a running stream.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from mhar.model.routing import get_router
from mhar.model.residuals.registry import register
from mhar.model.residuals.base import Residual

if TYPE_CHECKING:
    from mhar.model.config import ModelConfig


@register("mhar")
class MultiHeadAttnRes(Residual):
    """MHAR with H = cfg.residual.heads routing heads (H=1 is AttnRes)."""

    routed = True
    routes_full_depth = True  # probed (eval.probe, the workflow's probe jobs); subclasses inherit it
    display_name = "MHAR"
    table_order = 4
    shows_heads = True
    knobs = ("heads",)

    def __init__(self, cfg: ModelConfig, heads: int | None = None):
        super().__init__(cfg)
        self.heads = cfg.residual.heads if heads is None else heads
        self.eps = cfg.residual.routing_eps
        n_sites = cfg.n_sublayers + 1  # every sublayer + the final read
        self.queries = nn.Parameter(torch.zeros(n_sites, cfg.d_model))  # (S, D)
        self.key_norms = nn.Parameter(torch.ones(n_sites, cfg.d_model))  # (S, D)
        self.router = get_router(cfg.residual.routing_impl)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norms)

    def init(self, emb: Tensor):
        return self.router.init(emb, capacity=self.n_sublayers + 1)

    def _route(self, state, site: int) -> Tensor:
        q, g = self.queries[site], self.key_norms[site]
        if self.routing_log is None:
            nxt = (self.queries[site + 1:], self.key_norms[site + 1:]) if site < self.n_sublayers else None
            return self.router.read(state, q, g, self.heads, self.eps, lookahead=nxt)
        h, w = self.router.read(state, q, g, self.heads, self.eps, return_weights=True)
        self.routing_log[self.site_name(site, self.n_sublayers)] = w.detach()
        return h

    def read(self, state, i: int) -> Tensor:
        return self._route(state, i)

    def write(self, state, i: int, out: Tensor):
        return self.router.append(state, out)

    def readout(self, state) -> Tensor:
        return self._route(state, self.n_sublayers)


@register("attnres")
class AttnRes(MultiHeadAttnRes):
    """Single-head attention residuals (one depth softmax over the full width)."""

    display_name = "single-head (AttnRes)"
    table_order = 2
    shows_heads = False
    fixed_heads = 1
    knobs = ()

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, heads=1)
