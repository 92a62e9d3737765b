"""Hyper-Connections (Zhu et al., arXiv:2409.19606), static and dynamic forms.

The residual stream is widened to n streams H in R^{n x D} (n = ``hyper_n``),
initialised as n copies of the token embedding. Sublayer k owns one
hyper-connection matrix

    HC_k = [[0,   B  ],        B   in R^{1 x n}   depth connection (output -> streams)
            [A_m, A_r]]        A_m in R^{n x 1}   width connection (streams -> sublayer input)
                               A_r in R^{n x n}   width connection (streams -> streams)

and computes, per token,

    h      = A_m^T H                         the sublayer input (then f(RMSNorm(h)))
    H_new  = A_r^T H + B^T f(RMSNorm(h))     the updated streams.

Initialisation (paper): A_m = e_{k mod n}, A_r = I, B = 1. Every stream then
stays equal to the pre-norm residual x, so the network *is* pre-norm at init.
Dynamic form: with Hbar = RMSNorm(H) (per stream, over D, own weight),

    A_m(H) = A_m + s_a * tanh(Hbar W_m)      W_m in R^{D x 1}
    A_r(H) = A_r + s_a * tanh(Hbar W_r)      W_r in R^{D x n}
    B(H)   = B   + s_b * tanh(Hbar W_b)^T    W_b in R^{D}

with W = 0 and s_a = s_b = 0.01 at init. The paper's readout sums the n streams
before the final RMSNorm; we average them instead. RMSNorm is scale invariant,
so the two differ only in the norm's effective epsilon
(RMSNorm(n y; eps) = RMSNorm(y; eps/n^2)); averaging makes the readout at init
exactly the pre-norm stream x, so the whole network equals pre-norm at init.
This variant has no routing weights.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor, nn

from mhar.model.residuals.registry import register
from mhar.model.residuals.base import Residual

if TYPE_CHECKING:
    from mhar.model.config import ModelConfig


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


class HyperConnection(nn.Module):
    """The hyper-connection of one sublayer (index k): static part plus optional dynamic part."""

    def __init__(self, d_model: int, n: int, k: int, dynamic: bool, eps: float):
        super().__init__()
        self.n, self.k, self.dynamic, self.eps = n, k, dynamic, eps
        self._pending: Optional[tuple[Tensor, Tensor, Tensor]] = None  # coefficients from width_input
        # Column 0 is A_m, columns 1..n are A_r (the paper's width-connection block of HC).
        self.static_alpha = nn.Parameter(torch.empty(n, n + 1))  # (n, n+1)
        self.static_beta = nn.Parameter(torch.empty(n))  # (n,)  = B
        if dynamic:
            self.norm_weight = nn.Parameter(torch.empty(d_model))  # (D,)
            self.dynamic_alpha_fn = nn.Parameter(torch.empty(d_model, n + 1))  # (D, n+1) = [W_m | W_r]
            self.dynamic_alpha_scale = nn.Parameter(torch.empty(()))  # s_a
            self.dynamic_beta_fn = nn.Parameter(torch.empty(d_model))  # (D,) = W_b
            self.dynamic_beta_scale = nn.Parameter(torch.empty(()))  # s_b
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.static_alpha.zero_()
            self.static_alpha[self.k % self.n, 0] = 1.0  # A_m = e_{k mod n}
            self.static_alpha[:, 1:] = torch.eye(self.n)  # A_r = I
            self.static_beta.fill_(1.0)  # B = 1
            if self.dynamic:
                self.norm_weight.fill_(1.0)
                self.dynamic_alpha_fn.zero_()
                self.dynamic_alpha_scale.fill_(0.01)
                self.dynamic_beta_fn.zero_()
                self.dynamic_beta_scale.fill_(0.01)

    def coefficients(self, H: Tensor) -> tuple[Tensor, Tensor]:
        """alpha = [A_m | A_r] (B, T, n, n+1) or (n, n+1); beta = B (B, T, n) or (n,)."""
        if not self.dynamic:
            return self.static_alpha, self.static_beta
        Hn = _rms_norm(H, self.norm_weight, self.eps)  # (B, T, n, D)
        alpha = self.static_alpha + self.dynamic_alpha_scale * torch.tanh(Hn @ self.dynamic_alpha_fn)  # (B,T,n,n+1)
        beta = self.static_beta + self.dynamic_beta_scale * torch.tanh(Hn @ self.dynamic_beta_fn)  # (B, T, n)
        return alpha, beta

    def width_input(self, H: Tensor) -> Tensor:
        """h = A_m^T H: the sublayer input (B, T, D) from streams H (B, T, n, D)."""
        alpha, beta = self.coefficients(H)
        self._pending = (H, alpha, beta)  # the matching update() reuses them (same H, same sublayer)
        a_m = alpha[..., 0]  # (B, T, n) or (n,)
        return torch.einsum("...j,...jd->...d", a_m.to(H.dtype), H)  # (B, T, D)

    def update(self, H: Tensor, out: Tensor) -> Tensor:
        """H_new = A_r^T H + B^T out: streams (B, T, n, D) after the sublayer output out (B, T, D)."""
        pending, self._pending = self._pending, None  # never keep activations alive
        if pending is not None and pending[0] is H:
            _, alpha, beta = pending
        else:
            alpha, beta = self.coefficients(H)
        a_r = alpha[..., 1:].to(H.dtype)  # (B, T, n, n) or (n, n); a_r[j, i] feeds stream j into stream i
        skip = torch.einsum("...ji,...jd->...id", a_r, H)  # (B, T, n, D)
        return skip + beta.to(H.dtype).unsqueeze(-1) * out.unsqueeze(-2)  # (B, T, n, D)


@register("hyper")
class HyperConnections(Residual):
    """n-stream hyper-connections; ``residual.hyper_dynamic`` picks DHC (True) or SHC (False)."""

    display_name = "hyper-conn"
    table_order = 1
    knobs = ("hyper_n", "hyper_dynamic")

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        r = cfg.residual
        self.n = r.hyper_n
        self.connections = nn.ModuleList(
            HyperConnection(cfg.d_model, r.hyper_n, k, r.hyper_dynamic, cfg.norm_eps) for k in range(cfg.n_sublayers)
        )

    def reset_parameters(self) -> None:
        for hc in self.connections:
            hc.reset_parameters()

    def init(self, emb: Tensor) -> Tensor:
        return emb.unsqueeze(-2).expand(*emb.shape[:-1], self.n, emb.shape[-1])  # (B, T, n, D)

    def read(self, state: Tensor, i: int) -> Tensor:
        return self.connections[i].width_input(state)  # (B, T, D)

    def write(self, state: Tensor, i: int, out: Tensor) -> Tensor:
        return self.connections[i].update(state, out)  # (B, T, n, D)

    def readout(self, state: Tensor) -> Tensor:
        return state.mean(-2)  # (B, T, D); see module docstring (sum vs mean)
