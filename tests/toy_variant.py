"""A residual variant defined outside mhar.model.residuals (tests/model/test_residuals.py trains it through mhar.train).

``toy_gated``: the pre-norm residual with one learnable scalar gate per sublayer, x <- x + g_i f(x),
every g_i initialised to 1, so at initialisation the model is the baseline exactly. Registering it is the
whole of adding a variant: this module plus ``model.residual.module: tests.toy_variant`` in the config.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from mhar.model.config import ConfigError, ModelConfig
from mhar.model.residuals import register
from mhar.model.residuals.base import Residual


@register("toy_gated")
class GatedResidual(Residual):
    display_name = "toy gated residual"  # what tables and the model card call it
    table_order = 90

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        if cfg.residual.heads != 1:
            raise ConfigError(f"model.residual.heads: toy_gated has no routing heads, got {cfg.residual.heads}")

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.gates = nn.Parameter(torch.ones(cfg.n_sublayers))  # (2L,)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.gates)

    def init(self, emb: Tensor) -> Tensor:
        return emb

    def read(self, state: Tensor, i: int) -> Tensor:
        return state

    def write(self, state: Tensor, i: int, out: Tensor) -> Tensor:
        return state + self.gates[i].to(out.dtype) * out

    def readout(self, state: Tensor) -> Tensor:
        return state
