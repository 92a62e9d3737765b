"""PyTorch reference of the depth-routing operation (MHAR / AttnRes).

For sources s_0..s_{N-1} (each (B, T, D)), a pseudo-query q (D,) and a key-norm
weight g (D,):

    k_i      = RMSNorm(s_i; g, eps)              over the full width D
    score_ih = <q_h, k_i[h]>                      q and k split into H slices of D/H
    a_ih     = softmax_i(score_ih)                one independent softmax per head h
    out[h]   = sum_i a_ih * s_i[h]                slices concatenated back to D

No temperature and no 1/sqrt(D) scale (paper). H=1 is single-head AttnRes.
Softmax statistics are computed in fp32; the output has the sources' dtype.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def route_reference(
    sources: Tensor,
    query: Tensor,
    norm_weight: Tensor,
    num_heads: int,
    eps: float = 1e-6,
    return_weights: bool = False,
):
    """Depth routing over stacked sources.

    Args:
        sources: (N, B, T, D) stacked sources (values), any float dtype.
        query: (D,) pseudo-query.
        norm_weight: (D,) RMSNorm weight of the keys.
        num_heads: H, must divide D.
        eps: RMSNorm epsilon.
        return_weights: also return the routing weights.

    Returns:
        out (B, T, D) in ``sources.dtype``; with ``return_weights`` also
        weights (B, T, H, N) in fp32.
    """
    N, B, T, D = sources.shape
    H = num_heads
    if D % H:
        raise ValueError(f"num_heads={H} must divide the model width D={D}")
    s32 = sources.float()
    keys = s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()  # (N, B, T, D)
    scores = (keys.view(N, B, T, H, D // H) * query.float().view(H, D // H)).sum(-1)  # (N, B, T, H)
    weights = torch.softmax(scores, dim=0)  # (N, B, T, H)
    out = (weights.unsqueeze(-1) * s32.view(N, B, T, H, D // H)).sum(0)  # (B, T, H, D/H)
    out = out.reshape(B, T, D).to(sources.dtype)
    if return_weights:
        return out, weights.permute(1, 2, 3, 0).contiguous()  # (B, T, H, N)
    return out


def write_slot(buf: Tensor, ms: Tensor, src: Tensor, n: Tensor) -> None:
    """Write source ``src`` (B, T, D), or a broadcast one, into slot ``n`` (0-dim long tensor) of ``buf``
    (cap, B, T, D), and its mean square over D (fp32) into ``ms`` (cap, B, T, 1)."""
    src = src.expand(buf.shape[1:])
    idx = n.view(1)
    buf.index_copy_(0, idx, src.to(buf.dtype).unsqueeze(0))
    ms.index_copy_(0, idx, src.float().pow(2).mean(-1, keepdim=True).unsqueeze(0))


def route_slots_reference(buf: Tensor, ms: Tensor, n: Tensor, query: Tensor, norm_weight: Tensor, num_heads: int,
                          eps: float, extra: Optional[Tensor] = None, pending: Optional[Tensor] = None
                          ) -> tuple[Tensor, Tensor]:
    """``route_reference`` over the first ``n`` slots of a fixed-capacity buffer ``buf`` (cap, B, T, D) whose
    mean squares over D are kept in ``ms`` (cap, B, T, 1) fp32 (+ ``pending``, written to slot n first, +
    ``extra``, read last): ``softmax_n(rsqrt(ms_n + eps) * <s_n[h], (g q)[h]>)`` per head, mixed in fp32 (the
    products' order differs from ``route_reference``: equal to rounding). Every slot is scored (one shape for
    every read, so one compiled graph serves all of a model's reads); unwritten slots get weight exactly 0.

    Returns out (B, T, D) in ``buf.dtype`` and the weights (cap [+ 1], B, T, H) fp32."""
    if pending is not None:
        write_slot(buf, ms, pending, n)
        n = n + 1
    cap, B, T, D = buf.shape
    H = num_heads
    S = buf.float().view(cap, B, T, H, D // H)
    gq = (norm_weight.float() * query.float()).view(H, D // H)
    scores = (S * gq).sum(-1) * torch.rsqrt(ms + eps)  # (cap, B, T, H)
    scores = scores.masked_fill((torch.arange(cap, device=buf.device) >= n).view(cap, 1, 1, 1), float("-inf"))
    if extra is not None:
        E = extra.float().view(1, B, T, H, D // H)
        es = (E * gq).sum(-1) * torch.rsqrt(extra.float().pow(2).mean(-1, keepdim=True) + eps)
        S, scores = torch.cat([S, E]), torch.cat([scores, es])
    w = torch.softmax(scores, dim=0)
    out = (w.unsqueeze(-1) * S).sum(0).reshape(B, T, D).to(buf.dtype)
    return out, w
