"""Optimisation pieces of the trainer (``mhar.train``): the learning-rate schedule (:func:`lr_at`: linear warmup,
then cosine to ``train.min_lr_ratio * train.lr``) and one piece per run-config option:

``param_groups`` (train.decay_filter), ``z_loss`` (train.z_loss), ``EMA`` (train.ema_decay),
``batch_digest`` (train.log_batch_hash) and ``load_init_weights`` (train.init_from: warm start from
an exported model). Their defaults leave from-scratch training unchanged; continued pretraining
(``mhar.cpt``) is their main user. Imports only the library's core (no CPT, eval or workflow code).
"""
from __future__ import annotations

import hashlib
import math
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor, nn

from mhar.runs.checkpoint import FORMAT, CheckpointError, load_error_brief, verify_sha256
from mhar.model.config import ConfigError
from mhar.runs.config import RunConfig
from mhar.model.transformer import Transformer

__all__ = ["lr_at", "DECAY_FILTERS", "param_groups", "z_loss", "batch_digest", "EMA", "load_init_weights"]

DECAY_FILTERS = ("all", "matrices")


def lr_at(step: int, cfg: RunConfig) -> float:
    """LR for optimizer update ``step`` (0-based) of run config ``cfg``: linear warmup, then cosine to
    min_lr_ratio * lr."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.steps - t.warmup_steps - 1)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.lr * (t.min_lr_ratio + (1.0 - t.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def param_groups(model: nn.Module, weight_decay: float, decay_filter: str = "all") -> list[dict]:
    """AdamW parameter groups.

    ``all``: one group, every parameter decayed (the from-scratch recipe). ``matrices``: decay only
    the weights of ``nn.Linear`` layers (attention/MLP projections and an *untied* LM head); no decay
    on embeddings (nor a head tied to them), norm weights, biases, or the residual variant's own
    parameters (routing queries, key norms, gates, null source). Works on a DDP/FSDP-wrapped model.
    """
    if decay_filter not in DECAY_FILTERS:
        raise ConfigError(f"train.decay_filter: unknown filter {decay_filter!r}; choose one of {', '.join(DECAY_FILTERS)}")
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_filter == "all":
        return [{"params": params, "weight_decay": weight_decay}]
    skip = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) not in skip}
    decay = [p for p in params if id(p) in decay_ids]
    rest = [p for p in params if id(p) not in decay_ids]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0})
            if g["params"]]


def z_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean of logsumexp(logits)^2 over the target positions (PaLM z-loss), fp32 scalar."""
    lse = torch.logsumexp(logits.float(), dim=-1)  # (B, T)
    mask = labels != -100
    return (lse.pow(2) * mask).sum() / mask.sum().clamp(min=1)


def batch_digest(batches: list[tuple[Tensor, Tensor]]) -> str:
    """sha256 of a step's micro-batches (input ids and labels, int64 bytes, in order)."""
    h = hashlib.sha256()
    for x, y in batches:
        for t in (x, y):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


class EMA:
    """Exponential moving average of the trainable parameters: e <- d * e + (1 - d) * p.

    Starts from the initial weights (for CPT: the converted checkpoint). Works with plain,
    DDP- and FSDP2-wrapped models (the averages have the parameters' sharding).
    """

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"train.ema_decay: must be in (0, 1) to keep an EMA, got {decay}")
        self.decay = decay
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        for e, p in zip(self.shadow, self.params):
            e.lerp_(p.detach(), 1.0 - self.decay)

    def state_dict(self) -> list[Tensor]:
        """Full (unsharded) CPU tensors; a collective call under FSDP (every rank must call it)."""
        return [(e.full_tensor() if hasattr(e, "full_tensor") else e).detach().cpu() for e in self.shadow]

    @torch.no_grad()
    def load_state_dict(self, tensors: list[Tensor]) -> None:
        if len(tensors) != len(self.shadow):
            raise CheckpointError(f"EMA state holds {len(tensors)} tensors, the model has {len(self.shadow)}")
        for e, full in zip(self.shadow, tensors):
            if hasattr(e, "device_mesh"):  # DTensor: take this rank's shard of the full tensor
                from torch.distributed.tensor import distribute_tensor

                full = distribute_tensor(full.to(e.device), e.device_mesh, e.placements)
            e.copy_(full)

    @contextmanager
    def applied(self):
        """Temporarily put the averaged weights into the model (e.g. to export them)."""
        backup = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, e in zip(self.params, self.shadow):
                p.copy_(e)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, backup):
                    p.copy_(b)


def load_init_weights(model: Transformer, path: str | Path) -> dict:
    """Load an exported model's weights into ``model`` (the run's own config must match it).

    Returns the checkpoint's ``extra`` dict (e.g. the conversion report). Raises ConfigError
    naming every model field that differs, so a CPT run never silently trains another shape.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"train.init_from={path}: no such file; convert the base first (python -m mhar.cpt "
                              "convert) or give the path of an exported model.pt")
    try:  # the checksum first: a model without one (or failing it) is never loaded
        verify_sha256(path)
    except CheckpointError as e:
        raise CheckpointError(f"train.init_from: {e}") from None
    try:  # memory-mapped: under torchrun every rank reads the same pages (8B: no 8 x 32 GB copies)
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise CheckpointError(f"train.init_from={path}: missing, unreadable or corrupt ({load_error_brief(e)}); "
                              "convert the base first (python -m mhar.cpt convert)") from e
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise CheckpointError(f"train.init_from={path}: not an {FORMAT} file")
    want = {k: v for k, v in asdict(model.cfg).items()}
    have = dict(blob["model_config"])
    ignore = {"routing_impl"}  # an implementation choice, not a shape
    diff = []
    for k in sorted(set(want) | set(have)):
        if k == "residual":
            r_w, r_h = want.get(k) or {}, have.get(k) or {}
            diff += [f"residual.{kk}: checkpoint {r_h.get(kk)!r} vs run {r_w.get(kk)!r}"
                     for kk in sorted(set(r_w) | set(r_h)) if kk not in ignore and r_w.get(kk) != r_h.get(kk)]
        elif want.get(k) != have.get(k):
            diff.append(f"{k}: checkpoint {have.get(k)!r} vs run {want.get(k)!r}")
    if diff:
        raise ConfigError(f"train.init_from={path}: the run's model config differs from the checkpoint's in "
                          f"{'; '.join(diff[:8])}. Copy the checkpoint's model config into the run config.")
    model.load_state_dict(blob["state_dict"])
    return blob.get("extra", {})
