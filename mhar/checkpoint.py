"""Model export format shared by training, evaluation and the CPT tools.

``save_model`` writes one self-describing file (config + tokenizer spec + weights);
``load_model`` rebuilds the model from it. A run directory's exported model
lives at ``<run_dir>/model.pt``; the full training state (optimizer, RNG,
data position) is the trainer's business (``mhar.train``).
Writes are atomic (temp file + rename): a crash never leaves a half-written file.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from .config import ConfigError, model_config_from_dict, to_dict

FORMAT = "mhar-model-v1"
MODEL_FILE = "model.pt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or of the wrong format."""


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_model(path: str | os.PathLike, model, tokenizer: str, extra: Optional[dict] = None) -> Path:
    """Export ``model`` (a ``mhar.model.Transformer``) with its config and tokenizer spec."""
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    atomic_torch_save(
        {"format": FORMAT, "model_config": to_dict(model.cfg), "tokenizer": tokenizer,
         "state_dict": state, "extra": extra or {}},
        path,
    )
    return path


def load_error_brief(e: BaseException) -> str:
    """One line for a failed ``torch.load``: the exception type and the gist of its (long) message."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    for i, ln in enumerate(lines[:-1]):  # torch's weights_only failure: the real cause follows this marker
        if ln.endswith("WeightsUnpickler error:"):
            first = f"weights-only unpickler: {lines[i + 1]}"
    if len(first) > 160:  # long library messages: the first sentence carries the cause
        first = first.split(". ")[0][:160]
    return f"{type(e).__name__}: {first}"


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The raw ``mhar-model-v1`` dict at ``path`` (a file or a run dir holding ``model.pt``)."""
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path} (train the run first, or check the path)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        if "Unsupported global" in str(e):  # pickled Python objects: a training state, not an export
            raise CheckpointError(
                f"{path} is not an exported {FORMAT} model (it holds more than tensors, e.g. a training state "
                f"such as RUN_DIR/checkpoint/state.pt); pass RUN_DIR/{MODEL_FILE} instead"
            ) from e
        raise CheckpointError(
            f"checkpoint {path} is unreadable or corrupt ({load_error_brief(e)}); "
            "delete it and re-run the step that produced it"
        ) from e
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise CheckpointError(f"{path} is not an {FORMAT} file (format={found}); pass an exported "
                              f"RUN_DIR/{MODEL_FILE} (or convert a Hugging Face model with python -m mhar.cpt convert)")
    return blob


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", routing_impl: Optional[str] = None):
    """Return ``(model, tokenizer, blob)``; ``routing_impl`` overrides the saved one (e.g. eager on CPU)."""
    from .model import Transformer
    from .tokenizer import get_tokenizer

    blob = read_checkpoint(path)
    cfg_d = dict(blob["model_config"])
    if routing_impl is not None:
        cfg_d["residual"] = {**cfg_d["residual"], "routing_impl": routing_impl}
    try:
        cfg = model_config_from_dict(cfg_d)
    except ConfigError as e:
        raise CheckpointError(f"{path}: stored model config is invalid: {e}") from e
    model = Transformer(cfg)
    missing, unexpected = model.load_state_dict(blob["state_dict"], strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match the config (missing={missing[:5]}, unexpected={unexpected[:5]})")
    model.to(device).eval()
    return model, get_tokenizer(blob["tokenizer"]), blob
