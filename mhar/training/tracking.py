"""Experiment tracking: a copy of the training metrics for TensorBoard and Weights & Biases.

``train.tracking`` names the trackers (``tensorboard``, ``wandb``, several at once, or none: the
default). :func:`open_trackers` returns one :class:`Tracker` that fans out to them; the trainer calls
``log(step, row)`` with every row it writes to ``metrics.jsonl`` (scalars ``<split>/<key>``, e.g.
``train/loss``, ``val/val_loss``), ``log_image`` with the depth-weight heatmap of a routed variant at
evaluation steps, and ``close`` at the end. The resolved config, the run identity and provenance go
in as the tracked run's config (W&B) and as text (TensorBoard).

Tracking is an observer. A tracker's failure (opening, writing, flushing, closing; a full disk, a
read-only folder, no login; in the call or in the tracker's own writer thread, such as TensorBoard's) is
one warning line naming the tracker, the path and the errno; that tracker is off for the rest of the
process (the run goes on; ``metrics.jsonl`` keeps every row) and the failure is recorded under ``off`` in
``tracking.json`` and in the run's ``summary.json`` (``tracking``). No traceback is printed for it from
any thread (a :func:`threading.excepthook` claims the trackers' threads while trackers are open). With
``train.tracking_required: true`` a failure instead sets :attr:`Tracker.must_stop`: the trainer
checkpoints the step and stops with :class:`TrackingError` (one ``error:`` line). A resumed run tries
every tracker again (``off`` keeps the earlier segments' failures: the gaps in the tracked curves).

The run folder keeps what a resumed run needs to continue the same tracked run, in
``tracking.json``: the W&B run id (resumed with ``resume="allow"``), project, group and name, and
the TensorBoard log folder ``tensorboard/``. A resume after a checkpoint at step k discards the
events a killed segment logged after k (TensorBoard's ``purge_step``; W&B charts use the trainer's
``step`` as their x axis, so a step logged twice shows the same value twice). :func:`read_record`
checks the file (its JSON, the keys and their types, the W&B id and project as W&B accepts them) before
anything is opened: a damaged one is a :class:`TrackingError` naming it and the choices.

W&B follows its own environment: ``WANDB_MODE=offline`` (no network: the run is written under
``<run>/wandb/`` for a later ``wandb sync``), ``WANDB_PROJECT`` (default ``mhar``), ``WANDB_ENTITY``.
The group is ``train.tracking_group`` (the workflow sets the config's hash), the name
``<label>/<size>/seed<k>``. Neither package is a dependency of the trainer: asking for a tracker
whose package is missing is a :class:`mhar.model.config.ConfigError` naming what to install.
"""
from __future__ import annotations

import errno
import importlib.util
import json
import math
import os
import re
import secrets
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from mhar import env
from mhar.model.config import ConfigError
from mhar.atomic import atomic_write_json, os_error_line
from mhar.runs.config import RunConfig, run_identity, tracker_names
from mhar.safe_yaml import dump_yaml

__all__ = ["Tracker", "TrackingError", "open_trackers", "check_trackers", "read_record", "routing_summary",
           "log_routing", "TRACKING_FILE", "TB_DIR"]

TRACKING_FILE = "tracking.json"  # in the run folder: what a resumed run continues
TB_DIR = "tensorboard"  # TensorBoard event files, in the run folder
WANDB_DIR = "wandb"  # W&B's files (offline runs for `wandb sync`), in the run folder
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker -> the pip package it needs
# tracker -> the modules whose code runs in its threads (TensorBoard's writer thread is tensorboard's)
_MODULES = {"tensorboard": ("tensorboard", "torch.utils.tensorboard"), "wandb": ("wandb",)}
_WANDB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # ids this module writes and W&B's own; a path component as well
_WANDB_PROJECT_CHARS = "/\\#?%:"  # what W&B refuses in a project name (as its Settings do), at most 128 characters
_MESSAGE_CHARS = 200  # a tracker's own error message is cut there (a traceback's text never reaches the user)


class TrackingError(RuntimeError):
    """A damaged ``tracking.json``, or a tracker that failed under ``train.tracking_required``: one line."""


def check_trackers(names: Sequence[str]) -> list[str]:
    """``names`` validated (:func:`mhar.runs.config.tracker_names`); ConfigError when a package is missing."""
    names = tracker_names(list(names))
    missing = [n for n in names if importlib.util.find_spec(_PACKAGES[n]) is None]
    if missing:
        pkgs = " ".join(_PACKAGES[n] for n in missing)
        raise ConfigError(f"train.tracking={','.join(names)}: {pkgs} is not installed; pip install {pkgs} "
                          "(or pip install -e '.[track]'), or set train.tracking=none")
    return names


# --- tracking.json ---------------------------------------------------------------------------------------------
def _wandb_project_problem(value: Any) -> Optional[str]:
    if not isinstance(value, str) or not value:
        return f"expected a non-empty string, got {value!r}"
    bad = sorted({c for c in value if c in _WANDB_PROJECT_CHARS})
    if bad or len(value) > 128:
        return (f"{value[:_MESSAGE_CHARS]!r} is not a W&B project name (at most 128 characters, none of "
                f"{_WANDB_PROJECT_CHARS})")
    return None


def _record_problem(record: Any) -> Optional[str]:
    """What is wrong with a parsed ``tracking.json`` (None: nothing)."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    if not isinstance(record.get("name"), str) or not record["name"]:
        return "'name' is missing or not a non-empty string"
    tb = record.get("tensorboard")
    if tb is not None and not (isinstance(tb, dict) and isinstance(tb.get("log_dir"), str)):
        return "'tensorboard' must be an object with a string 'log_dir'"
    off = record.get("off", [])
    if not (isinstance(off, list) and all(isinstance(o, dict) and isinstance(o.get("backend"), str) for o in off)):
        return "'off' must be a list of objects, each with a string 'backend'"
    wb = record.get("wandb")
    if wb is None:
        return None
    if not isinstance(wb, dict):
        return f"'wandb' must be an object, got {type(wb).__name__}"
    for key in ("id", "project", "name", "dir", "group"):
        if key not in wb:
            return f"'wandb.{key}' is missing"
    for key in ("name", "dir"):
        if not isinstance(wb[key], str):
            return f"'wandb.{key}' must be a string, got {type(wb[key]).__name__}"
    if wb["group"] is not None and not isinstance(wb["group"], str):
        return f"'wandb.group' must be a string or null, got {type(wb['group']).__name__}"
    if not (isinstance(wb["id"], str) and _WANDB_ID.fullmatch(wb["id"])):
        return (f"'wandb.id' {str(wb['id'])[:_MESSAGE_CHARS]!r} is not a W&B run id (1 to 64 letters, digits, "
                "'-' or '_')")
    problem = _wandb_project_problem(wb["project"])
    return f"'wandb.project': {problem}" if problem else None


def read_record(run_dir: str | os.PathLike) -> dict:
    """``run_dir/tracking.json`` checked (``{}`` when there is none): a file that cannot be read, is not JSON, or
    has wrong keys or types (a W&B id or project W&B would refuse included) is a :class:`TrackingError`."""
    path = Path(run_dir) / TRACKING_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # unreadable, not UTF-8
        problem = os_error_line(e, "reading") if isinstance(e, OSError) else f"not UTF-8 text ({e})"
        raise _damaged(path, problem) from None
    try:
        record = json.loads(text)
    except ValueError as e:
        raise _damaged(path, f"not valid JSON ({e})") from None
    problem = _record_problem(record)
    if problem:
        raise _damaged(path, problem)
    return record


def _damaged(path: Path, problem: str) -> TrackingError:
    return TrackingError(f"{path} is damaged: {problem}; move it away to start a new tracked run (training resumes "
                         "from its checkpoint; W&B starts a new run), or fix it (it records the W&B run id, project, "
                         "group and name that a resume continues)")


# --- tracker threads ------------------------------------------------------------------------------------------
_live: list["_Slot"] = []  # opened trackers of this process, whose threads' exceptions the hook claims
_previous_hook: Optional[Callable] = None


def _thread_hook(args: "threading.ExceptHookArgs") -> None:
    """An exception ending a thread that runs a live tracker's code is that tracker's failure (reported once, as
    a warning, by the trainer's next call into it); any other goes to the previous hook."""
    modules = set()
    tb = args.exc_traceback
    while tb is not None:
        modules.add(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    if args.thread is not None:
        modules.add(type(args.thread).__module__)
    for slot in list(_live):
        if any(m == p or m.startswith(p + ".") for m in modules for p in _MODULES[slot.name]):
            if slot.thread_error is None and isinstance(args.exc_value, Exception):
                slot.thread_error = args.exc_value
            return
    (_previous_hook or threading.__excepthook__)(args)


def _watch(slot: "_Slot") -> None:
    global _previous_hook
    if threading.excepthook is not _thread_hook:
        _previous_hook, threading.excepthook = threading.excepthook, _thread_hook
    _live.append(slot)


def _unwatch(slot: "_Slot") -> None:
    global _previous_hook
    if slot in _live:
        _live.remove(slot)
    if not _live and threading.excepthook is _thread_hook:
        threading.excepthook, _previous_hook = _previous_hook or threading.__excepthook__, None


# --- the fan-out ----------------------------------------------------------------------------------------------
class _Slot:
    """One requested tracker: its name, where it writes, the opened backend (None once off), a failure its
    threads reported."""

    def __init__(self, name: str, where: Path):
        self.name, self.where = name, where
        self.backend: Any = None
        self.thread_error: Optional[Exception] = None


class _OpenFailed(Exception):
    """A tracker could not be opened; the message says why and what to do."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Tracker:
    """Fan-out to the opened trackers; with none it does nothing (the trainer calls it unconditionally).

    Every call into a tracker is guarded: a failure turns that tracker off (see the module docstring), is
    recorded in ``record["off"]`` (saved to ``run_dir/tracking.json``) and warned about once through ``warn``;
    ``required`` (``train.tracking_required``): no warning, :attr:`must_stop` instead, :meth:`error` the line.
    """

    def __init__(self, run_dir: Optional[str | os.PathLike] = None, record: Optional[dict] = None, *,
                 names: Sequence[str] = (), required: bool = False, step: int = 0,
                 warn: Callable[[str], None] = _stderr):
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.record = record if record is not None else {}
        self.names, self.required, self.step, self._warn = list(names), required, step, warn
        self.failure: Optional[str] = None  # the first failure, as one line
        self._slots: list[_Slot] = []

    @property
    def active(self) -> bool:
        return any(s.backend is not None for s in self._slots)

    @property
    def must_stop(self) -> bool:
        """A tracker failed and ``train.tracking_required`` is set."""
        return self.required and self.failure is not None

    def error(self) -> TrackingError:
        return TrackingError(f"{self.failure}; train.tracking_required=true stops the run: completed checkpoints "
                             f"in {self.run_dir} are kept; fix that, then run the same command again to resume "
                             "(or set train.tracking_required=false to train on without the tracker)")

    def report(self) -> dict:
        """For summary.json: the trackers asked for and every failure recorded (earlier segments' included)."""
        return {"trackers": self.names, "off": list(self.record.get("off", []))}

    # the trainer's calls
    def log(self, step: int, metrics: dict) -> None:
        """Numeric entries of ``metrics`` at trainer step ``step`` (non-numeric ones are skipped)."""
        self.step = step
        values = {k: float(v) for k, v in metrics.items()
                  if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)}
        if values:
            self._each(lambda b: b.log(step, values))

    def log_image(self, step: int, tag: str, array: np.ndarray) -> None:
        """A (H, W) array of values in [0, 1] (or (H, W, 3) uint8) as an image."""
        self.step = step
        img = np.asarray(array)
        if img.dtype != np.uint8:
            img = (np.clip(np.nan_to_num(img.astype(np.float64)), 0.0, 1.0) * 255).round().astype(np.uint8)
        self._each(lambda b: b.log_image(step, tag, img))

    def close(self) -> None:
        for slot in self._slots:
            backend, slot.backend = slot.backend, None
            if backend is not None:
                try:
                    backend.close()
                except Exception as e:
                    self._fail(slot, e)
                else:  # a failure its thread reported while finishing (TensorBoard: the last writes)
                    self._check(slot)
            _unwatch(slot)
        self._slots = []

    # guarding
    def _open(self, name: str, where: Path, make: Callable[[], Any]) -> None:
        slot = _Slot(name, where)
        self._slots.append(slot)
        _watch(slot)
        try:
            slot.backend = make()
        except Exception as e:
            self._fail(slot, e)
        else:
            self._check(slot)

    def _each(self, call: Callable[[Any], None]) -> None:
        for slot in self._slots:
            if slot.backend is None:
                continue
            try:
                call(slot.backend)
            except Exception as e:
                self._fail(slot, e)
            else:
                self._check(slot)

    def _check(self, slot: _Slot) -> None:
        if slot.thread_error is not None and slot.backend is not None:
            self._fail(slot, slot.thread_error)

    def _fail(self, slot: _Slot, e: Exception) -> None:
        self._off([slot], e)

    def _refuse(self, names: Sequence[str], where: Path, e: Exception) -> None:
        """The trackers ``names`` are off before they were opened (one failure, ``e``, at ``where``)."""
        slots = [_Slot(n, where) for n in names]
        self._slots += slots
        self._off(slots, e)

    def _off(self, slots: list[_Slot], e: Exception) -> None:
        """The trackers of ``slots`` are off after ``e``: closed quietly, recorded, warned about once."""
        for slot in slots:
            backend, slot.backend = slot.backend, None
            if backend is not None:
                try:
                    backend.close()
                except Exception:  # it failed already: what it says on the way out adds nothing
                    pass
            line, entry = _failure(slot, e, self.step)
            self.failure = self.failure or line
            self.record.setdefault("off", []).append(entry)
        saved = ""
        if self.run_dir is not None:
            try:
                atomic_write_json(self.run_dir / TRACKING_FILE, self.record)
                saved = f"; recorded in {self.run_dir / TRACKING_FILE}"
            except OSError:  # the same full disk, most likely: summary.json records it too
                pass
        if not self.required:
            off = " and ".join(s.name for s in slots)
            self._warn(f"warning: {_failure(slots[0], e, self.step)[0]}; training goes on without {off} from step "
                       f"{self.step} (metrics.jsonl keeps every row{saved}); set train.tracking_required=true to stop "
                       "instead")


def _failure(slot: _Slot, e: Exception, step: int) -> tuple[str, dict]:
    """One line (``tracking: <tracker> failed on <path>: <why> (<ERRNO>); <advice>``) and the record entry."""
    code, path = None, slot.where
    if isinstance(e, OSError):
        path = os.fsdecode(e.filename) if e.filename else slot.where  # TensorBoard names files in bytes; write(2) none
        why = os_error_line(OSError(e.errno, e.strerror or str(e), str(path)), slot.name)
        code = errno.errorcode.get(e.errno) if e.errno is not None else None
    elif isinstance(e, _OpenFailed):
        why = f"{slot.name} failed ({slot.where}): {e}"
    else:
        text = (str(e).strip().splitlines() or [""])[0][:_MESSAGE_CHARS]
        why = f"{slot.name} failed ({slot.where}): {type(e).__name__}{': ' + text if text else ''}"
    return f"tracking: {why}", {"backend": slot.name, "step": step, "path": str(path), "errno": code, "error": why}


# --- the trackers ---------------------------------------------------------------------------------------------
class _TensorBoard:
    def __init__(self, log_dir: Path, purge_step: Optional[int], texts: dict):
        from torch.utils.tensorboard import SummaryWriter  # needs the optional `tensorboard` package

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
        if purge_step is None:  # once per tracked run
            for tag, text in texts.items():
                self.writer.add_text(tag, f"```\n{text}\n```", 0)
            self.writer.flush()

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
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:_MESSAGE_CHARS]
            raise _OpenFailed(f"wandb.init failed ({why}); log in (wandb login) or set WANDB_MODE=offline (the run is "
                              "kept under <run>/wandb/ for wandb sync)") from None
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")  # the trainer's step is the x axis, across resumes

    def log(self, step: int, values: dict) -> None:
        self.run.log({"step": step, **values})

    def log_image(self, step: int, tag: str, img: np.ndarray) -> None:
        self.run.log({"step": step, tag: self.wandb.Image(img)})

    def close(self) -> None:
        self.run.finish()


def open_trackers(cfg: RunConfig, run_dir: str | os.PathLike, names: Sequence[str], *,
                  resume_step: Optional[int] = None, provenance: Optional[dict] = None,
                  warn: Callable[[str], None] = _stderr) -> Tracker:
    """Open the trackers ``names`` for the run in ``run_dir`` (rank 0 only).

    ``resume_step``: the checkpoint step a resumed run continues from (None: a fresh run); the tracked
    run recorded in ``run_dir/tracking.json`` is then continued. ``provenance``: logged with the config.
    A damaged ``tracking.json`` raises :class:`TrackingError`; a tracker that cannot be opened is a failure as
    any other (``warn``, or :attr:`Tracker.must_stop` under ``train.tracking_required``).
    """
    names = check_trackers(names)
    if not names:
        return Tracker()
    run_dir = Path(run_dir)
    ident = run_identity(cfg)
    record = read_record(run_dir)
    record.setdefault("name", f"{ident['label']}/{cfg.size}/seed{cfg.seed}")
    tracker = Tracker(run_dir, record, names=names, required=cfg.train.tracking_required,
                      step=resume_step or 0, warn=warn)
    if "tensorboard" in names:
        record["tensorboard"] = {"log_dir": TB_DIR}
    wb = None
    if "wandb" in names:
        wb = dict(record.get("wandb") or {})
        wb.setdefault("id", f"{ident['identity'][:8]}-{secrets.token_hex(4)}")
        wb.setdefault("project", env.wandb_project())
        wb["group"] = cfg.train.tracking_group or wb.get("group")
        wb["name"], wb["dir"] = record["name"], WANDB_DIR
        record["wandb"] = wb
    try:  # before any tracker is opened: the W&B id is on disk before its run exists
        atomic_write_json(run_dir / TRACKING_FILE, record)
    except OSError as e:  # every tracker off: a resume could not continue what they would start
        tracker._refuse(names, run_dir / TRACKING_FILE, OSError(e.errno, e.strerror, str(run_dir / TRACKING_FILE)))
        return tracker
    if "tensorboard" in names:
        texts = {"config": dump_yaml(cfg.to_dict()), "identity": json.dumps(ident, indent=1)}
        if provenance is not None:
            texts["provenance"] = json.dumps(provenance, indent=1, default=str)
        # a tracked run continues where its checkpoint was: a resume purges what a killed segment logged later
        purge = resume_step + 1 if resume_step is not None and (run_dir / TB_DIR).is_dir() else None
        tracker._open("tensorboard", run_dir / TB_DIR, lambda: _TensorBoard(run_dir / TB_DIR, purge, texts))
    if wb is not None:
        config = {"config": cfg.to_dict(), "identity": ident["identity"], "pairing": ident["pairing"],
                  "run": {k: v for k, v in ident.items() if k != "config"}}
        if provenance is not None:  # the config and run record are there already
            config["provenance"] = {k: v for k, v in provenance.items() if k not in ("config", "run")}
        problem = _wandb_project_problem(wb["project"])  # from $WANDB_PROJECT: refused here, not by wandb's Settings
        if problem:
            tracker._refuse(["wandb"], run_dir / WANDB_DIR,
                            _OpenFailed(f"$WANDB_PROJECT: {problem}; set WANDB_PROJECT to another name"))
        else:
            tracker._open("wandb", run_dir / WANDB_DIR, lambda: _WandB(run_dir, wb, config))
    return tracker


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
