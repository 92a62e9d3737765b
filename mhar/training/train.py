"""The training loop: ``train(cfg, run_dir)``, what ``python -m mhar.train`` (:mod:`mhar.training.cli`) runs.

AdamW (b1 0.9, b2 0.95, eps 1e-8, wd 0.1 on all parameters), linear warmup then cosine to
``min_lr_ratio * lr``, global-norm clipping, bf16 autocast on GPU / fp32 on CPU, gradient
accumulation up to the global batch, DDP or FSDP2 under ``torchrun``. The data order depends only
on the data seed and data config (``mhar.data.batches.BatchOrder``), so variants with one seed are paired.

Continued-pretraining options (``train.init_from``, ``decay_filter``, ``z_loss``, ``ema_decay``,
``log_batch_hash``; helpers in ``mhar.training.optim``) start from an exported model with a fresh
AdamW, decay only matrix weights, add the z-loss to the objective (the logged loss stays the
cross-entropy), keep an EMA of the weights (``model.pt`` = EMA, ``model_raw.pt`` = last iterate)
and log a sha256 of every step's batch. Their defaults leave from-scratch training unchanged.

The run folder (lock, status, records, metrics log, checkpoints, model export) is
:class:`mhar.runs.run_dir.RunFolder`; this module is the loop. A non-finite loss,
validation loss or weight stops the run with :class:`TrainingDiverged`, records it in
``diverged.json`` and leaves the last good checkpoint in place.
"""
from __future__ import annotations

import math
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn

from mhar.data.batches import TrainData, load_data
from mhar.env import use_compile_cache
from mhar.model.config import ConfigError
from mhar.model.residuals import display_record
from mhar.model.routing import check_kernel_env, routing_info
from mhar.model.transformer import Transformer
from mhar.runs.config import RunConfig, identity_hash, pairing_hash, run_identity
from mhar.runs.provenance import collect_provenance, utc_now
from mhar.runs.run_dir import STATE_FORMAT, MetricsLog, Progress, RunDirError, RunFolder, set_rng_state
from mhar.training.distributed import (DistEnv, all_reduce_mean, barrier, cuda_missing, full_model_state, full_state,
                                       gather_batches, init_distributed, load_full_state, no_grad_sync, shutdown,
                                       wrap_model)
from mhar.training.optim import EMA, batch_digest, load_init_weights, lr_at, param_groups
from mhar.training.preemption import Preempted, StopSignals
from mhar.training.progress import Progressbar, Startup
from mhar.training.step import StepPlan, Throughput, TrainStep, build_optimizer, flops_per_token, peak_flops, plan_step
from mhar.training.tracking import Tracker, TrackingError, check_trackers, log_routing, open_trackers, read_record
from mhar.training.validation import evaluate, routing_weights, weights_finite

__all__ = ["train", "TrainingDiverged", "RunDirError", "STATE_FORMAT"]


class TrainingDiverged(RuntimeError):
    """Loss, gradient norm, validation loss or weights became NaN/inf."""


def _peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def _log(env: DistEnv) -> Callable[[str], None]:
    return (lambda msg: print(f"[mhar.train] {msg}", flush=True)) if env.is_main else (lambda msg: None)


def _warn(env: DistEnv) -> Callable[[str], None]:
    return (lambda msg: print(msg, file=sys.stderr, flush=True)) if env.is_main else (lambda msg: None)


# --- entry ----------------------------------------------------------------------------------------
def train(cfg: RunConfig, out_dir: str | os.PathLike, *, stop_after: Optional[int] = None,
          started: Optional[float] = None) -> Optional[dict]:
    """Train (or resume, or skip if finished) the run in ``out_dir``; returns the summary dict.

    ``stop_after=k`` checkpoints after step k and returns None (as if the job were killed there).
    SIGTERM, SIGUSR1 and SIGINT finish the current step, checkpoint it and raise
    :class:`mhar.training.preemption.Preempted` (the CLI, :mod:`mhar.training.cli`: one line, exit code
    ``EXIT_PREEMPTED``). ``started``: the wall time the startup report counts from (default: now; the CLI: its import).
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
    folder = RunFolder(out_dir, writer=env.is_main)
    try:
        if env.is_main:  # before any data is loaded: an unusable --out fails in a second
            folder.acquire()
        with StopSignals() as stop:
            return _train(cfg, folder, env, stop_after, {"started": started, "compile_cache": cache, "stop": stop})
    finally:
        folder.release()
        shutdown(env)


@dataclass
class _Run:
    """What the loop works with: the config, the folder, the data, the model and its optimizer, the counters."""

    cfg: RunConfig
    env: DistEnv
    folder: RunFolder
    data: TrainData
    model: nn.Module  # as wrapped for DDP / FSDP2
    raw: Transformer  # the unwrapped model
    opt: torch.optim.Optimizer
    plan: StepPlan
    routing: dict
    log: Callable[[str], None]
    prog: Progress = field(default_factory=Progress)
    ema: Optional[EMA] = None
    step_fn: Optional[TrainStep] = None
    metrics: Optional[MetricsLog] = None
    speed: Optional[Throughput] = None
    startup: Optional[Startup] = None
    wall: Callable[[], float] = time.time  # the run's wall time so far (all segments)
    tracker: Tracker = field(default_factory=Tracker)  # experiment trackers (rank 0; none: a no-op)


def _train(cfg: RunConfig, folder: RunFolder, env: DistEnv, stop_after: Optional[int], boot: dict) -> Optional[dict]:
    log = _log(env)
    status = folder.status(cfg)
    if status == "done":
        log(f"{folder.path} already holds the finished run of this config; nothing to do")
        return folder.read_summary()
    if env.is_main and cfg.train.tracking:
        read_record(folder.path)  # a damaged tracking.json is refused before anything is loaded
    blob = folder.load_state(cfg, _warn(env)) if status == "resume" else None
    _check_accumulation(cfg, env)
    run = _build(cfg, folder, env, _load_data(cfg, env, log), log)
    if blob is not None:
        _restore(run, blob)
    _finish_setup(run, blob)
    prov = _provenance(run, blob)
    folder.start(cfg, prov, run.prog.step if blob is not None else None)
    if env.is_main:
        run.tracker = open_trackers(cfg, folder.path, cfg.train.tracking, warn=_warn(env),
                                    resume_step=run.prog.step if blob is not None else None, provenance=prov)
        if run.tracker.must_stop:  # train.tracking_required and a tracker could not be opened: nothing trained yet
            run.tracker.close()
            raise run.tracker.error()
    try:
        run.metrics = folder.open_metrics(blob)
        try:
            if not _loop(run, stop_after, boot):
                return None
        finally:
            run.metrics.close()
        return _finish(run)
    finally:  # finished, stopped on a signal, diverged or failed: what was tracked so far is flushed
        run.tracker.close()


def _check_accumulation(cfg: RunConfig, env: DistEnv) -> None:
    t = cfg.train
    if (t.global_batch // (t.micro_batch * env.world_size)) * t.micro_batch * env.world_size != t.global_batch:
        raise ConfigError(f"train.global_batch={t.global_batch} is not divisible by micro_batch*world_size="
                          f"{t.micro_batch}*{env.world_size}")


def _load_data(cfg: RunConfig, env: DistEnv, log: Callable[[str], None]) -> TrainData:
    """Rank 0 tokenizes (once, cached), the others then read the cache."""
    args = (cfg.data, cfg.model.vocab_size, cfg.train.global_batch, cfg.data_seed, log)
    data = load_data(*args) if env.is_main else None
    barrier(env)
    return data if env.is_main else load_data(*args)


def _build(cfg: RunConfig, folder: RunFolder, env: DistEnv, data: TrainData, log: Callable[[str], None]) -> _Run:
    """The model (seeded), its wrapper, step plan and optimizer."""
    t = cfg.train
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
    return _Run(cfg, env, folder, data, model, raw, opt, plan, routing, log)


def _restore(run: _Run, blob: dict) -> None:
    """Model, optimizer, RNG and counters from a training state."""
    load_full_state(run.model, run.raw, run.opt, run.env, blob["model"], blob["optimizer"])
    set_rng_state(blob["rng"])
    run.prog = Progress(**blob["progress"])
    run.log(f"resuming {run.folder.path} from step {run.prog.step}")


def _finish_setup(run: _Run, blob: Optional[dict]) -> None:
    """The EMA of the weights (if asked for) and the step function, after the weights are final."""
    t, env, model = run.cfg.train, run.env, run.model
    run.ema = EMA(model, t.ema_decay) if t.ema_decay > 0 else None
    if run.ema is not None and blob is not None:
        run.ema.load_state_dict(blob["ema"])
    run.step_fn = TrainStep(model, run.raw, run.opt, run.plan, device=env.device, dtype=t.dtype, grad_clip=t.grad_clip,
                            z_weight=t.z_loss, grad_sync=lambda i, n: no_grad_sync(model, env, skip=i < n - 1),
                            reduce_mean=lambda v: all_reduce_mean(v, env))


def _provenance(run: _Run, blob: Optional[dict]) -> dict:
    cfg, env = run.cfg, run.env
    if not env.is_main:
        return {}
    prov = collect_provenance(cfg.to_dict())
    prov.update(identity=identity_hash(cfg), pairing=pairing_hash(cfg), run=run_identity(cfg),
                start_time=utc_now(), end_time=None,
                world_size=env.world_size, parallel=env.parallel, device=str(env.device), routing=run.routing,
                resumed_from_step=run.prog.step if blob is not None else None)
    return prov


# --- the loop -------------------------------------------------------------------------------------
def _loop(run: _Run, stop_after: Optional[int], boot: dict) -> bool:
    """Train to the last step (True) or stop after ``stop_after`` with a checkpoint (False)."""
    t, prog, stop = run.cfg.train, run.prog, boot["stop"]
    bar = _start_segment(run, boot)
    try:
        signum = stop.requested(run.env)  # a signal while the data and model were loaded: nothing new to save
        if signum:
            raise Preempted(prog.step, signum)
        while prog.step < t.steps:
            row = _train_step(run)
            bar.update(prog.step, row, run.speed.recent_tokens_per_s())
            final = prog.step == t.steps
            if prog.step % t.eval_every == 0 or final:
                _validate(run, final)
            stopping = stop_after is not None and prog.step >= stop_after and not final
            # SIGTERM/SIGUSR1/SIGINT, or a failed tracker under train.tracking_required: checkpoint, then stop
            signum, untracked = stop.agreed(run.env, run.tracker.must_stop)
            signum = 0 if final else signum
            if prog.step % t.checkpoint_every == 0 or final or stopping or signum or untracked:
                _checkpoint(run, final)
            if signum:
                raise Preempted(prog.step, signum)
            if untracked:
                raise _tracking_stopped(run)
            if stopping:
                run.log(f"stopped after step {prog.step} (--stop-after); resume by running the same command again")
                return False
    finally:
        bar.close()
    return True


def _tracking_stopped(run: _Run) -> TrackingError:
    """The error of a run stopped by a failed tracker under train.tracking_required (rank 0 holds the trackers)."""
    if run.tracker.must_stop:
        return run.tracker.error()
    return TrackingError(f"stopped at step {run.prog.step}: a tracker failed on rank 0 (train.tracking_required)")


def _start_segment(run: _Run, boot: dict) -> Progressbar:
    """Announce the run, start the clocks (wall time continues the checkpoint's), return the progress bar."""
    cfg, env, t = run.cfg, run.env, run.cfg.train
    tokens_per_step = t.global_batch * cfg.data.seq_len
    run.speed = Throughput(tokens_per_step, flops_per_token(run.raw, cfg.data.seq_len), peak_flops(env.device),
                           env.world_size)
    bar = Progressbar(t.steps, run.prog.step, t.log_every, env.is_main, run.log)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    _announce(run, tokens_per_step)
    seg_start, wall0 = time.time(), run.prog.wall_s
    run.wall = lambda: wall0 + time.time() - seg_start
    run.startup = Startup(boot["started"], run.speed.skip, boot["compile_cache"], run.log)
    run.model.train()
    return bar


def _train_step(run: _Run) -> dict:
    """One optimizer step on the step's global batch; returns (and logs) its metrics row."""
    cfg, env, prog, t = run.cfg, run.env, run.prog, run.cfg.train
    t_step = time.perf_counter()
    lr = lr_at(prog.step, cfg)
    batches = list(run.data.micro_batches(prog.step, env.rank, env.world_size, t.micro_batch))
    res = run.step_fn(batches, lr)
    if not res.finite:  # the step left weights and optimizer state untouched
        raise _diverged(run, "loss/grad norm", step=prog.step + 1, loss=res.loss, grad_norm=res.grad_norm)
    if run.ema is not None:
        run.ema.update()
    step_s = time.perf_counter() - t_step
    run.startup.step_done()
    prog.step += 1
    prog.tokens += run.speed.tokens
    prog.flops += run.speed.fpt * run.speed.tokens
    prog.train_s += step_s
    prog.wall_s = run.wall()
    row = {"split": "train", "step": prog.step, "loss": res.loss, "lr": lr, "grad_norm": res.grad_norm,
           "tokens": prog.tokens, "wall_s": round(prog.wall_s, 3), "flops": prog.flops, **run.speed.add(step_s)}
    if t.log_batch_hash:
        row["batch_sha256"] = batch_digest(gather_batches(batches, env))  # the global batch
    run.metrics.write(row)
    run.tracker.log(prog.step, {f"train/{k}": v for k, v in row.items() if k != "step"})
    return row


def _announce(run: _Run, tokens_per_step: int) -> None:
    cfg, env, t, r = run.cfg, run.env, run.cfg.train, run.routing
    accum = t.global_batch // (t.micro_batch * env.world_size)
    run.log(f"{cfg.variant}/{cfg.size}/seed{t.seed}: {run.raw.num_params():,} params, {t.steps} steps x "
            f"{tokens_per_step:,} tokens, accum {accum}, world {env.world_size}, device {env.device}; "
            f"step: {run.plan.describe()}"
            + (f"; routing {r['impl']} -> {r['resolved']}{' (PDL)' if r['pdl'] else ''}" if r["resolved"] else ""))


def _validate(run: _Run, final: bool) -> None:
    """Evaluate and log; a non-finite loss (or, at the end, non-finite weights) stops the run as diverged."""
    prog = run.prog
    val = evaluate(run.model, run.data, run.cfg, run.env)
    if not (math.isfinite(val) and (not final or weights_finite(run.model, run.env))):
        raise _diverged(run, "validation loss/weights", step=prog.step, val_loss=val)
    prog.val_losses.append([prog.step, val])
    prog.wall_s = run.wall()
    run.metrics.write({"split": "val", "step": prog.step, "val_loss": val, "tokens": prog.tokens,
                       "wall_s": round(prog.wall_s, 3), "flops": prog.flops})
    run.tracker.log(prog.step, {"val/loss": val, "train/peak_mem_gb": _peak_mem_gb(run.env.device)})
    if run.cfg.train.tracking:  # every rank: a forward pass under FSDP is collective
        log_routing(run.tracker, prog.step, routing_weights(run.model, run.data, run.cfg, run.env))
    run.log(f"step {prog.step} val_loss {val:.4f}")


def _checkpoint(run: _Run, final: bool) -> None:
    """A training state (and, if asked, an export of the weights so far); every rank takes part."""
    run.prog.last_ckpt_step = run.prog.step
    log_bytes = run.metrics.content()
    model_sd, opt_sd = full_state(run.model, run.raw, run.opt, run.env)
    ema_sd = run.ema.state_dict() if run.ema is not None else None  # collective under FSDP
    state = {"model": model_sd, "optimizer": opt_sd, "metrics_bytes": len(log_bytes or b""), "metrics_log": log_bytes,
             "data": {"seed": run.cfg.data_seed, "samples_seen": run.prog.step * run.cfg.train.global_batch},
             **({"ema": ema_sd} if ema_sd is not None else {})}
    run.folder.save_state(run.cfg, run.prog, state)
    barrier(run.env)
    if run.cfg.train.save_model_every_checkpoint and not final:
        _export(run, run.folder.checkpoint_dir / "model.pt", {"step": run.prog.step})


def _export(run: _Run, path: Path, extra: dict) -> None:
    sd = full_model_state(run.model, run.env)  # collective under FSDP2
    if run.env.is_main:
        model = run.raw
        if sd is not None:
            model = Transformer(run.cfg.model)
            model.load_state_dict(sd)
        run.folder.export_model(path, model, run.cfg.data.tokenizer, extra)
    barrier(run.env)


def _diverged(run: _Run, what: str, step: int, **values) -> TrainingDiverged:
    """The exception to raise for a non-finite ``what``, after recording it in ``diverged.json``."""
    return TrainingDiverged(run.folder.record_diverged(what, step, run.prog.last_ckpt_step, **values))


# --- the end --------------------------------------------------------------------------------------
def _finish(run: _Run) -> dict:
    """Export the model (EMA weights as model.pt when kept), write summary.json, end the provenance."""
    cfg, t, prog = run.cfg, run.cfg.train, run.prog
    summary = _summary(run)
    extra = {"step": prog.step, "variant": cfg.variant, "size": cfg.size, "seed": t.seed, "run": run_identity(cfg),
             "display": summary["display"]}  # evaluations copy it: every table names the variant alike
    if run.ema is None:
        _export(run, run.folder.model, extra)
    else:  # model.pt holds the EMA weights (what gets evaluated), model_raw.pt the last iterate
        _export(run, run.folder.path / "model_raw.pt", {**extra, "weights": "raw"})
        with run.ema.applied():
            summary["final_val_loss_ema"] = evaluate(run.model, run.data, cfg, run.env)
            _export(run, run.folder.model, {**extra, "weights": f"ema{t.ema_decay}"})
    run.tracker.log(prog.step, {f"summary/{k}": v for k, v in summary.items()})
    run.tracker.close()
    if run.tracker.must_stop:  # the last step's checkpoint is kept: the same command finishes the run
        raise run.tracker.error()
    if t.tracking:
        summary["tracking"] = run.tracker.report()  # the trackers asked for, and any that failed
    run.folder.finish(summary)
    run.log(f"done: tail-mean val loss {summary['tail_mean_val_loss']:.4f} over the last "
            f"{len(summary['val_losses'][-t.tail_k:])} evals -> {run.folder.path}")
    return summary


def _summary(run: _Run) -> dict:
    cfg, t, prog = run.cfg, run.cfg.train, run.prog
    tail = [v for _, v in prog.val_losses[-t.tail_k:]]
    return {
        "variant": cfg.variant, "size": cfg.size, "seed": t.seed, "identity": identity_hash(cfg),
        "steps": prog.step, "tokens": prog.tokens,
        "tail_mean_val_loss": float(np.mean(tail)) if tail else None, "tail_k": t.tail_k,
        "final_val_loss": prog.val_losses[-1][1] if prog.val_losses else None,
        "val_losses": prog.val_losses, "wall_s": round(prog.wall_s, 3), "flops": prog.flops,
        "params": run.raw.num_params(), "tokens_per_s": prog.tokens / max(prog.train_s, 1e-9),
        "peak_mem_gb": round(_peak_mem_gb(run.env.device), 3), "run": run_identity(cfg),
        "display": display_record(cfg.model.residual.variant),  # how tables show it: its Residual class attributes
        **run.speed.summary(run.plan), "startup": run.startup.record,
    }
