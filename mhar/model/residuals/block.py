"""Block AttnRes (Kimi, arXiv:2603.15031): depth routing over block summaries.

The 2L sublayers are cut into ``residual.blocks`` contiguous blocks (sizes
differ by at most one; sublayer i belongs to block floor(i * blocks / 2L)).
Inside a block the sublayer outputs are added into a running partial sum, as
in a standard residual stream. Each sublayer reads a routed mixture (single
head, zero-init query, own key RMSNorm) over

    b_0 = embedding, b_1..b_{n-1} = completed block sums, and the current partial sum

(the partial sum only exists once the block has at least one output). When the
last sublayer of a block has written, the partial sum becomes the completed
block sum b_n. A final read routes over all block sums before the last norm.
With blocks = 2L every block holds one sublayer and this is exactly AttnRes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from mhar.model.choices import ConfigError
from mhar.model.routing import get_router
from mhar.model.residuals.registry import register
from mhar.model.residuals.base import Residual

if TYPE_CHECKING:
    from mhar.model.config import ModelConfig


@register("block_attnres")
class BlockAttnRes(Residual):
    routed = True
    display_name = "Block AttnRes"
    table_order = 3
    knobs = ("blocks",)

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        if not 1 <= cfg.residual.blocks <= cfg.n_sublayers:
            raise ConfigError(f"model.residual.blocks: must be between 1 and 2*n_layers={cfg.n_sublayers}, "
                              f"got {cfg.residual.blocks}")

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.check_config(cfg)
        self.blocks = cfg.residual.blocks
        self.eps = cfg.residual.routing_eps
        n_sites = cfg.n_sublayers + 1  # every sublayer + the final read
        self.queries = nn.Parameter(torch.zeros(n_sites, cfg.d_model))  # (S, D)
        self.key_norms = nn.Parameter(torch.ones(n_sites, cfg.d_model))  # (S, D)
        self.router = get_router(cfg.residual.routing_impl)
        S = cfg.n_sublayers
        block_of = [i * self.blocks // S for i in range(S)]
        # Sublayers after whose write a block is complete.
        self.closes = frozenset(i for i in range(S) if i == S - 1 or block_of[i + 1] != block_of[i])

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norms)

    def init(self, emb: Tensor):
        # state = (router state holding b_0..b_{n-1}, partial sum of the open block or None)
        return self.router.init(emb, capacity=self.blocks + 1), None

    def _route(self, state, site: int) -> Tensor:
        blocks, partial = state
        q, g = self.queries[site], self.key_norms[site]
        if self.routing_log is None:
            nxt = (self.queries[site + 1:], self.key_norms[site + 1:]) if site < self.n_sublayers else None
            return self.router.read(blocks, q, g, 1, self.eps, extra=partial, lookahead=nxt)
        h, w = self.router.read(blocks, q, g, 1, self.eps, extra=partial, return_weights=True)
        self.routing_log[self.site_name(site, self.n_sublayers)] = w.detach()  # (B, T, 1, N)
        return h

    def read(self, state, i: int) -> Tensor:
        return self._route(state, i)  # (B, T, D)

    def write(self, state, i: int, out: Tensor):
        blocks, partial = state
        partial = out if partial is None else partial + out  # (B, T, D)
        if i in self.closes:
            return self.router.append(blocks, partial), None
        return blocks, partial

    def readout(self, state) -> Tensor:
        return self._route(state, self.n_sublayers)
