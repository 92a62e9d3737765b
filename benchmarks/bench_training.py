"""Training throughput and peak memory of the step users run: baseline vs MHAR per routing implementation.

Each row times ``mhar.training.step.TrainStep``, the training step of ``python -m mhar.train`` (no copy of it here):
forward + backward + grad clipping + fused AdamW on one microbatch of the paper (8x2048 at 100M, 4x1024 at
350M, 2x1024 at 1B), bf16 autocast with fp32 master weights, the pieces that ``mhar.training.step.plan_step``
compiles, and the whole step replayed as one CUDA graph (``--graph 1``, the trainer's default on one GPU).
Each (size, variant) runs in its own process (fresh allocator statistics, no shared compile state).
Throughput is tokens/s over ``--steps`` timed steps after ``--warmup`` steps; peak memory is
torch.cuda.max_memory_allocated over the whole process (warm-up and graph capture included, as in
the trainer's summary). Ratios are against the baseline of the same size and
mode. ``--trainer-steps N`` adds, per row, a real ``python -m mhar.train`` run of the same configuration on
synthetic tokens (mode=trainer: the median step time after warm-up from its summary.json), so the trainer
and the step can be compared in one call. ``--repeats N`` runs the sequence of variants N times per size (fresh
processes each time): every MHAR row is paired with the baseline of its own repeat (column ``repeat``), and a
``SUMMARY`` line per variant gives the mean same-run ratio over repeats with its 95% t interval. An existing
``--out`` is never overwritten: pass ``--append`` to add the rows to it.

Variants (``VARIANTS``): ``baseline`` and ``mhar_<impl>`` for each routing implementation of
``mhar.model.config.ROUTING_IMPLS`` (``mhar_auto``: what a user's default config runs), plus ``mhar_fused_nopdl`` (the
fused kernels without programmatic dependent launch: MHAR_ROUTING_PDL=0 in its process; every other variant runs
with the variable unset, the library's default). A row records its process's settings in ``routing_env``.

    PYTHONPATH=. python -m benchmarks.bench_training --sizes 100M 350M 1B \
        --variants baseline mhar_fused --heads 8 --repeats 3 --out results/bench/training.csv --append
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from analysis.stats import sample_t_interval
from benchmarks.common import (NO_PDL, add_out_args, apply_settings, env_columns, existing_rows, microbatch,
                               kernel_settings, routing_env_cell, write_csv)
from mhar.model.config import ROUTING_IMPLS, model_config
from mhar.model.routing import routing_info
from mhar.model.transformer import build_model
from mhar.safe_yaml import dump_yaml
from mhar.training.optim import param_groups
from mhar.training.step import GRAPH_WARMUP, TrainStep, build_optimizer, plan_step
# residual config of each benchmark variant (routing_impl picks the Router: mhar/model/routing): derived from the registry
VARIANTS = {"baseline": {"variant": "baseline"},
            **{f"mhar_{impl}": {"variant": "mhar", "routing_impl": impl} for impl in ROUTING_IMPLS},
            "mhar_fused" + NO_PDL: {"variant": "mhar", "routing_impl": "fused"}}


# the routing kernel settings of each variant's processes (``common.kernel_settings``: MHAR_ROUTING_PDL=0 for
# ``_nopdl``, unset otherwise), applied over the caller's environment
VARIANT_ENV = {name: kernel_settings(name)[1] for name in VARIANTS}


def variant_env(variant: str) -> dict:
    """The environment of the process that runs ``variant`` (the caller's, with VARIANT_ENV's settings)."""
    return apply_settings(os.environ, VARIANT_ENV.get(variant, {}))


def residual_for(variant: str, heads: int) -> dict:
    res = dict(VARIANTS[variant])
    if res["variant"] != "baseline":
        res["heads"] = heads
    return res


def build_step(size: str, variant: str, heads: int, device: str, compile: bool = True, graph: bool = False):
    """The library's training step (``mhar.training.step.TrainStep``, what ``python -m mhar.train`` runs) for one
    configuration, and host batches of the paper's microbatch: ``(step, batches, model)``."""
    torch.manual_seed(0)
    cfg = model_config(size, residual=residual_for(variant, heads))
    B, T = microbatch(size)
    dev = torch.device(device)
    model = build_model(cfg).to(dev)
    plan = plan_step(model, dev, compile=compile, cuda_graph=bool(graph) and device == "cuda")
    opt = build_optimizer(model, param_groups(model, 0.1), 5e-4, (0.9, 0.95), 1e-8, plan, dev)
    step = TrainStep(model, model, opt, plan, device=dev, dtype="bf16" if device == "cuda" else "fp32",
                     grad_clip=1.0)
    gen = torch.Generator().manual_seed(0)
    batches = [[(x, x.clone()) for x in [torch.randint(0, cfg.vocab_size, (B, T), generator=gen)]]
               for _ in range(4)]  # host batches, copied in by the step as the trainer's are
    return step, batches, model


def run_one(size: str, variant: str, heads: int, steps: int, warmup: int, device: str, backend: str,
            graph: bool = False) -> dict:
    """Time :func:`build_step`'s step in this process; returns a result row (no provenance).
    ``backend='none'``: no compile. Peak memory covers the whole run (warm-up and CUDA-graph capture
    included), as the trainer's summary does."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step, batches, model = build_step(size, variant, heads, device, compile=backend != "none", graph=graph)
    plan = step.plan
    B, T = microbatch(size)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    warmup = max(warmup, GRAPH_WARMUP + 1) if plan.cuda_graph else warmup  # the capture happens in warm-up
    t0 = time.perf_counter()
    for i in range(warmup):
        res = step(batches[i % len(batches)], 5e-4)
    sync()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(steps):
        res = step(batches[i % len(batches)], 5e-4)
    sync()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    routing = routing_info(model, torch.device(device))
    return dict(size=size, variant=variant, routing_resolved=routing["resolved"] or "", pdl=int(routing["pdl"]), heads=heads if variant != "baseline" else 0, B=B, T=T,
                params=model.num_params(), steps=steps, step_ms=round(1e3 * dt / steps, 2),
                tokens_per_s=round(steps * B * T / dt, 1), peak_mem_gib=round(peak, 3),
                warmup_s=round(warm_s, 1), final_loss=round(res.loss, 4), status="ok",
                step_plan=plan.describe(), cuda_graph=int(plan.cuda_graph), routing_env=routing_env_cell())


def trainer_config(size: str, variant: str, heads: int, steps: int, device: str) -> dict:
    """The run config that makes ``python -m mhar.train`` train on the benchmark's shapes (synthetic tokens)."""
    B, T = microbatch(size)
    return {
        "meta": {"name": f"bench-{size}-{variant}", "variant": variant, "size": size},
        "model": {"preset": size, "residual": residual_for(variant, heads)},
        "data": {"corpus": f"synthetic:{max(4_000_000, 2 * (steps + 2) * B * T)}", "seq_len": T,
                 "val_tokens": B * T, "cache_dir": "results/cache/bench_shards"},
        "train": {"steps": steps, "global_batch": B, "micro_batch": B, "lr": 5e-4, "warmup_steps": 10,
                  "eval_every": steps, "tail_k": 1, "checkpoint_every": steps, "log_every": 10,
                  "device": device, "dtype": "bf16" if device == "cuda" else "fp32"},
    }


def run_trainer(size: str, variant: str, heads: int, steps: int, device: str, workdir: Path, timeout: float) -> dict:
    """Train ``steps`` steps with ``python -m mhar.train`` itself and read its steady tok/s from summary.json."""
    run_dir = workdir / f"{size}-{variant}"
    shutil.rmtree(run_dir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / f"{size}-{variant}.yaml"
    cfg_path.write_text(dump_yaml(trainer_config(size, variant, heads, steps, device)))
    cmd = [sys.executable, "-m", "mhar.train", str(cfg_path), "--out", str(run_dir)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=variant_env(variant))
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["no output"])[-1]
        print(p.stderr[-3000:], file=sys.stderr)
        return dict(status="OOM" if "OutOfMemory" in p.stderr else f"error: {err[:200]}")
    s = json.loads((run_dir / "summary.json").read_text())
    prov = json.loads((run_dir / "provenance.json").read_text()) if (run_dir / "provenance.json").exists() else {}
    B, T = microbatch(size)
    return dict(heads=heads if variant != "baseline" else 0, B=B, T=T, params=s["params"],
                steps=s.get("steady_steps"), step_ms=s.get("step_ms"), tokens_per_s=s.get("steady_tokens_per_s"),
                peak_mem_gib=s.get("peak_mem_gb"), final_loss=s.get("final_val_loss"), status="ok",
                step_plan=s.get("step_plan"), mfu=s.get("mfu"),
                routing_resolved=(prov.get("routing") or {}).get("resolved") or "",
                pdl=int(bool((prov.get("routing") or {}).get("pdl"))),
                routing_env=routing_env_cell(prov.get("routing_env") or {}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["100M", "350M", "1B"])
    ap.add_argument("--variants", nargs="+", default=["baseline", "mhar_compile", "mhar_fused"],
                    choices=list(VARIANTS))
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per (size, variant) process")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend, or 'none'")
    ap.add_argument("--graph", type=int, choices=(0, 1), default=1,
                    help="1: time whole-step CUDA graph replays (every variant, baseline included); 0: eager steps")
    ap.add_argument("--trainer-steps", type=int, default=0,
                    help="> 0: after each benchmark row, train that many steps of the same configuration with "
                         "`python -m mhar.train` (synthetic tokens) and add a row (mode=trainer) with its steady tok/s")
    ap.add_argument("--trainer-only", action="store_true",
                    help="with --trainer-steps: only the trainer rows (no benchmark rows)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the whole sequence of variants this many times per size (each in fresh processes); "
                         "each MHAR row is paired with the baseline of its own repeat, and a summary gives the mean "
                         "ratio over repeats with its 95%% t interval")
    add_out_args(ap, "results/bench/training.csv")
    ap.add_argument("--runs-dir", default="results/cache/bench_runs",
                    help="folder of the --trainer-steps runs (each run's folder is replaced by the next one)")
    ap.add_argument("--one", nargs=2, metavar=("SIZE", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        row = run_one(args.one[0], args.one[1], args.heads, args.steps, args.warmup, args.device, args.backend,
                      graph=bool(args.graph))
        print("RESULT " + json.dumps(row), flush=True)
        return
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: must be >= 1")
    keep = existing_rows(args.out, args.append)  # before any run: an existing record is never overwritten
    env = env_columns("benchmarks.bench_training", argv)
    rows = []
    keys = ["size", "variant", "mode", "repeat", "heads", "B", "T", "params", "steps", "step_ms", "tokens_per_s",
            "peak_mem_gib", "thr_ratio", "mem_ratio", "mfu", "step_plan", "cuda_graph", "routing_resolved", "pdl",
            "routing_env", "warmup_s",
            "final_loss", "status", "wall_s"]

    def add(row: dict) -> None:
        base = next((r for r in rows if r["size"] == row["size"] and r["variant"] == "baseline"
                     and r["mode"] == row["mode"] and r.get("repeat") == row.get("repeat")
                     and r.get("status") == "ok"), None)  # the baseline of the same repeat (same run)
        if base and row.get("status") == "ok":
            row["thr_ratio"] = round(row["tokens_per_s"] / base["tokens_per_s"], 4)
            row["mem_ratio"] = round(row["peak_mem_gib"] / base["peak_mem_gib"], 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_csv(args.out, [{**{k: r.get(k) for k in keys}, **env} for r in rows], keep)

    def add_trainer_row(size: str, variant: str, rep: int) -> None:
        t0 = time.time()
        try:
            row = run_trainer(size, variant, args.heads, args.trainer_steps, args.device,
                              Path(args.runs_dir), args.timeout)
        except subprocess.TimeoutExpired:
            row = dict(status=f"timeout after {args.timeout:.0f}s")
        row.update(size=size, variant=variant, mode="trainer", repeat=rep, wall_s=round(time.time() - t0, 1))
        add(row)

    for size, rep, variant in ((s, r, v) for s in args.sizes for r in range(args.repeats) for v in args.variants):
        if args.trainer_only and args.trainer_steps > 0:
            add_trainer_row(size, variant, rep)
            continue
        cmd = [sys.executable, "-m", "benchmarks.bench_training", "--one", size, variant,
               "--heads", str(args.heads), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--device", args.device, "--backend", args.backend, "--graph", str(args.graph)]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=variant_env(variant))
            lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if lines:
                row = json.loads(lines[-1][7:])
            else:
                err = (p.stderr.strip().splitlines() or ["no output"])[-1]
                row = dict(size=size, variant=variant, status="OOM" if "OutOfMemory" in p.stderr
                           else f"error: {err[:200]}")
                print(p.stderr[-3000:], file=sys.stderr)
        except subprocess.TimeoutExpired:
            row = dict(size=size, variant=variant, status=f"timeout after {args.timeout:.0f}s")
        row.update(mode="step", repeat=rep, wall_s=round(time.time() - t0, 1))
        add(row)
        if args.trainer_steps > 0:
            add_trainer_row(size, variant, rep)
    for line in repeat_summary(rows):
        print(line, flush=True)


def repeat_summary(rows: list[dict]) -> list[str]:
    """One ``SUMMARY {json}`` line per (size, mode, MHAR variant) with at least one paired ratio: the same-run
    throughput / memory ratios of its repeats, their mean, sample sd and 95% t interval (scipy; none for one
    repeat). The repeat (a fresh pair of processes) is the unit: steps within a run are not independent."""

    out = []
    groups: dict = {}
    for r in rows:
        if r.get("thr_ratio") is not None and r.get("status") == "ok":
            groups.setdefault((r["size"], r["mode"], r["variant"]), []).append(r)
    for (size, mode, variant), rs in groups.items():
        x = np.array([float(r["thr_ratio"]) for r in rs])
        n, mean = len(x), float(x.mean())
        s = {"size": size, "mode": mode, "variant": variant, "repeats": n, "thr_ratios": x.tolist(),
             "thr_ratio_mean": round(mean, 4), "mem_ratio_max": max(float(r["mem_ratio"]) for r in rs)}
        if n > 1:
            _, sd, lo, hi = sample_t_interval(x)
            s.update(thr_ratio_sd=round(sd, 4), thr_ratio_ci95=[round(lo, 4), round(hi, 4)])
        out.append("SUMMARY " + json.dumps(s))
    return out


if __name__ == "__main__":
    main()
