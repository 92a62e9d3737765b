"""Training: ``python -m mhar.train CONFIG [key=value ...] --out RUN_DIR [--stop-after K]``.

AdamW (b1 0.9, b2 0.95, eps 1e-8, wd 0.1 on all parameters), linear warmup then cosine to
``min_lr_ratio * lr``, global-norm clipping, bf16 autocast on GPU / fp32 on CPU, gradient
accumulation up to the global batch, DDP or FSDP2 under ``torchrun``. The data order depends only
on the data seed and data config (``mhar.data.shards.BatchOrder``), so variants with one seed are paired.

Continued-pretraining options (``train.init_from``, ``decay_filter``, ``z_loss``, ``ema_decay``,
``log_batch_hash``; helpers in ``mhar.training.optim``) start from an exported model with a fresh
AdamW, decay only matrix weights, add the z-loss to the objective (the logged loss stays the
cross-entropy), keep an EMA of the weights (``model.pt`` = EMA, ``model_raw.pt`` = last iterate)
and log a sha256 of every step's batch. Their defaults leave from-scratch training unchanged.

Run directory (docs/ARCHITECTURE.md "Run directory"): ``config.yaml``, ``metrics.jsonl``,
``summary.json``, ``provenance.json``, ``model.pt``, ``checkpoint/state-<step>.pt`` (each tensor file with
a ``.sha256`` beside it). A new checkpoint is complete (file and checksum) before the previous one is
removed, and a resume takes the newest checkpoint that passes its checks, saying on stderr when it
had to fall back to an older one and why. Re-running into a directory that holds the same run identity
(:func:`mhar.runs.config.identity_hash`) resumes (or does nothing if finished); another identity is
refused. One trainer at a time holds a directory (``.lock``); records are written atomically and
checkpoints are loaded without unpickling objects. A non-finite loss, validation loss or weight
stops the run with :class:`TrainingDiverged`, records it in ``diverged.json`` and leaves the last
good checkpoint in place.

FLOPs (cumulative, training only; PaLM appendix B convention, no causal-mask discount):
``flops/token = 6 * N + 12 * n_layers * n_heads * head_dim * seq_len`` where ``N`` counts every
matmul parameter: all parameters except the input embedding table, plus the output projection
``d_model * vocab`` when it is tied to the embedding. Routing, norms and elementwise ops are left out.
"""
from __future__ import annotations

import time

_IMPORT_TIME = time.time()  # `python -m mhar.train`: the startup report counts from here

import argparse
import fcntl
import json
import math
import os
import random
import re
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import yaml
from torch import nn

from mhar.runs.atomic import check_writable, os_error_line
from mhar.runs.checkpoint import (CheckpointError, atomic_torch_save, atomic_write_bytes, atomic_write_json, atomic_write_text,
                         clean_stale_temps, load_error_brief, safe_torch_load, save_model, sha256_path)
from mhar.model.config import ConfigError
from mhar.data.shards import DataError, TrainData, load_data
from mhar.env import use_compile_cache
from mhar.training.distributed import (DistEnv, all_reduce_mean, all_reduce_sum, barrier, cuda_missing, even_batches, gather_batches,
                          init_distributed, no_grad_sync, shutdown, wrap_model)
from mhar.model.transformer import Transformer
from mhar.training.optim import EMA, batch_digest, load_init_weights, param_groups
from mhar.training.preemption import EXIT_PREEMPTED, Preempted, StopSignals
from mhar.training.tracking import Tracker, check_trackers, log_routing, open_trackers
from mhar.runs.provenance import collect_provenance, utc_now
from mhar.model.routing import check_kernel_env, routing_info
from mhar.runs.config import (RunConfig, dump_yaml, identity_hash, legacy_identity_hash, load_run_config, pairing_hash,
                        recorded_run_config, run_identity, yaml_error_line, yaml_load)
from mhar.training.step import (StepResult, Throughput, TrainStep, autocast_for, build_optimizer, micro_forward, peak_flops,
                   plan_step)

__all__ = ["train", "main", "lr_at", "flops_per_token", "TrainingDiverged", "RunDirError", "STATE_FORMAT"]

STATE_FORMAT = "mhar-train-state-v2"  # v2: loadable with weights_only=True, sha256 beside it
_STATE_RE = re.compile(r"^state-(?P<step>\d+)\.pt$")
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "provenance.json", "model.pt", "checkpoint")


class TrainingDiverged(RuntimeError):
    """Loss or gradient norm became NaN/inf."""


class RunDirError(RuntimeError):
    """The run directory belongs to a different run (nothing was written)."""


# --- small pure pieces ----------------------------------------------------------------------------
def lr_at(step: int, cfg: RunConfig) -> float:
    """LR for optimizer update ``step`` (0-based): linear warmup, then cosine to min_lr_ratio * lr."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.steps - t.warmup_steps - 1)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.lr * (t.min_lr_ratio + (1.0 - t.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def flops_per_token(model: Transformer, seq_len: int) -> float:
    """Training FLOPs per token (see module docstring for the formula)."""
    c = model.cfg
    n = model.num_params(exclude_embedding=True)
    if c.tie_embeddings:
        n += c.d_model * c.vocab_size
    return 6.0 * n + 12.0 * c.n_layers * c.n_heads * c.resolved_head_dim * seq_len


def _peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def _rng_state() -> dict:
    name, keys, pos, has_gauss, gauss = np.random.get_state()  # plain types: weights_only loads it
    st = {"torch": torch.get_rng_state(), "python": random.getstate(),
          "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)]}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    name, keys, pos, has_gauss, gauss = st["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


# --- run directory --------------------------------------------------------------------------------
@dataclass
class RunDir:
    path: Path

    config = property(lambda self: self.path / "config.yaml")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    summary = property(lambda self: self.path / "summary.json")
    provenance = property(lambda self: self.path / "provenance.json")
    model = property(lambda self: self.path / "model.pt")
    checkpoint_dir = property(lambda self: self.path / "checkpoint")
    diverged = property(lambda self: self.path / "diverged.json")
    lockfile = property(lambda self: self.path / ".lock")
    _lock_fd: Optional[int] = None

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

    def state_file(self, step: int) -> Path:
        return self.checkpoint_dir / f"state-{step:08d}.pt"

    def checkpoints(self) -> list[tuple[Optional[int], Path]]:
        """Training states on disk, newest first: ``state-<step>.pt``, then a ``state.pt`` of older versions."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = []
        for p in self.checkpoint_dir.iterdir():
            m = _STATE_RE.match(p.name)
            if m and p.is_file():
                found.append((int(m["step"]), p))
        found.sort(key=lambda sp: -sp[0])
        legacy = self.checkpoint_dir / "state.pt"
        return found + ([(None, legacy)] if legacy.is_file() else [])

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

    def status(self, cfg: RunConfig) -> str:
        """'fresh' | 'resume' | 'done'; raises RunDirError for a directory of another run identity."""
        if not self.config.is_file():
            ours = [n for n in RUN_FILES if (self.path / n).exists()]
            if ours:
                raise RunDirError(f"{self.path} holds run files ({', '.join(ours)}) but no config.yaml; "
                                  "refusing to overwrite them. Choose another --out or delete that directory.")
            return "fresh"
        try:
            old = recorded_run_config(yaml_load(self.config.read_text()))  # a withdrawn routing_impl is no obstacle
        except Exception as e:  # a YAML or config error alike
            why = yaml_error_line(e) if isinstance(e, yaml.YAMLError) else str(e).replace("\n", " ")
            raise RunDirError(f"{self.config} is unreadable ({why}); refusing to overwrite the run in {self.path}") from None
        if identity_hash(old) != identity_hash(cfg):
            diff = _dict_diff(old.to_dict(), cfg.to_dict())
            raise RunDirError(f"{self.path} holds a run of a different config (differs in: {', '.join(diff[:8])}); "
                              "refusing to overwrite it. Choose another --out (the workflow's run paths "
                              "carry the run identity, so a changed definition gets its own directory).")
        if self.summary.is_file():
            try:
                json.loads(self.summary.read_text())
                return "done"
            except (ValueError, UnicodeDecodeError):  # cut short by an older, non-atomic writer
                if not self.checkpoints():
                    raise RunDirError(f"{self.summary} is unreadable and there is no checkpoint to rebuild it "
                                      f"from; move {self.path} aside and train again") from None
        return "resume" if self.checkpoints() else "fresh"


def _dict_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(a) | set(b))
    out = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _dict_diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


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
        else:  # checkpoint from before logs were stored in it
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


# --- state ----------------------------------------------------------------------------------------
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


def _model_and_optim_state(model: nn.Module, raw: Transformer, opt: torch.optim.Optimizer, env: DistEnv):
    if env.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return raw.state_dict(), opt.state_dict()


def save_state(rd: RunDir, cfg: RunConfig, model: nn.Module, raw: Transformer, opt, prog: Progress,
               metrics_bytes: int, env: DistEnv, ema: Optional[EMA] = None,
               metrics_log: Optional[bytes] = None) -> None:
    """Write ``checkpoint/state-<step>.pt`` (+ ``.sha256``, :func:`mhar.runs.checkpoint.atomic_torch_save`), then
    remove the older checkpoints: a valid one is on disk at every instant."""
    model_sd, opt_sd = _model_and_optim_state(model, raw, opt, env)
    ema_sd = ema.state_dict() if ema is not None else None  # collective under FSDP
    if env.is_main:
        path = rd.state_file(prog.step)
        atomic_torch_save({
            "format": STATE_FORMAT, "identity": identity_hash(cfg), "model": model_sd, "optimizer": opt_sd,
            "rng": _rng_state(), "progress": prog.__dict__, "metrics_bytes": metrics_bytes,
            "metrics_log": metrics_log,
            "data": {"seed": cfg.data_seed, "samples_seen": prog.step * cfg.train.global_batch},
            **({"ema": ema_sd} if ema_sd is not None else {}),
        }, path)
        _prune_checkpoints(rd, keep=path)
    barrier(env)


def _prune_checkpoints(rd: RunDir, keep: Path, older_only: bool = False) -> None:
    """Remove every training state but ``keep`` (or only those older than it), the file before its
    checksum (a checksum without its file is ignored), and checksums whose file is gone."""
    paths = [p for _, p in rd.checkpoints()]  # newest first
    older = paths[paths.index(keep) + 1:] if keep in paths else []
    for p in paths:
        if p != keep and (not older_only or p in older):
            p.unlink(missing_ok=True)
            sha256_path(p).unlink(missing_ok=True)
    for side in rd.checkpoint_dir.glob("state*.pt.sha256"):
        if not side.with_name(side.name[: -len(".sha256")]).exists():
            side.unlink(missing_ok=True)


def _load_state_file(path: Path, cfg: RunConfig, legacy: Optional[str] = None) -> dict:
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
    # "identity_hash": a checkpoint written before the one-identity design (mhar.runs.config.legacy_identity_hash)
    if not (blob.get("identity") == identity_hash(cfg) or (legacy and blob.get("identity_hash") == legacy)):
        raise CheckpointError(f"{path} was written by a different config")
    return blob


def load_state(rd: RunDir, cfg: RunConfig, warn: Callable[[str], None] = lambda m: None) -> dict:
    """The newest valid training state. Newer ones that fail their checks are skipped with one ``warn``
    line saying which and why (they are replaced by the next checkpoint); CheckpointError when none is valid."""
    bad: list[tuple[Path, str]] = []
    try:  # the identity an older checkpoint of this run directory recorded (its config.yaml is this run's)
        legacy = legacy_identity_hash(yaml_load(rd.config.read_text()))
    except Exception:
        legacy = None
    for step, path in rd.checkpoints():
        try:
            blob = _load_state_file(path, cfg, legacy)
        except CheckpointError as e:
            bad.append((path, str(e)))
            continue
        if bad:
            newer = ", ".join(p.name for p, _ in bad)
            warn(f"warning: skipping the newer training checkpoint(s) {newer} ({bad[0][1]}); resuming from the "
                 f"newest valid one, {path.name} (step {blob['progress']['step']}); the steps after it are redone "
                 "exactly")
        blob["_path"] = path
        return blob
    more = f" (and {len(bad) - 1} older checkpoint(s) fail too)" if len(bad) > 1 else ""
    raise CheckpointError(f"training checkpoint: {bad[0][1]}{more}; no valid checkpoint to resume from, nothing "
                          f"was overwritten; delete {rd.checkpoint_dir} to restart the run from step 0")


def restore(blob: dict, model: nn.Module, raw: Transformer, opt, env: DistEnv) -> Progress:
    if env.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(model, opt, model_state_dict=blob["model"], optim_state_dict=blob["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
    else:
        raw.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optimizer"])
    _set_rng_state(blob["rng"])
    return Progress(**blob["progress"])


def _export_model(path: Path, model: nn.Module, raw: Transformer, cfg: RunConfig, env: DistEnv, extra: dict) -> None:
    if env.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if env.is_main:
            cpu = Transformer(cfg.model)
            cpu.load_state_dict(sd)
            save_model(path, cpu, cfg.data.tokenizer, extra)
    elif env.is_main:
        save_model(path, raw, cfg.data.tokenizer, extra)
    barrier(env)


# --- the loop -------------------------------------------------------------------------------------
class Progressbar:
    """tqdm on a TTY, periodic log lines otherwise (rank 0 only)."""

    def __init__(self, total: int, start: int, every: int, enabled: bool, log: Callable[[str], None]):
        self.every, self.enabled, self.log, self.bar = every, enabled, log, None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, dynamic_ncols=True)

    def update(self, step: int, row: dict, tok_s: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}", tok_s=f"{tok_s:,.0f}")
        elif step % self.every == 0:
            self.log(f"step {step} loss {row['loss']:.4f} lr {row['lr']:.3e} gnorm {row['grad_norm']:.3f} "
                     f"tokens {row['tokens']:,} tok/s {tok_s:,.0f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


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


def _log(env: DistEnv) -> Callable[[str], None]:
    return (lambda msg: print(f"[mhar.train] {msg}", flush=True)) if env.is_main else (lambda msg: None)


def train(cfg: RunConfig, out_dir: str | os.PathLike, *, stop_after: Optional[int] = None,
          started: Optional[float] = None) -> Optional[dict]:
    """Train (or resume, or skip if finished) the run in ``out_dir``; returns the summary dict.

    ``stop_after=k`` checkpoints after step k and returns None (as if the job were killed there).
    SIGTERM, SIGUSR1 and SIGINT finish the current step, checkpoint it and raise
    :class:`mhar.training.preemption.Preempted` (the CLI: one line, exit code ``EXIT_PREEMPTED``).
    ``started``: the wall time the startup report counts from (default: now; the CLI: its import).
    """
    started = time.time() if started is None else started
    # persistent torch.compile / Triton caches (autotuning results included) beside the data cache: a second
    # run of the same shapes starts without compiling or autotuning (mhar.env.use_compile_cache)
    cache = use_compile_cache(Path(cfg.data.cache_dir).parent / "compile")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    try:  # the fused kernels' choice knobs (MHAR_ROUTING_*), before any work
        check_kernel_env()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    missing = cuda_missing(cfg.train.device, f"train.device={cfg.train.device}", "train.device=cpu (or auto)")
    if missing:
        raise ConfigError(missing)
    check_trackers(cfg.train.tracking)  # a tracker whose package is missing: fail before any work
    env = init_distributed(cfg.train.device, cfg.train.parallel)
    rd = RunDir(Path(out_dir))
    try:
        if env.is_main:  # before any data is loaded: an unusable --out fails in a second
            rd.acquire()
        with StopSignals() as stop:
            return _train(cfg, rd, env, stop_after, {"started": started, "compile_cache": cache}, stop)
    finally:
        rd.release()
        shutdown(env)


def _train(cfg: RunConfig, rd: RunDir, env: DistEnv, stop_after: Optional[int], boot: dict,
           stop: StopSignals) -> Optional[dict]:
    log, t = _log(env), cfg.train
    status = rd.status(cfg)
    if status == "done":
        log(f"{rd.path} already holds the finished run of this config; nothing to do")
        return json.loads(rd.summary.read_text())
    warn = (lambda m: print(m, file=sys.stderr, flush=True)) if env.is_main else (lambda m: None)
    blob = load_state(rd, cfg, warn) if status == "resume" else None
    accum = t.global_batch // (t.micro_batch * env.world_size)
    if accum * t.micro_batch * env.world_size != t.global_batch:
        raise ConfigError(f"train.global_batch={t.global_batch} is not divisible by micro_batch*world_size="
                          f"{t.micro_batch}*{env.world_size}")

    # data: rank 0 tokenizes (once, cached), the others then read the cache
    if env.is_main:
        data = load_data(cfg.data, cfg.model.vocab_size, t.global_batch, cfg.data_seed, log)
    barrier(env)
    if not env.is_main:
        data = load_data(cfg.data, cfg.model.vocab_size, t.global_batch, cfg.data_seed, log)

    torch.manual_seed(t.seed)
    raw = Transformer(cfg.model)
    if t.init_from:  # continued pretraining: start from exported weights; the optimizer cold-starts
        load_init_weights(raw, t.init_from)
    raw = raw.to(env.device)
    model = wrap_model(raw, env)
    plan = plan_step(raw, env.device, compile=t.compile, cuda_graph=t.cuda_graph, world_size=env.world_size,
                     parallel=env.parallel)
    routing = routing_info(raw, env.device)  # what routing_impl (default auto) runs on this device
    opt = build_optimizer(model, param_groups(model, t.weight_decay, t.decay_filter), t.lr, (t.beta1, t.beta2),
                          t.eps, plan, env.device)
    prog = Progress()
    if blob is not None:
        if env.is_main:  # a kill between a new checkpoint and the removal of its predecessor left both
            _prune_checkpoints(rd, blob["_path"], older_only=True)
        prog = restore(blob, model, raw, opt, env)
        log(f"resuming {rd.path} from step {prog.step}")
    ema = EMA(model, t.ema_decay) if t.ema_decay > 0 else None
    if ema is not None and blob is not None:
        ema.load_state_dict(blob["ema"])
    step_fn = TrainStep(model, raw, opt, plan, device=env.device, dtype=t.dtype, grad_clip=t.grad_clip,
                        z_weight=t.z_loss, grad_sync=lambda i, n: no_grad_sync(model, env, skip=i < n - 1),
                        reduce_mean=lambda v: all_reduce_mean(v, env))

    if env.is_main:
        rd.path.mkdir(parents=True, exist_ok=True)
        if status == "fresh":
            atomic_write_text(rd.config, dump_yaml(cfg.to_dict()))
        prov = collect_provenance(cfg.to_dict())
        prov.update(identity=identity_hash(cfg), pairing=pairing_hash(cfg), run=run_identity(cfg),
                    start_time=utc_now(), end_time=None,
                    world_size=env.world_size, parallel=env.parallel, device=str(env.device), routing=routing,
                    resumed_from_step=prog.step if blob is not None else None)
        old = _read_json(rd.provenance) if blob is not None else None
        if old is not None:  # keep the first segment's start time
            prov["start_time"] = old.get("start_time", prov["start_time"])
            prov["resumes"] = old.get("resumes", []) + [{"step": prog.step, "time_utc": prov["time_utc"]}]
        atomic_write_json(rd.provenance, prov)
    tracker = (open_trackers(cfg, rd.path, t.tracking, resume_step=prog.step if blob is not None else None,
                             provenance=prov) if env.is_main else Tracker())
    metrics = MetricsLog(rd.metrics, env.is_main)
    metrics.open(blob["metrics_bytes"] if blob is not None else None,
                 blob.get("metrics_log") if blob is not None else None)

    fpt = flops_per_token(raw, cfg.data.seq_len)
    tokens_per_step = t.global_batch * cfg.data.seq_len
    peak = peak_flops(env.device)
    bar = Progressbar(t.steps, prog.step, t.log_every, env.is_main, log)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    log(f"{cfg.variant}/{cfg.size}/seed{t.seed}: {raw.num_params():,} params, {t.steps} steps x "
        f"{tokens_per_step:,} tokens, accum {accum}, world {env.world_size}, device {env.device}; "
        f"step: {plan.describe()}"
        + (f"; routing {routing['impl']} -> {routing['resolved']}{' (PDL)' if routing['pdl'] else ''}"
           if routing["resolved"] else ""))
    seg_start, wall0 = time.time(), prog.wall_s
    speed = Throughput(tokens_per_step, fpt, peak, env.world_size)
    startup = {"first_step_s": None, "first_timed_step_s": None,
               "compile_cache": boot["compile_cache"]["env"]["TORCHINDUCTOR_CACHE_DIR"],
               "compile_cache_warm": boot["compile_cache"]["warm"]}
    seg_steps = 0
    model.train()
    try:
        signum = stop.requested(env)  # a signal while the data and model were loaded: nothing new to save
        if signum:
            raise Preempted(prog.step, signum)
        while prog.step < t.steps:
            t_step = time.perf_counter()
            lr = lr_at(prog.step, cfg)
            batches = list(data.micro_batches(prog.step, env.rank, env.world_size, t.micro_batch))
            res: StepResult = step_fn(batches, lr)
            loss_val, gnorm = res.loss, res.grad_norm
            if not res.finite:  # the step left weights and optimizer state untouched
                raise _diverged(rd, prog, env, "loss/grad norm", step=prog.step + 1, loss=loss_val, grad_norm=gnorm)
            if ema is not None:
                ema.update()
            step_s = time.perf_counter() - t_step
            seg_steps += 1
            if seg_steps == 1:  # the cold start: data, model, compilation, autotuning of the first step
                startup["first_step_s"] = round(time.time() - boot["started"], 3)
            if seg_steps == speed.skip:  # the steps Throughput times start here (after warm-up and capture)
                startup["first_timed_step_s"] = round(time.time() - boot["started"], 3)
                log(f"startup: first step done {startup['first_step_s']} s after the start, timed steps from "
                    f"{startup['first_timed_step_s']} s (compile cache {startup['compile_cache']}: "
                    f"{'warm' if startup['compile_cache_warm'] else 'cold'})")
            prog.step += 1
            prog.tokens += tokens_per_step
            prog.flops += fpt * tokens_per_step
            prog.train_s += step_s
            prog.wall_s = wall0 + time.time() - seg_start
            row = {"split": "train", "step": prog.step, "loss": loss_val, "lr": lr, "grad_norm": gnorm,
                   "tokens": prog.tokens, "wall_s": round(prog.wall_s, 3), "flops": prog.flops,
                   **speed.add(step_s)}
            if t.log_batch_hash:
                row["batch_sha256"] = batch_digest(gather_batches(batches, env))  # the global batch
            metrics.write(row)
            tracker.log(prog.step, {f"train/{k}": v for k, v in row.items() if k != "step"})
            bar.update(prog.step, row, speed.recent_tokens_per_s())

            final = prog.step == t.steps
            if prog.step % t.eval_every == 0 or final:
                val = evaluate(model, data, cfg, env)
                if not (math.isfinite(val) and (not final or _weights_finite(model, env))):
                    raise _diverged(rd, prog, env, "validation loss/weights", step=prog.step, val_loss=val)
                prog.val_losses.append([prog.step, val])
                prog.wall_s = wall0 + time.time() - seg_start
                metrics.write({"split": "val", "step": prog.step, "val_loss": val, "tokens": prog.tokens,
                               "wall_s": round(prog.wall_s, 3), "flops": prog.flops})
                tracker.log(prog.step, {"val/loss": val, "train/peak_mem_gb": _peak_mem_gb(env.device)})
                if t.tracking:  # every rank: a forward pass under FSDP is collective
                    log_routing(tracker, prog.step, _routing_weights(model, data, cfg, env))
                log(f"step {prog.step} val_loss {val:.4f}")
            stopping = stop_after is not None and prog.step >= stop_after and not final
            signum = 0 if final else stop.requested(env)  # SIGTERM/SIGUSR1/SIGINT: checkpoint, then stop
            if prog.step % t.checkpoint_every == 0 or final or stopping or signum:
                prog.last_ckpt_step = prog.step
                log_bytes = metrics.content()
                save_state(rd, cfg, model, raw, opt, prog, len(log_bytes or b""), env, ema, log_bytes)
                if t.save_model_every_checkpoint and not final:
                    _export_model(rd.path / "checkpoint" / "model.pt", model, raw, cfg, env, {"step": prog.step})
            if signum:
                raise Preempted(prog.step, signum)
            if stopping:
                log(f"stopped after step {prog.step} (--stop-after); resume by running the same command again")
                return None
    except BaseException:  # stopped, diverged or failed: what was tracked so far is flushed
        tracker.close()
        raise
    finally:
        bar.close()
        metrics.close()

    summary = _summary(cfg, raw, prog, env)
    summary.update(speed.summary(plan))
    summary["startup"] = startup
    extra = {"step": prog.step, "variant": cfg.variant, "size": cfg.size, "seed": t.seed,
             "run": run_identity(cfg)}
    if ema is None:
        _export_model(rd.model, model, raw, cfg, env, extra)
    else:  # model.pt holds the EMA weights (what gets evaluated), model_raw.pt the last iterate
        _export_model(rd.path / "model_raw.pt", model, raw, cfg, env, {**extra, "weights": "raw"})
        with ema.applied():
            summary["final_val_loss_ema"] = evaluate(model, data, cfg, env)
            _export_model(rd.model, model, raw, cfg, env, {**extra, "weights": f"ema{t.ema_decay}"})
    tracker.log(prog.step, {f"summary/{k}": v for k, v in summary.items()})
    tracker.close()
    if env.is_main:
        atomic_write_json(rd.summary, summary)
        prov = _read_json(rd.provenance) or {}
        prov["end_time"] = utc_now()
        atomic_write_json(rd.provenance, prov)
        log(f"done: tail-mean val loss {summary['tail_mean_val_loss']:.4f} over the last "
            f"{len(summary['val_losses'][-t.tail_k:])} evals -> {rd.path}")
    return summary


def _routing_weights(model: nn.Module, data: TrainData, cfg: RunConfig, env: DistEnv) -> dict:
    """Depth weights of the routed variants (site -> (B, T, heads, sources)) on the first validation
    micro-batch (the same batch at every evaluation); {} for a variant without routing."""
    x = even_batches(list(data.val_batches(cfg.train.micro_batch, env.rank, env.world_size)), env)[0][0]
    model.eval()
    with torch.no_grad(), autocast_for(env.device, cfg.train.dtype):
        routing = model(x.to(env.device), collect_routing=True).routing or {}
    model.train()
    return routing


def _weights_finite(model: nn.Module, env: DistEnv) -> bool:
    bad = torch.zeros((), device=env.device)
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        bad += (~torch.isfinite(local.detach())).sum()
    return float(all_reduce_sum(bad, env)) == 0


def _diverged(rd: RunDir, prog: Progress, env: DistEnv, what: str, step: int, **values) -> TrainingDiverged:
    """The exception to raise for a non-finite ``what``, after recording it in ``diverged.json``."""
    where = (f"the last good checkpoint (step {prog.last_ckpt_step}) is kept in {rd.state_file(prog.last_ckpt_step)}"
             if prog.last_ckpt_step is not None else "no checkpoint had been written yet")
    values = {k: v if not isinstance(v, float) or math.isfinite(v) else str(v) for k, v in values.items()}
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    msg = (f"non-finite {what} at step {step} ({shown}); run stopped, {where}, recorded in {rd.diverged}. Lower train.lr, raise "
           "train.warmup_steps or set train.grad_clip, and train the changed config (a new run directory)")
    if env.is_main:
        atomic_write_json(rd.diverged, {"status": "diverged", "what": what, "step": step, **values,
                                        "last_checkpoint_step": prog.last_ckpt_step, "time_utc": utc_now(),
                                        "message": msg})
    return TrainingDiverged(msg)


def _read_json(path: Path) -> Optional[dict]:
    """A JSON record, or None when it is missing or unreadable (it is then rewritten)."""
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return out if isinstance(out, dict) else None


def _summary(cfg: RunConfig, raw: Transformer, prog: Progress, env: DistEnv) -> dict:
    t = cfg.train
    tail = [v for _, v in prog.val_losses[-t.tail_k:]]
    return {
        "variant": cfg.variant, "size": cfg.size, "seed": t.seed, "identity": identity_hash(cfg),
        "steps": prog.step, "tokens": prog.tokens,
        "tail_mean_val_loss": float(np.mean(tail)) if tail else None, "tail_k": t.tail_k,
        "final_val_loss": prog.val_losses[-1][1] if prog.val_losses else None,
        "val_losses": prog.val_losses, "wall_s": round(prog.wall_s, 3), "flops": prog.flops,
        "params": raw.num_params(), "tokens_per_s": prog.tokens / max(prog.train_s, 1e-9),
        "peak_mem_gb": round(_peak_mem_gb(env.device), 3), "run": run_identity(cfg),
    }


# --- CLI ------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mhar.train", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="run config YAML (see config/train/)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.lr=3e-4")
    p.add_argument("--out", required=True, help="run directory (created; resumed if it holds this config)")
    p.add_argument("--stop-after", type=int, default=None, help="checkpoint and exit after this step")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config, its run identity and pairing hash, then exit")
    args = p.parse_args(argv)
    try:
        cfg = load_run_config(args.config, args.overrides)
        if args.print_config:
            print(dump_yaml(cfg.to_dict()) + f"# identity: {identity_hash(cfg)}\n# pairing: {pairing_hash(cfg)}")
            return 0
        train(cfg, args.out, stop_after=args.stop_after, started=_IMPORT_TIME)
    except Preempted as e:  # a checkpoint of step e.step is on disk
        if os.environ.get("RANK", "0") == "0":
            print(e, file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt:  # Ctrl-C twice (or before training began): no traceback
        print(f"interrupted; completed checkpoints in {args.out} are kept: run the same command again to resume",
              file=sys.stderr)
        return 130
    except (ConfigError, DataError, RunDirError, CheckpointError, TrainingDiverged) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, read-only, no permission: records are atomic, so nothing complete is lost
        print("error: " + os_error_line(e, "training", f"completed checkpoints and records in {args.out} are kept; "
                                        "fix that, then run the same command again to resume"), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
