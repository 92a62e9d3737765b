"""Experiment tracking: a copy of the training metrics for TensorBoard and Weights & Biases.

``train.tracking`` names the trackers (``tensorboard``, ``wandb``, several at once, or none: the
default). :func:`open_trackers` returns one :class:`Tracker` that fans out to them; the trainer calls
``log(step, row)`` with every row it writes to ``metrics.jsonl`` (scalars ``<split>/<key>``, e.g.
``train/loss``, ``val/val_loss``), ``log_image`` with the depth-weight heatmap of a routed variant at
evaluation steps, and ``close`` at the end. The resolved config, the run identity and provenance go
in as the tracked run's config (W&B) and as text (TensorBoard).

The run folder keeps what a resumed run needs to continue the same tracked run, in
``tracking.json``: the W&B run id (resumed with ``resume="allow"``), project, group and name, and
the TensorBoard log folder ``tensorboard/``. A resume after a checkpoint at step k discards the
events a killed segment logged after k (TensorBoard's ``purge_step``; W&B charts use the trainer's
``step`` as their x axis, so a step logged twice shows the same value twice).

W&B follows its own environment: ``WANDB_MODE=offline`` (no network: the run is written under
``<run>/wandb/`` for a later ``wandb sync``), ``WANDB_PROJECT`` (default ``mhar``), ``WANDB_ENTITY``.
The group is ``train.tracking_group`` (the workflow sets the config's hash), the name
``<label>/<size>/seed<k>``. Neither package is a dependency of the trainer: asking for a tracker
whose package is missing is a :class:`mhar.model.config.ConfigError` naming what to install.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from mhar import env
from mhar.model.config import ConfigError
from mhar.runs.atomic import atomic_write_json
from mhar.runs.config import RunConfig, dump_yaml, run_identity, tracker_names

__all__ = ["Tracker", "open_trackers", "check_trackers", "routing_summary", "log_routing", "TRACKING_FILE", "TB_DIR"]

TRACKING_FILE = "tracking.json"  # in the run folder: what a resumed run continues
TB_DIR = "tensorboard"  # TensorBoard event files, in the run folder
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker -> the pip package it needs


def check_trackers(names: Sequence[str]) -> list[str]:
    """``names`` validated (:func:`mhar.runs.config.tracker_names`); ConfigError when a package is missing."""
    names = tracker_names(list(names))
    missing = [n for n in names if importlib.util.find_spec(_PACKAGES[n]) is None]
    if missing:
        pkgs = " ".join(_PACKAGES[n] for n in missing)
        raise ConfigError(f"train.tracking={','.join(names)}: {pkgs} is not installed; pip install {pkgs} "
                          "(or pip install -e '.[track]'), or set train.tracking=none")
    return names


class Tracker:
    """Fan-out to the opened trackers; with none it does nothing (the trainer calls it unconditionally)."""

    def __init__(self, backends: Sequence[Any] = ()):
        self._backends = list(backends)

    @property
    def active(self) -> bool:
        return bool(self._backends)

    def log(self, step: int, metrics: dict) -> None:
        """Numeric entries of ``metrics`` at trainer step ``step`` (non-numeric ones are skipped)."""
        values = {k: float(v) for k, v in metrics.items()
                  if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)}
        if values:
            for b in self._backends:
                b.log(step, values)

    def log_image(self, step: int, tag: str, array: np.ndarray) -> None:
        """A (H, W) array of values in [0, 1] (or (H, W, 3) uint8) as an image."""
        img = np.asarray(array)
        if img.dtype != np.uint8:
            img = (np.clip(np.nan_to_num(img.astype(np.float64)), 0.0, 1.0) * 255).round().astype(np.uint8)
        for b in self._backends:
            b.log_image(step, tag, img)

    def close(self) -> None:
        for b in self._backends:
            b.close()
        self._backends = []


class _TensorBoard:
    def __init__(self, log_dir: Path, purge_step: Optional[int], texts: dict):
        from torch.utils.tensorboard import SummaryWriter  # needs the optional `tensorboard` package

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
        if purge_step is None:  # once per tracked run
            for tag, text in texts.items():
                self.writer.add_text(tag, f"```\n{text}\n```", 0)

    def log(self, step: int, values: dict) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_image(self, step: int, tag: str, img: np.ndarray) -> None:
        self.writer.add_image(tag, img, step, dataformats="HW" if img.ndim == 2 else "HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run_dir: Path, record: dict, config: dict):
        import wandb  # the optional `wandb` package

        self.wandb = wandb
        try:
            self.run = wandb.init(project=record["project"], entity=None,  # None: wandb reads $WANDB_ENTITY itself
                                  mode=env.wandb_mode(),
                                  id=record["id"], resume="allow", group=record.get("group"), name=record["name"],
                                  dir=str(run_dir), config=config,
                                  settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
        except Exception as e:  # not logged in, no network, ...: wandb's own exception types vary by version
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"train.tracking=wandb: wandb.init failed ({why}); log in (wandb login) or set "
                              "WANDB_MODE=offline (the run is kept under <run>/wandb/ for wandb sync)") from None
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")  # the trainer's step is the x axis, across resumes

    def log(self, step: int, values: dict) -> None:
        self.run.log({"step": step, **values})

    def log_image(self, step: int, tag: str, img: np.ndarray) -> None:
        self.run.log({"step": step, tag: self.wandb.Image(img)})

    def close(self) -> None:
        self.run.finish()


def open_trackers(cfg: RunConfig, run_dir: str | os.PathLike, names: Sequence[str], *,
                  resume_step: Optional[int] = None, provenance: Optional[dict] = None) -> Tracker:
    """Open the trackers ``names`` for the run in ``run_dir`` (rank 0 only).

    ``resume_step``: the checkpoint step a resumed run continues from (None: a fresh run); the tracked
    run recorded in ``run_dir/tracking.json`` is then continued. ``provenance``: logged with the config.
    """
    names = check_trackers(names)
    if not names:
        return Tracker()
    run_dir = Path(run_dir)
    ident = run_identity(cfg)
    try:
        record = json.loads((run_dir / TRACKING_FILE).read_text())
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    record.setdefault("name", f"{ident['label']}/{cfg.size}/seed{cfg.seed}")
    backends: list[Any] = []
    if "tensorboard" in names:
        record["tensorboard"] = {"log_dir": TB_DIR}
        texts = {"config": dump_yaml(cfg.to_dict()), "identity": json.dumps(ident, indent=1)}
        if provenance is not None:
            texts["provenance"] = json.dumps(provenance, indent=1, default=str)
        # a tracked run continues where its checkpoint was: a resume purges what a killed segment logged later
        purge = resume_step + 1 if resume_step is not None and (run_dir / TB_DIR).is_dir() else None
        backends.append(_TensorBoard(run_dir / TB_DIR, purge, texts))
    if "wandb" in names:
        wb = record.get("wandb") if isinstance(record.get("wandb"), dict) else {}
        wb.setdefault("id", f"{ident['identity'][:8]}-{secrets.token_hex(4)}")
        wb.setdefault("project", env.wandb_project())
        wb["group"] = cfg.train.tracking_group or wb.get("group")
        wb["name"], wb["dir"] = record["name"], "wandb"
        record["wandb"] = wb
        config = {"config": cfg.to_dict(), "identity": ident["identity"], "pairing": ident["pairing"],
                  "run": {k: v for k, v in ident.items() if k != "config"}}
        if provenance is not None:  # the config and run record are there already
            config["provenance"] = {k: v for k, v in provenance.items() if k not in ("config", "run")}
        atomic_write_json(run_dir / TRACKING_FILE, record)  # the id is on disk before the run is opened
        backends.append(_WandB(run_dir, wb, config))
    atomic_write_json(run_dir / TRACKING_FILE, record)
    return Tracker(backends)


def routing_summary(routing: dict) -> tuple[dict, np.ndarray]:
    """Per-head statistics of a routed forward pass (``model(ids, collect_routing=True).routing``:
    site -> depth weights (B, T, heads, sources)).

    Returns the scalars ``routing/entropy/<site>/h<k>`` (mean depth-weight entropy in nats of head k at
    that site) and a heatmap: one row per (site, head), one column per depth source (the embedding
    first), the head's mean weight in each cell, blank where a site has fewer sources.
    """
    scalars, rows = {}, []
    width = max((int(w.shape[-1]) for w in routing.values()), default=0)
    for site, w in routing.items():
        w = w.detach().float().cpu()
        ent = -(w * torch.log(w.clamp_min(1e-30))).sum(-1).mean(dim=(0, 1))  # (heads,)
        mean = w.mean(dim=(0, 1)).numpy()  # (heads, sources)
        for h in range(mean.shape[0]):
            scalars[f"routing/entropy/{site}/h{h}"] = float(ent[h])
            row = np.zeros(width)
            row[: mean.shape[1]] = mean[h]
            rows.append(row)
    heat = np.stack(rows) if rows else np.zeros((0, 0))
    return {k: v for k, v in scalars.items() if math.isfinite(v)}, heat


def log_routing(tracker: Tracker, step: int, routing: dict, cell: int = 8) -> None:
    """:func:`routing_summary` of ``routing`` to ``tracker``: the entropies, and the heatmap as the image
    ``routing/depth_weights`` (each cell ``cell`` pixels wide)."""
    scalars, heat = routing_summary(routing)
    tracker.log(step, scalars)
    if heat.size:
        tracker.log_image(step, "routing/depth_weights", np.kron(heat, np.ones((cell, cell))))
