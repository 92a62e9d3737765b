"""Pre-norm additive residual: x <- x + f(RMSNorm(x))."""
from __future__ import annotations

from torch import Tensor

from mhar.model.residuals.registry import register
from mhar.model.residuals.base import Residual


@register("baseline")
class PreNormResidual(Residual):
    display_name = "baseline"
    table_order = 0
    knobs = ()

    def init(self, emb: Tensor) -> Tensor:
        return emb

    def read(self, state: Tensor, i: int) -> Tensor:
        return state

    def write(self, state: Tensor, i: int, out: Tensor) -> Tensor:
        return state + out

    def readout(self, state: Tensor) -> Tensor:
        return state
