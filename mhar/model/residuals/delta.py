"""MHAR-delta: routed corrections on top of an intact pre-norm residual stream.

The variant used to continue pretraining an existing (pre-norm) model. The
stream ``x`` is updated exactly as in the baseline (``x <- x + out``); what a
sublayer *sees* gets a gated routed correction:

    h_i   = x + alpha_i * route_i(sources)          alpha_i scalar, init 0
    final = x + alpha_f * route_f(sources)           read before final_norm

Sources: a learnable null source (a zero-init (D,) vector, broadcast over B, T)
plus one *block delta* per completed block of ``delta_block_layers``
consecutive layers, ``delta_b = x(end of block b) - x(start of block b)``, the
true change of the stream across the block. Sublayer i therefore routes over
``1 + (i // (2 * delta_block_layers))`` sources; the final read over
``1 + n_layers / delta_block_layers`` (Marin-8B: 32 layers / 4 -> 9 sources).

With every alpha at 0 the model is the baseline model bit for bit: ``x + 0 * r``
is exactly ``x`` for any finite ``r`` (IEEE: ``0 * r`` is +-0 and ``x + (+-0) == x``),
which is what makes the Llama -> delta conversion in ``mhar.cpt`` exact.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn

from mhar.model.choices import ConfigError
from mhar.model.routing import get_router
from mhar.model.residuals.registry import register
from mhar.model.residuals.base import Residual

if TYPE_CHECKING:
    from mhar.model.config import ModelConfig


class DeltaState(NamedTuple):
    x: Tensor  # (B, T, D) the residual stream
    sources: Any  # Router state: null source + completed block deltas
    block_start: Tensor  # (B, T, D) the stream where the current block began


@register("mhar_delta")
class DeltaAttnRes(Residual):
    """Gated multi-head depth routing over block deltas (``cfg.residual.heads`` heads)."""

    routed = True
    display_name = "MHAR-delta"
    table_order = 6
    shows_heads = True
    knobs = ("heads", "delta_block_layers")

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        r = cfg.residual
        if r.delta_block_layers < 1 or cfg.n_layers % r.delta_block_layers:
            raise ConfigError(
                f"model.residual.delta_block_layers: {r.delta_block_layers} must be >= 1 and divide "
                f"model.n_layers={cfg.n_layers} (each delta covers that many whole layers); "
                f"choose one of {[k for k in range(1, cfg.n_layers + 1) if cfg.n_layers % k == 0]}"
            )

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.check_config(cfg)
        r = cfg.residual
        self.heads = r.heads
        self.eps = r.routing_eps
        self.block_sublayers = 2 * r.delta_block_layers
        self.n_blocks = cfg.n_layers // r.delta_block_layers
        n_sites = cfg.n_sublayers + 1  # every sublayer + the final read
        self.null = nn.Parameter(torch.zeros(cfg.d_model))  # (D,)
        self.alphas = nn.Parameter(torch.zeros(n_sites))  # (S,)
        self.queries = nn.Parameter(torch.zeros(n_sites, cfg.d_model))  # (S, D)
        self.key_norms = nn.Parameter(torch.ones(n_sites, cfg.d_model))  # (S, D)
        self.router = get_router(r.routing_impl)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.null)
        nn.init.zeros_(self.alphas)
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norms)

    def num_sources_at(self, site: int) -> int:
        """Sources visible at sublayer ``site`` (``2 * n_layers`` = the final read)."""
        return 1 + site // self.block_sublayers

    def init(self, emb: Tensor) -> DeltaState:
        null = self.null.to(emb.dtype).expand(emb.shape)  # (B, T, D) view, no copy
        return DeltaState(emb, self.router.init(null, capacity=1 + self.n_blocks), emb)

    def _gated(self, state: DeltaState, site: int) -> Tensor:
        q, g = self.queries[site], self.key_norms[site]
        if self.routing_log is None:
            nxt = (self.queries[site + 1:], self.key_norms[site + 1:]) if site < self.n_sublayers else None
            routed = self.router.read(state.sources, q, g, self.heads, self.eps, lookahead=nxt)  # (B, T, D)
        else:
            routed, w = self.router.read(state.sources, q, g, self.heads, self.eps, return_weights=True)
            self.routing_log[self.site_name(site, self.n_sublayers)] = w.detach()
        return state.x + self.alphas[site].to(state.x.dtype) * routed

    def read(self, state: DeltaState, i: int) -> Tensor:
        return self._gated(state, i)

    def write(self, state: DeltaState, i: int, out: Tensor) -> DeltaState:
        x = state.x + out  # the stream stays the baseline's
        if (i + 1) % self.block_sublayers:
            return DeltaState(x, state.sources, state.block_start)
        sources = self.router.append(state.sources, x - state.block_start)  # close a block
        return DeltaState(x, sources, x)

    def readout(self, state: DeltaState) -> Tensor:
        return self._gated(state, self.n_sublayers)
