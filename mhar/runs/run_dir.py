"""The run folder: everything a training run keeps on disk, behind one object (:class:`RunFolder`).

Files (docs/ARCHITECTURE.md "Run directory")::

    config.yaml        the resolved run config (written once, at the start of a fresh run)
    metrics.jsonl      one JSON row per training step and per evaluation (:class:`MetricsLog`)
    provenance.json    code, machine, identity, routing, start/end times and resumes
    summary.json       the finished run's record (its presence means "done")
    model.pt           the exported model (:func:`mhar.runs.checkpoint.save_model`)
    diverged.json      why a run stopped on a non-finite value
    checkpoint/state-<step>.pt   training states (model, optimizer, RNG, progress, metrics log)
    .lock              the trainer that holds the folder (its pid)

Each tensor file has its ``.sha256`` beside it. A new checkpoint is complete (file and checksum) before the
previous one is removed, and a resume takes the newest checkpoint that passes its checks, saying on stderr when
it had to fall back to an older one and why. A folder that holds the same run identity
(:func:`mhar.runs.config.identity_hash`) resumes (or does nothing if finished); another identity is refused.
One trainer at a time holds a folder (``flock`` on ``.lock``); records are written atomically and checkpoints
are loaded without unpickling objects. Only rank 0 writes (``RunFolder(path, writer=False)`` on the others).
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import yaml

from mhar.atomic import (atomic_write_bytes, atomic_write_json, atomic_write_text, check_writable,
                         clean_stale_temps, os_error_line, read_json, sha256_path)
from mhar.runs.checkpoint import CheckpointError, atomic_torch_save, load_error_brief, safe_torch_load, save_model
from mhar.runs.config import RunConfig, identity_hash, recorded_run_config
from mhar.safe_yaml import dump_yaml, read_yaml_file, yaml_error_line
from mhar.runs.pairing import differences
from mhar.runs.provenance import utc_now

__all__ = ["RunFolder", "RunDirError", "MetricsLog", "Progress", "STATE_FORMAT", "rng_state", "set_rng_state"]

STATE_FORMAT = "mhar-train-state-v2"  # loadable with weights_only=True, sha256 beside it
_STATE_RE = re.compile(r"^state-(?P<step>\d+)\.pt$")
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "provenance.json", "model.pt", "checkpoint")


class RunDirError(RuntimeError):
    """The run directory belongs to a different run, or is unusable (nothing was written)."""


@dataclass
class Progress:
    """Counters that live in the checkpoint."""

    step: int = 0
    tokens: int = 0
    flops: float = 0.0
    wall_s: float = 0.0
    train_s: float = 0.0
    val_losses: list = field(default_factory=list)  # [[step, loss], ...]
    last_ckpt_step: Optional[int] = None


def rng_state() -> dict:
    """Every random generator the training touches, as plain types and tensors (``weights_only`` loads it)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    st = {"torch": torch.get_rng_state(), "python": random.getstate(),
          "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)]}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    name, keys, pos, has_gauss, gauss = st["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


class MetricsLog:
    """Append-only JSONL (rank 0 only); ``content()`` is stored in a checkpoint, ``open`` rolls back to it.

    The checkpoint keeps the log's bytes, not only its length: a workflow manager that deletes
    declared outputs before rerunning a job (Snakemake does) must not cost the resumed run its
    first segment of metrics.
    """

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled
        self._f = None

    def open(self, truncate_to: Optional[int], saved: Optional[bytes] = None) -> None:
        if not self.enabled:
            return
        if saved is not None:  # the log as it was at the checkpoint
            atomic_write_bytes(self.path, saved)
        elif truncate_to is None or not self.path.is_file():
            atomic_write_bytes(self.path, b"")
        else:  # a checkpoint that kept only the log's length
            with open(self.path, "r+b") as f:
                f.truncate(truncate_to)
        self._f = open(self.path, "a")

    def write(self, row: dict) -> None:
        if self._f is not None:
            self._f.write(json.dumps(row) + "\n")

    def size(self) -> int:
        if self._f is None:
            return 0
        self._f.flush()
        os.fsync(self._f.fileno())
        return self.path.stat().st_size

    def content(self) -> Optional[bytes]:
        if self._f is None:
            return None
        n = self.size()  # flushes first
        return self.path.read_bytes()[:n]

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class RunFolder:
    """One training run's folder: lock, status, records, metrics log, checkpoints, model export.

    ``writer``: whether this process writes (rank 0); the others only read checkpoints."""

    def __init__(self, path: str | os.PathLike, writer: bool = True):
        self.path, self.writer = Path(path), writer
        self._lock_fd: Optional[int] = None

    config = property(lambda self: self.path / "config.yaml")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    summary = property(lambda self: self.path / "summary.json")
    provenance = property(lambda self: self.path / "provenance.json")
    model = property(lambda self: self.path / "model.pt")
    checkpoint_dir = property(lambda self: self.path / "checkpoint")
    diverged = property(lambda self: self.path / "diverged.json")
    lockfile = property(lambda self: self.path / ".lock")

    # --- lock ---------------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Create the directory and lock it for this process; RunDirError if unusable or held.

        ``flock`` is released by the kernel when its holder dies, so a lock left by a killed
        trainer never blocks the next one. Then stale temp files of killed writes are removed.
        """
        try:
            check_writable(self.path)  # creates it; read-only, full or forbidden: found now, before data and model
            fd = os.open(self.lockfile, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(f"--out {self.path} is not a usable run directory: {os_error_line(e)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(f"{self.path} is in use by another trainer (pid {holder}); wait for it to "
                              "finish, or stop it, before training into this directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        for folder in (self.path, self.checkpoint_dir):
            clean_stale_temps(folder)

    def release(self) -> None:
        """Unlock; a directory that holds nothing but the lock (a run that failed early) is removed."""
        if self._lock_fd is None:
            return
        try:
            if [p.name for p in self.path.iterdir()] == [self.lockfile.name]:
                self.lockfile.unlink()
                self.path.rmdir()
        except OSError:
            pass
        os.close(self._lock_fd)
        self._lock_fd = None

    # --- what the folder holds ------------------------------------------------------------------------
    def status(self, cfg: RunConfig) -> str:
        """'fresh' | 'resume' | 'done'; raises RunDirError for a directory of another run identity."""
        if not self.config.is_file():
            ours = [n for n in RUN_FILES if (self.path / n).exists()]
            if ours:
                raise RunDirError(f"{self.path} holds run files ({', '.join(ours)}) but no config.yaml; "
                                  "refusing to overwrite them. Choose another --out or delete that directory.")
            return "fresh"
        try:
            old = recorded_run_config(read_yaml_file(self.config))  # an unknown routing_impl is no obstacle
        except Exception as e:  # a YAML or config error alike
            why = yaml_error_line(e) if isinstance(e, yaml.YAMLError) else str(e).replace("\n", " ")
            raise RunDirError(f"{self.config} is unreadable ({why}); refusing to overwrite the run in {self.path}") from None
        if identity_hash(old) != identity_hash(cfg):
            diff = [f"{k}: {va!r} -> {vb!r}" for k, va, vb in differences(old.to_dict(), cfg.to_dict())]
            raise RunDirError(f"{self.path} holds a run of a different config (differs in: {', '.join(diff[:8])}); "
                              "refusing to overwrite it. Choose another --out (the workflow's run paths "
                              "carry the run identity, so a changed definition gets its own directory).")
        if self.summary.is_file():
            if isinstance(read_json(self.summary), dict):
                return "done"
            if not self.checkpoints():  # cut short by a non-atomic writer: rebuilt from the checkpoint
                raise RunDirError(f"{self.summary} is unreadable and there is no checkpoint to rebuild it "
                                  f"from; move {self.path} aside and train again")
        return "resume" if self.checkpoints() else "fresh"

    def read_summary(self) -> dict:
        return json.loads(self.summary.read_text())

    # --- records ------------------------------------------------------------------------------------
    def start(self, cfg: RunConfig, record: dict, resumed_step: Optional[int]) -> None:
        """Write ``config.yaml`` (fresh run) and ``provenance.json`` (``record``; a resume keeps the first
        segment's start time and appends itself to ``resumes``)."""
        if not self.writer:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        if resumed_step is None:
            atomic_write_text(self.config, dump_yaml(cfg.to_dict()))
        prov = dict(record, start_time=utc_now(), end_time=None, resumed_from_step=resumed_step)
        old = read_json(self.provenance) if resumed_step is not None else None
        if isinstance(old, dict):
            prov["start_time"] = old.get("start_time", prov["start_time"])
            prov["resumes"] = old.get("resumes", []) + [{"step": resumed_step, "time_utc": prov["time_utc"]}]
        atomic_write_json(self.provenance, prov)

    def open_metrics(self, blob: Optional[dict]) -> MetricsLog:
        """The metrics log, rolled back to what checkpoint ``blob`` saw (None: a new, empty log)."""
        log = MetricsLog(self.metrics, self.writer)
        log.open(blob["metrics_bytes"] if blob is not None else None,
                 blob.get("metrics_log") if blob is not None else None)
        return log

    def finish(self, summary: dict) -> None:
        """Write ``summary.json`` (the run is done) and the end time into ``provenance.json``."""
        if not self.writer:
            return
        atomic_write_json(self.summary, summary)
        prov = read_json(self.provenance)
        prov = prov if isinstance(prov, dict) else {}
        prov["end_time"] = utc_now()
        atomic_write_json(self.provenance, prov)

    def record_diverged(self, what: str, step: int, last_ckpt_step: Optional[int], **values) -> str:
        """Record a non-finite ``what`` in ``diverged.json``; returns the message for the user."""
        where = (f"the last good checkpoint (step {last_ckpt_step}) is kept in {self.state_file(last_ckpt_step)}"
                 if last_ckpt_step is not None else "no checkpoint had been written yet")
        values = {k: v if not isinstance(v, float) or math.isfinite(v) else str(v) for k, v in values.items()}
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        msg = (f"non-finite {what} at step {step} ({shown}); run stopped, {where}, recorded in {self.diverged}. "
               "Lower train.lr, raise train.warmup_steps or set train.grad_clip, and train the changed config "
               "(a new run directory)")
        if self.writer:
            atomic_write_json(self.diverged, {"status": "diverged", "what": what, "step": step, **values,
                                              "last_checkpoint_step": last_ckpt_step, "time_utc": utc_now(),
                                              "message": msg})
        return msg

    def export_model(self, path: Path, model, tokenizer: str, extra: dict) -> None:
        """``model.pt`` (or ``checkpoint/model.pt``): :func:`mhar.runs.checkpoint.save_model`."""
        if self.writer:
            save_model(path, model, tokenizer, extra)

    # --- checkpoints ----------------------------------------------------------------------------------
    def state_file(self, step: int) -> Path:
        return self.checkpoint_dir / f"state-{step:08d}.pt"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Training states on disk (``state-<step>.pt``), newest first."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = []
        for p in self.checkpoint_dir.iterdir():
            m = _STATE_RE.match(p.name)
            if m and p.is_file():
                found.append((int(m["step"]), p))
        return sorted(found, key=lambda sp: -sp[0])

    def save_state(self, cfg: RunConfig, prog: Progress, state: dict) -> None:
        """Write ``checkpoint/state-<step>.pt`` (+ ``.sha256``, :func:`mhar.runs.checkpoint.atomic_torch_save`):
        ``state`` (model, optimizer, metrics, ...) with the format, identity, RNG and progress; then remove the
        older checkpoints, so a valid one is on disk at every instant."""
        if not self.writer:
            return
        path = self.state_file(prog.step)
        atomic_torch_save({"format": STATE_FORMAT, "identity": identity_hash(cfg), "model": state.pop("model"),
                           "optimizer": state.pop("optimizer"), "rng": rng_state(), "progress": asdict(prog),
                           **state}, path)
        self.prune(keep=path)

    def prune(self, keep: Path, older_only: bool = False) -> None:
        """Remove every training state but ``keep`` (or only those older than it), the file before its
        checksum (a checksum without its file is ignored), and checksums whose file is gone."""
        paths = [p for _, p in self.checkpoints()]  # newest first
        older = paths[paths.index(keep) + 1:] if keep in paths else []
        for p in paths:
            if p != keep and (not older_only or p in older):
                p.unlink(missing_ok=True)
                sha256_path(p).unlink(missing_ok=True)
        for side in self.checkpoint_dir.glob("state*.pt.sha256"):
            if not side.with_name(side.name[: -len(".sha256")]).exists():
                side.unlink(missing_ok=True)

    def _load_state_file(self, path: Path, cfg: RunConfig) -> dict:
        """One training state, checksum-verified and loaded without unpickling objects (CheckpointError why not)."""
        try:
            blob = safe_torch_load(path)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{path} is unreadable, corrupt or not a {STATE_FORMAT} file "
                                  f"({load_error_brief(e)})") from None
        if not isinstance(blob, dict) or blob.get("format") != STATE_FORMAT:
            raise CheckpointError(f"{path} is not a {STATE_FORMAT} file")
        if blob.get("identity") != identity_hash(cfg):
            raise CheckpointError(f"{path} was written by a different config")
        return blob

    def load_state(self, cfg: RunConfig, warn: Callable[[str], None] = lambda m: None) -> dict:
        """The newest valid training state (its path in ``blob["_path"]``). Newer ones that fail their checks are
        skipped with one ``warn`` line saying which and why (the next checkpoint replaces them); CheckpointError
        when none is valid. The writer removes states older than the one taken (a kill between a new checkpoint
        and the removal of its predecessor left both)."""
        bad: list[tuple[Path, str]] = []
        for _, path in self.checkpoints():
            try:
                blob = self._load_state_file(path, cfg)
            except CheckpointError as e:
                bad.append((path, str(e)))
                continue
            if bad:
                newer = ", ".join(p.name for p, _ in bad)
                warn(f"warning: skipping the newer training checkpoint(s) {newer} ({bad[0][1]}); resuming from the "
                     f"newest valid one, {path.name} (step {blob['progress']['step']}); the steps after it are "
                     "redone exactly")
            blob["_path"] = path
            if self.writer:
                self.prune(path, older_only=True)
            return blob
        more = f" (and {len(bad) - 1} older checkpoint(s) fail too)" if len(bad) > 1 else ""
        raise CheckpointError(f"training checkpoint: {bad[0][1]}{more}; no valid checkpoint to resume from, nothing "
                              f"was overwritten; delete {self.checkpoint_dir} to restart the run from step 0")

