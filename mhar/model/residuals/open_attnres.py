"""Open AttnRes: depth attention over cumulative states with a recency bias (the released AttnRes layout).

The residual stream is kept: x_0 = embedding, x_{i+1} = x_i + f_i(RMSNorm(h_i)) for the 2L sublayers
(attn0, mlp0, attn1, ...). What sublayer i sees is a gated depth read over the *states* (not the
outputs) kept so far:

    sources   c_0..c_{N-1} = the closed states (c_0 = x_0, the embedding), then the current state x_i
    k_n       = RMSNorm(c_n; g_i, eps)                        over the full width D
    z_n       = <q_i, k_n> + b_i [n = N-1]                      b_i: the recency bias, on x_i's logit only
    a         = softmax_n(z)
    r_i       = sum_n a_n c_n
    h_i       = gate_i(x_i, r_i)

with one pseudo-query q_i (D,), key-norm weight g_i (D,) and recency bias b_i (scalar) per sublayer.
``residual.gate_type`` picks the gate (``None`` is ``bias``):

    bias             h = r                                     (the read replaces the sublayer input)
    sigmoid_scalar   h = (1 - s) x + s r,  s = sigmoid(l_i)     l_i scalar
    sigmoid_vector   h = (1 - s) x + s r,  s = sigmoid(W_i x + v_i)   W_i (D, D), v_i (D,): per token, per dim
    learnable_alpha  h = (1 - a) x + a r                       a_i scalar, unconstrained

States are closed into the source list (``open_attnres``, block mode) after the MLP sublayer of every layer l
with (l + 1) % P == 0, P = max(1, ceil(L / residual.blocks)) layers per block (ceil(L / P) blocks, which can be
fewer than ``blocks``: L = 28 with blocks = 8 gives P = 4 and 7 blocks); (``open_attnres_full``) after every
sublayer. There is no final read: the final norm reads the stream x_{2L}. A closed state is the stream itself,
so the read that follows a closing sees the same state twice (as the last closed source and as x_i, with the
bias); the first read sees the embedding twice.

Init (zero queries, unit key norms, recency bias ``residual.recency_bias_init`` (None: 0.0), gate logits -2,
vector gate W = 0 and v = -2, alpha 0): with the defaults every depth softmax is uniform over its sources.

No Router: the read is plain PyTorch that the trainer's ``torch.compile`` of the whole decoder fuses (no
Triton kernel); ``residual.routing_impl`` does not apply to this variant.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mhar.model.config import ConfigError, ModelConfig
from mhar.model.residuals.registry import register
from mhar.model.residuals.base import Residual

GATE_TYPES = ("bias", "sigmoid_scalar", "sigmoid_vector", "learnable_alpha")


def layers_per_block(n_layers: int, blocks: int) -> int:
    """P = max(1, ceil(L / blocks)): the layers of one block in block mode (the last block may be shorter)."""
    return max(1, -(-n_layers // blocks))


class OpenState(NamedTuple):
    closed: list  # closed states c_0.. (each (B, T, D)), c_0 = the embedding
    x: Tensor  # (B, T, D) the residual stream


@register("open_attnres")
class OpenAttnRes(Residual):
    """Block mode: a state is closed after the last layer of each block of ``layers_per_block`` layers."""

    routed = True  # zero-init pseudo-queries; its own depth read (no Router), weights logged per site
    display_name = "Open AttnRes (block)"
    table_order = 7
    shows_heads = False
    full = False
    knobs = ("blocks", "gate_type", "recency_bias_init")

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        r = cfg.residual
        if r.gate_type is not None and r.gate_type not in GATE_TYPES:
            raise ConfigError(f"model.residual.gate_type: {r.gate_type!r} is not a gate of {cls.name}; choose one "
                              f"of {', '.join(GATE_TYPES)}")
        if not cls.full and r.blocks < 1:
            raise ConfigError(f"model.residual.blocks: must be >= 1, got {r.blocks}")

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.check_config(cfg)
        r = cfg.residual
        self.gate = r.gate_type or "bias"
        self.bias_init = 0.0 if r.recency_bias_init is None else float(r.recency_bias_init)
        self.eps = r.routing_eps
        S, D = cfg.n_sublayers, cfg.d_model  # one read per sublayer, no final read
        self.queries = nn.Parameter(torch.zeros(S, D))  # (S, D)
        self.key_norms = nn.Parameter(torch.ones(S, D))  # (S, D)
        self.recency_bias = nn.Parameter(torch.zeros(S))  # (S,)
        if self.gate == "sigmoid_scalar":
            self.gate_logits = nn.Parameter(torch.zeros(S))  # (S,)
        elif self.gate == "sigmoid_vector":
            self.gate_weight = nn.Parameter(torch.zeros(S, D, D))  # (S, D_out, D_in)
            self.gate_bias = nn.Parameter(torch.zeros(S, D))  # (S, D)
        elif self.gate == "learnable_alpha":
            self.alphas = nn.Parameter(torch.zeros(S))  # (S,)
        if self.full:
            self.closes = frozenset(range(S))
        else:
            P = layers_per_block(cfg.n_layers, r.blocks)
            self.closes = frozenset(2 * l + 1 for l in range(cfg.n_layers) if (l + 1) % P == 0)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.queries)
        nn.init.ones_(self.key_norms)
        nn.init.constant_(self.recency_bias, self.bias_init)
        if self.gate == "sigmoid_scalar":
            nn.init.constant_(self.gate_logits, -2.0)
        elif self.gate == "sigmoid_vector":
            nn.init.zeros_(self.gate_weight)
            nn.init.constant_(self.gate_bias, -2.0)
        elif self.gate == "learnable_alpha":
            nn.init.zeros_(self.alphas)

    def init(self, emb: Tensor) -> OpenState:
        return OpenState([emb], emb)

    def _depth_read(self, state: OpenState, i: int) -> Tensor:
        """r_i: the biased depth softmax over the closed states and x (fp32 statistics), (B, T, D) fp32."""
        c = torch.stack([*state.closed, state.x], 0).float()  # (N, B, T, D)
        keys = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + self.eps) * self.key_norms[i].float()
        logits = keys @ self.queries[i].float()  # (N, B, T)
        logits = torch.cat([logits[:-1], logits[-1:] + self.recency_bias[i].float()])  # the bias on x's logit
        w = torch.softmax(logits, dim=0)  # (N, B, T)
        if self.routing_log is not None:
            self.routing_log[self.site_name(i, self.n_sublayers)] = w.detach().permute(1, 2, 0).unsqueeze(2)
        return (w.unsqueeze(-1) * c).sum(0)  # (B, T, D)

    def read(self, state: OpenState, i: int) -> Tensor:
        x = state.x
        r = self._depth_read(state, i)
        if self.gate == "bias":
            return r.to(x.dtype)
        if self.gate == "sigmoid_scalar":
            s = torch.sigmoid(self.gate_logits[i].float())
        elif self.gate == "sigmoid_vector":
            s = torch.sigmoid(F.linear(x, self.gate_weight[i], self.gate_bias[i]).float())  # (B, T, D)
        else:
            s = self.alphas[i].float()
        return ((1 - s) * x.float() + s * r).to(x.dtype)

    def write(self, state: OpenState, i: int, out: Tensor) -> OpenState:
        x = state.x + out
        return OpenState(state.closed + [x] if i in self.closes else state.closed, x)

    def readout(self, state: OpenState) -> Tensor:
        return state.x


@register("open_attnres_full")
class OpenAttnResFull(OpenAttnRes):
    """Full mode: the state after every sublayer is closed (``residual.blocks`` does not apply)."""

    display_name = "Open AttnRes (full)"
    table_order = 8
    full = True
    knobs = ("gate_type", "recency_bias_init")
