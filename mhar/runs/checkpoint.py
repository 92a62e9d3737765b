"""Model export format shared by training, evaluation and the CPT tools.

``save_model`` writes one self-describing file (config + tokenizer spec + weights);
``load_model`` rebuilds the model from it. A run directory's exported model
lives at ``<run_dir>/model.pt``; the full training state (optimizer, RNG,
data position) is the trainer's business (``mhar.train``).

Integrity at every instant of a kill (:func:`atomic_torch_save`): the file is written to a same-folder
temp file while being hashed (no second read), fsynced; its ``<file>.sha256`` (``sha256sum -c`` format)
is written and fsynced as a pending ``.<file>.sha256.<pid>.tmp`` *before* the file is renamed into
place; then the checksum is renamed beside it. A kill before the first rename leaves the old pair
untouched; between the two renames it leaves the new file with its complete checksum pending, which
:func:`verify_sha256` and :func:`mhar.atomic.clean_stale_temps` finish (other temp files of killed writes are
removed at the next start). Every load checks the checksum first and refuses a file without one
(:func:`verify_sha256`); loads never unpickle objects (``torch.load(weights_only=True)``).
The bytes of a saved file depend only on its content (the archive's inner name is fixed),
so identical runs export byte-identical ``model.pt`` files.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Optional

import torch

from mhar.atomic import (atomic_write_text, file_sha256, fsync_dir, recorded_sha256, sha256_path, tmp_of,
                         write_synced)
from mhar.data.tokenizer import get_tokenizer
from mhar.model.config import ConfigError, model_config_from_dict, stored_routing_impl, to_dict
from mhar.model.transformer import Transformer

FORMAT = "mhar-model-v1"
MODEL_FILE = "model.pt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or of the wrong format."""


def write_sha256(path: str | os.PathLike, digest: Optional[str] = None) -> str:
    """Store ``<file>.sha256`` beside ``path`` (atomically); returns the digest."""
    path = Path(path)
    digest = digest or file_sha256(path)
    atomic_write_text(sha256_path(path), f"{digest}  {path.name}\n")
    return digest


def verify_sha256(path: str | os.PathLike, required: bool = True) -> Optional[str]:
    """The file's sha256 after checking it against ``<file>.sha256``; CheckpointError on a mismatch.

    A write killed between renaming the file and its checksum leaves the new checksum as a
    ``.<file>.sha256.<pid>.tmp``; a matching one completes that write. A file without a checksum
    is refused (it may be half-written or replaced: it is never loaded); ``required=False`` (only
    for hashing a file that is not loaded) returns its hash instead.
    """
    path = Path(path)
    side = sha256_path(path)
    actual = file_sha256(path)
    pending = sorted(path.parent.glob(f".{side.name}.*.tmp"))
    if not side.is_file() and not pending:
        if required:
            raise CheckpointError(f"{path} has no checksum file {side.name}, so it is never loaded (it may be "
                                  "incomplete or replaced); re-create it with the step that wrote it (train or "
                                  "convert again), or restore both files from where they came from")
        return actual
    if side.is_file() and recorded_sha256(side) == actual:
        return actual
    for tmp in pending:
        if recorded_sha256(tmp) == actual:
            try:
                os.replace(tmp, side)
            except OSError:  # its writer (or another reader) completed it just now, or a read-only copy
                pass
            return actual
    if not side.is_file():
        raise CheckpointError(f"{path} has no checksum file {side.name} (only a pending one that does not "
                              "match it), so it is never loaded; re-create it with the step that wrote it")
    raise CheckpointError(f"{path} fails its sha256 check (recorded in {side.name}: {recorded_sha256(side)}, "
                          f"file: {actual}); the file is corrupt or was modified, refusing to load it")


class _HashingWriter:
    """A binary file that hashes what is written through it (torch.save writes its archive sequentially).

    torch's archive writer calls :meth:`write` from C++ and reports anything it raises as a RuntimeError, so
    the original exception is kept in ``error``: an OSError (disk full: its errno), or a KeyboardInterrupt
    (the second Ctrl-C, whose handler runs in this Python frame) that must stay an interrupt."""

    def __init__(self, f):
        self._f, self.sha = f, hashlib.sha256()
        self.error: Optional[BaseException] = None

    def write(self, b) -> int:
        try:
            self.sha.update(b)
            return self._f.write(b)
        except BaseException as e:
            self.error = e
            raise

    def flush(self) -> None:
        try:
            self._f.flush()
        except BaseException as e:
            self.error = e
            raise


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> str:
    """``torch.save`` atomically, with its ``.sha256`` beside it at every instant; returns the digest.

    Sequence (module docstring): temp file hashed while written + fsync; pending checksum + fsync;
    rename the file; rename the checksum; fsync the folder. Saving through a file object fixes the
    archive's inner name ("archive"), so equal objects give equal bytes.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    side = sha256_path(path)
    tmp, side_tmp = tmp_of(path), tmp_of(side)
    try:
        holder: dict = {}

        def write(f):
            holder["w"] = w = _HashingWriter(f)
            torch.save(obj, w)

        try:
            write_synced(tmp, write)
        except RuntimeError as e:  # torch's archive writer reports a failed write as a RuntimeError
            cause = holder["w"].error if "w" in holder else None
            if cause is not None and not isinstance(cause, Exception):  # KeyboardInterrupt, SystemExit
                raise cause from None  # an interrupt (Ctrl-C) inside torch.save is the interrupt, not a failed write
            raise _write_failed(e, cause if isinstance(cause, OSError) else None, path) from None
        digest = holder["w"].sha.hexdigest()
        write_synced(side_tmp, lambda f: f.write(f"{digest}  {path.name}\n".encode()))
        os.replace(tmp, path)  # from here on the new file is valid: its checksum is complete beside it
    except BaseException:
        tmp.unlink(missing_ok=True)
        side_tmp.unlink(missing_ok=True)
        raise
    try:
        os.replace(side_tmp, side)
    except FileNotFoundError:  # a reader's verify_sha256 completed it first
        if recorded_sha256(side) != digest:
            raise
    fsync_dir(path.parent)
    return digest


def _write_failed(e: RuntimeError, cause: Optional[OSError], path: Path) -> OSError:
    """The OSError for a ``torch.save`` that failed writing ``path``: torch's archive writer reports a failed
    write (a full disk: "[enforce fail at inline_container.cc] unexpected pos ...") as a RuntimeError; the
    operating system's error underneath (``cause``) names the reason when there is one."""
    if cause is not None:
        return OSError(cause.errno, cause.strerror or str(cause), str(path))
    return OSError(None, f"torch.save could not write the file ({' '.join(str(e).split())[:160]})", str(path))


def safe_torch_load(path: str | os.PathLike, required_checksum: bool = True) -> Any:
    """Checksum, then ``torch.load(weights_only=True)``: tensors and plain containers only."""
    verify_sha256(path, required=required_checksum)
    return torch.load(path, map_location="cpu", weights_only=True)


def save_model(path: str | os.PathLike, model, tokenizer: str, extra: Optional[dict] = None) -> Path:
    """Export ``model`` (a ``mhar.model.transformer.Transformer``) with its config and tokenizer spec."""
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
    marker = "WeightsUnpickler error:"
    for i, ln in enumerate(lines):  # torch's weights_only failure: the real cause follows this marker
        if marker in ln:
            cause = ln.split(marker, 1)[1].strip() or (lines[i + 1] if i + 1 < len(lines) else "")
            first = f"weights-only unpickler refused it: {cause.split('. ')[0]}"
            break
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
    verify_sha256(path)  # a model without its checksum is never loaded
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        if "Unsupported global" in str(e):  # pickled Python objects: a training state, not an export
            raise CheckpointError(
                f"{path} is not an exported {FORMAT} model (it holds more than tensors, e.g. a training state "
                f"such as RUN_DIR/checkpoint/state-<step>.pt); pass RUN_DIR/{MODEL_FILE} instead"
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


def _finite(t: torch.Tensor) -> bool:
    """Every value of ``t`` finite. A finite sum proves it (any NaN or inf makes the sum NaN or inf) at the cost
    of one reduction (on 2 CPU cores ~18x cheaper for fp32, ~2x for bf16, than ``torch.isfinite(t).all()``,
    which writes a bool tensor); only a non-finite sum (a NaN or inf, or finite values overflowing) takes the
    exact elementwise test."""
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    return bool(torch.isfinite(t.sum(dtype=acc))) or bool(torch.isfinite(t).all())


def non_finite_tensor(tensors: dict) -> Optional[str]:
    """The first floating-point tensor of ``tensors`` holding a NaN or an infinity, as ``NAME (n NaN, m inf of N
    values)``; None when every one is finite (one reduction per tensor; the counts only for the bad one)."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and not _finite(t):
            return f"{name} ({int(torch.isnan(t).sum())} NaN, {int(torch.isinf(t).sum())} inf of {t.numel()} values)"
    return None


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", routing_impl: Optional[str] = None):
    """Return ``(model, tokenizer, blob)``; ``routing_impl`` overrides the saved one (e.g. eager on CPU)."""
    blob = read_checkpoint(path)
    cfg_d = dict(blob["model_config"])
    res_d = dict(cfg_d.get("residual") or {})
    if "routing_impl" in res_d:  # an execution choice: mapped to a name this code runs
        res_d["routing_impl"] = stored_routing_impl(res_d["routing_impl"])
    if routing_impl is not None:
        res_d["routing_impl"] = routing_impl
    cfg_d["residual"] = res_d
    try:
        cfg = model_config_from_dict(cfg_d)
    except ConfigError as e:
        raise CheckpointError(f"{path}: stored model config is invalid: {e}") from e
    bad = non_finite_tensor(blob["state_dict"]) if isinstance(blob["state_dict"], dict) else None
    if bad:  # a diverged training or a damaged conversion: refused, never evaluated or exported
        raise CheckpointError(f"{path}: tensor {bad} is not finite; the weights are damaged (retrain the run or "
                              "re-import the model)")
    model = Transformer(cfg)
    missing, unexpected = model.load_state_dict(blob["state_dict"], strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match the config (missing={missing[:5]}, unexpected={unexpected[:5]})")
    model.to(device).eval()
    return model, get_tokenizer(blob["tokenizer"]), blob
