"""The trainer's validation: the token-weighted mean loss over the fixed validation set, the check that
every weight is finite, and the depth weights of a routed variant on the first validation micro-batch (what the
trackers show). All are collective calls under DDP / FSDP2 (every rank takes part)."""
from __future__ import annotations

import torch
from torch import nn

from mhar.data.batches import TrainData
from mhar.runs.config import RunConfig
from mhar.training.distributed import DistEnv, all_reduce_sum, even_batches
from mhar.training.step import autocast_for, micro_forward

__all__ = ["evaluate", "weights_finite", "routing_weights"]


@torch.no_grad()
def evaluate(model: nn.Module, data: TrainData, cfg: RunConfig, env: DistEnv) -> float:
    """Token-weighted mean loss over the fixed validation set (identical at every evaluation)."""
    model.eval()
    autocast = autocast_for(env.device, cfg.train.dtype)
    total = torch.zeros(2, dtype=torch.float64, device=env.device)
    # equal forward counts on every rank (FSDP2 gathers parameters in each); padding has weight 0
    for x, y, w in even_batches(list(data.val_batches(cfg.train.micro_batch, env.rank, env.world_size)), env):
        x, y = x.to(env.device), y.to(env.device)
        loss = micro_forward(model, x, y, autocast)[0]
        total += w * torch.stack([loss.double() * y.numel(), torch.tensor(float(y.numel()), device=env.device).double()])
    total = all_reduce_sum(total, env)
    model.train()
    return float(total[0] / total[1])


def weights_finite(model: nn.Module, env: DistEnv) -> bool:
    """Whether every parameter (every rank's shard) is finite."""
    bad = torch.zeros((), device=env.device)
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        bad += (~torch.isfinite(local.detach())).sum()
    return float(all_reduce_sum(bad, env)) == 0


@torch.no_grad()
def routing_weights(model: nn.Module, data: TrainData, cfg: RunConfig, env: DistEnv) -> dict:
    """Depth weights of a routed variant (site -> (B, T, heads, sources)) on the first validation micro-batch
    (the same batch at every evaluation); {} for a variant without routing."""
    x = even_batches(list(data.val_batches(cfg.train.micro_batch, env.rank, env.world_size)), env)[0][0]
    model.eval()
    with autocast_for(env.device, cfg.train.dtype):
        routing = model(x.to(env.device), collect_routing=True).routing or {}
    model.train()
    return routing
