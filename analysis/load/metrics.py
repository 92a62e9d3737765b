"""A run's ``metrics.jsonl`` and its validation curve with compute axes."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .common import AnalysisInputError, is_finite_number, jsonl_rows
from .runs import RunSummary


_METRIC_NUMBERS = {"val": ("step", "val_loss", "tokens", "wall_s", "flops"), "train": ("step", "loss", "tokens")}


def load_metrics(run_dir: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """(train lines, val lines) of ``metrics.jsonl``; empty lists if the file is absent. A loss, step or
    counter that is not a finite number (``NaN``, ``"NaN"``) is an AnalysisInputError naming the line."""
    p = Path(run_dir) / "metrics.jsonl"
    if not p.is_file():
        return [], []
    train, val = [], []
    for i, d in jsonl_rows(p):
        if not isinstance(d, dict):
            raise AnalysisInputError(f"{p}:{i}: expected a JSON object per line")
        split = "val" if d.get("split") == "val" else "train"
        for k in _METRIC_NUMBERS[split]:
            if k in d and not is_finite_number(d[k]):
                raise AnalysisInputError(f"{p}:{i}: {k}={d[k]!r} is not a finite number (a diverged or damaged "
                                         "run); retrain it or leave it out of the inputs")
        (val if split == "val" else train).append(d)
    return train, val


def val_curve(run: RunSummary) -> dict[str, np.ndarray]:
    """Validation curve with compute axes: arrays step, loss, wall_s, flops, tokens.

    Uses ``metrics.jsonl`` val lines when present; otherwise ``summary.val_losses`` with
    wall-clock/FLOPs/tokens interpolated linearly in step from the run totals.
    """
    _, val = load_metrics(run.run_dir)
    if val:
        rows = sorted(val, key=lambda d: d["step"])
        get = lambda k: np.array([float(d.get(k, np.nan)) for d in rows])  # noqa: E731
        return {"step": get("step"), "loss": get("val_loss"), "wall_s": get("wall_s"),
                "flops": get("flops"), "tokens": get("tokens")}
    if not run.val_losses:
        raise AnalysisInputError(f"{run.path}: no validation curve (neither metrics.jsonl val lines nor val_losses)")
    step = np.array([s for s, _ in run.val_losses], float)
    loss = np.array([v for _, v in run.val_losses], float)
    total = float(run.steps or step.max() or 1)
    frac = step / total
    scale = lambda tot: frac * tot if tot is not None else np.full_like(frac, np.nan)  # noqa: E731
    return {"step": step, "loss": loss, "wall_s": scale(run.wall_s), "flops": scale(run.flops),
            "tokens": scale(run.tokens)}
