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
