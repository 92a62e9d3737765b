"""MHAR-HW (ablation): head-wise attention residuals, one routed mixture per KV group.

Sources and writes are those of AttnRes (embedding, then every sublayer output
appended). The difference is in what the attention sublayers read: sublayer
attention-l owns G = n_kv_heads full-width pseudo-queries (each with its own
key RMSNorm weight); query g gives one single-head routed mixture over the
sources, and that mixture feeds only KV group g's Q/K/V projections, so
``read`` returns (B, T, G, D) there (``mhar.model.transformer.Attention`` accepts it). MLP
sublayers and the final read use one full-width single-head query as in
AttnRes. All queries are zero-initialised (uniform depth softmax at init).
Parameter overhead over the baseline: 2 D (L G + L + 1).
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


@register("mhar_hw")
class HeadWiseAttnRes(Residual):
    routed = True
    display_name = "MHAR-HW"
    table_order = 5
    knobs = ()  # one query per KV group (model.n_kv_heads), not model.residual.heads

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        L, G, D = cfg.n_layers, cfg.n_kv_heads, cfg.d_model
        self.groups = G
        self.eps = cfg.residual.routing_eps
        self.attn_queries = nn.Parameter(torch.zeros(L, G, D))  # (L, G, D): attention sublayers
        self.attn_key_norms = nn.Parameter(torch.ones(L, G, D))  # (L, G, D)
        self.queries = nn.Parameter(torch.zeros(L + 1, D))  # (L+1, D): MLP sublayers, then the final read
        self.key_norms = nn.Parameter(torch.ones(L + 1, D))  # (L+1, D)
        self.router = get_router(cfg.residual.routing_impl)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.attn_queries)
        nn.init.ones_(self.attn_key_norms)
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norms)

    def init(self, emb: Tensor):
        return self.router.init(emb, capacity=self.n_sublayers + 1)

    def _site_params(self, i: int) -> tuple[Tensor, Tensor]:
        """(Q, D) queries and key norms of site i: Q = G for attention sublayers, else 1."""
        if i < self.n_sublayers and i % 2 == 0:
            return self.attn_queries[i // 2], self.attn_key_norms[i // 2]
        j = self.cfg.n_layers if i >= self.n_sublayers else i // 2
        return self.queries[j : j + 1], self.key_norms[j : j + 1]

    def _route(self, state, i: int) -> list[Tensor]:
        qs, gs = self._site_params(i)
        log = self.routing_log is not None
        outs, weights = [], []
        for q, g in zip(qs, gs):
            r = self.router.read(state, q, g, 1, self.eps, return_weights=log)
            h, w = r if log else (r, None)
            outs.append(h)  # (B, T, D)
            weights.append(w)  # (B, T, 1, N)
        if log:
            self.routing_log[self.site_name(i, self.n_sublayers)] = torch.cat(weights, dim=2).detach()  # (B,T,Q,N)
        return outs

    def read(self, state, i: int) -> Tensor:
        outs = self._route(state, i)
        if i % 2 == 0:
            return torch.stack(outs, dim=2)  # (B, T, G, D): one input per KV group
        return outs[0]  # (B, T, D)

    def write(self, state, i: int, out: Tensor):
        return self.router.append(state, out)

    def readout(self, state) -> Tensor:
        return self._route(state, self.n_sublayers)[0]  # (B, T, D)
