"""The Router interface every routing implementation follows (``mhar.model.routing`` describes the calls)."""
from __future__ import annotations

from typing import Optional

from torch import Tensor


class Router:
    """Interface. State is opaque to callers.

    ``traceable``: whether dynamo traces this router's ``init`` / ``append`` / ``read`` into a graph (plain
    PyTorch operations on the state), so a compiled forward may span its calls; a router with Python-side state
    that dynamo cannot follow (the fused kernels' bookkeeping) keeps False and runs between compiled pieces.
    ``traceable_on(device)`` is what callers ask (``auto`` answers for the router it picks on ``device``)."""

    name = "abstract"
    traceable = False

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

    def traceable_on(self, device) -> bool:
        """Whether dynamo traces the implementation that runs on ``device`` (see the class docstring)."""
        return self.traceable
