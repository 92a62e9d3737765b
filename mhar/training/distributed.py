"""Process-group set-up and model wrapping (DDP, or FSDP2 for the large presets).

Under ``torchrun`` (``WORLD_SIZE`` > 1) :func:`init_distributed` joins the process group
(NCCL on GPU, gloo on CPU); otherwise it returns a single-process environment and nothing
here touches ``torch.distributed``. The model itself knows nothing of this module.
"""
from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["DistEnv", "init_distributed", "shutdown", "barrier", "all_reduce_mean", "all_reduce_sum",
           "wrap_model", "no_grad_sync", "cuda_missing", "resolve_device", "gather_batches", "even_batches",
           "full_state", "load_full_state", "full_model_state"]


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    parallel: str = "none"  # none | ddp | fsdp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def cuda_missing(device: Optional[str], asked: str, instead: str) -> Optional[str]:
    """The error line when ``device`` names a CUDA device and none is visible to this process (None: one is,
    or ``device`` is not CUDA): one wording for training and evaluation. ``asked`` is the setting as the user
    spelt it (``train.device=cuda``, ``--device cuda``), ``instead`` what to set (``train.device=cpu``)."""
    if device is None or not str(device).startswith("cuda") or torch.cuda.is_available():
        return None
    return (f"{asked} but no CUDA device is visible to this process; use {instead}, or run where a GPU is "
            "available (check CUDA_VISIBLE_DEVICES)")


def resolve_device(pref: str, local_rank: int = 0) -> torch.device:
    if pref == "cuda" or (pref == "auto" and torch.cuda.is_available()):
        missing = cuda_missing("cuda", "train.device=cuda", "train.device=cpu (or auto)")
        if missing:
            raise RuntimeError(missing)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def launch_rank() -> int:
    """This process's rank as torchrun set it (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def init_distributed(device_pref: str = "auto", parallel: str = "ddp") -> DistEnv:
    """Join the process group when launched by torchrun (or with RANK/WORLD_SIZE set)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = launch_rank()
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    device = resolve_device(device_pref, local)
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                    rank=rank, world_size=world)
    return DistEnv(rank, world, local, device, parallel if world > 1 else "none")


def shutdown(env: DistEnv) -> None:
    """Destroy the process group. Wrappers that are no longer referenced (a DDP model and its reducer, kept
    alive only by reference cycles) are collected first, while the group lives: a gloo group whose last
    reference is a reducer freed later is destroyed from that thread and can deadlock with its own worker
    thread over the GIL (seen at process exit on CPU)."""
    if env.distributed and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def all_reduce_sum(t: Tensor, env: DistEnv) -> Tensor:
    if env.distributed:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: Tensor, env: DistEnv) -> Tensor:
    return all_reduce_sum(t, env) / env.world_size


def gather_batches(batches: list[tuple[Tensor, Tensor]], env: DistEnv) -> list[tuple[Tensor, Tensor]]:
    """Every rank's micro-batches of one step, in rank order (CPU tensors); a collective call.

    Ranks hold contiguous, equal shares of the global batch (``mhar.data.batches.BatchOrder``), so the
    result is the step's micro-batches exactly as one process with the same ``micro_batch`` sees
    them: a digest of it is comparable across world sizes. One process: ``batches`` unchanged.
    """
    if not env.distributed or not batches:
        return batches
    micro = [x.shape[0] for x, _ in batches]
    share = torch.stack([torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])]).to(env.device)
    parts = [torch.empty_like(share) for _ in range(env.world_size)]
    dist.all_gather(parts, share)
    out = []
    for part in parts:
        out += list(zip(part[0].cpu().split(micro), part[1].cpu().split(micro)))
    return out


def even_batches(batches: list[tuple[Tensor, Tensor]], env: DistEnv) -> list[tuple[Tensor, Tensor, float]]:
    """``(x, y, weight)``: ``batches`` with weight 1, padded with weight-0 copies of a real batch
    until every rank has as many as the rank with the most.

    FSDP2 gathers parameters in every forward, so all ranks must run the same number of forwards
    (a rank that stops early leaves the others waiting forever); the validation set split over
    ranks is uneven whenever its size is not a multiple of ``world_size * micro_batch``.
    Ranks with no batch at all pad with token id 0 in the shape of rank 0's first batch.
    """
    out = [(x, y, 1.0) for x, y in batches]
    if not env.distributed:
        return out
    counts = torch.tensor([len(batches), -len(batches)], device=env.device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    most, fewest = int(counts[0]), -int(counts[1])
    if fewest == 0 and most > 0:  # some rank has nothing to copy: rank 0's first batch shape
        shape = torch.tensor(list(batches[0][0].shape) if env.rank == 0 else [0, 0], device=env.device)
        dist.broadcast(shape, src=0)
    if len(out) < most:
        if batches:
            x, y = batches[0]
        else:
            x = y = torch.zeros(shape.tolist(), dtype=torch.long)
        out += [(x, y, 0.0)] * (most - len(out))
    return out


def wrap_model(model: nn.Module, env: DistEnv) -> nn.Module:
    """DDP (gradients averaged over ranks) or FSDP2 (attention/MLP of each layer sharded, then the root)."""
    if env.parallel == "ddp":
        # lazy: only under torchrun (single-process training and eval import this module)
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [env.device.index] if env.device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    if env.parallel == "fsdp":
        # lazy: only under torchrun (single-process training and eval import this module)
        from torch.distributed.fsdp import fully_shard

        # The decoder calls each block's sublayers (not Block.forward), so the units are the
        # attention and MLP modules; norms, embeddings and residual parameters go with the root.
        for layer in model.layers:
            fully_shard(layer.attn)
            fully_shard(layer.mlp)
        fully_shard(model)
        return model
    return model


@contextlib.contextmanager
def no_grad_sync(model: nn.Module, env: DistEnv, skip: bool) -> Iterator[None]:
    """Skip the gradient all-reduce for accumulation micro-steps other than the last."""
    if not skip or env.parallel == "none":
        yield
    elif env.parallel == "ddp":
        with model.no_sync():
            yield
    else:  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)


# --- full (unsharded) state for checkpoints and the export ----------------------------------------------
def full_state(model: nn.Module, raw: nn.Module, opt: torch.optim.Optimizer, env: DistEnv) -> tuple[dict, dict]:
    """``(model state, optimizer state)`` as one process holds them; a collective call under FSDP2
    (gathered to CPU), the plain state dicts otherwise (``raw``: the unwrapped model)."""
    if env.parallel == "fsdp":
        # lazy: only under torchrun (single-process training and eval import this module)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return raw.state_dict(), opt.state_dict()


def load_full_state(model: nn.Module, raw: nn.Module, opt: torch.optim.Optimizer, env: DistEnv,
                    model_state: dict, optim_state: dict) -> None:
    """The inverse of :func:`full_state` (every rank passes the full states)."""
    if env.parallel == "fsdp":
        # lazy: only under torchrun (single-process training and eval import this module)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(model, opt, model_state_dict=model_state, optim_state_dict=optim_state,
                       options=StateDictOptions(full_state_dict=True))
    else:
        raw.load_state_dict(model_state)
        opt.load_state_dict(optim_state)


def full_model_state(model: nn.Module, env: DistEnv) -> Optional[dict]:
    """Under FSDP2 the full model state (collective, on CPU); None otherwise (the unwrapped model holds it)."""
    if env.parallel != "fsdp":
        return None
    # lazy: only under torchrun (single-process training and eval import this module)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
