"""Multi-GPU check (issue 19): DDP and FSDP2 equal one GPU, exact resume across a kill, scaling.

Every run goes through the real trainer (``python -m mhar.train``; under ``torch.distributed.run``
for more than one process) on the synthetic token stream of ``config/train/gpu_smoke.yaml``
(paper 100M shapes, seq 2048, bf16 autocast; no files, no hub). Stages:

* ``equal``: global batch G = nproc x micro for ``--steps`` steps, routed variant (``--variant``,
  default MHAR fused routing): one process with gradient accumulation (``one``), the same with half
  the micro-batch (``one_half``: the same mathematics summed in another order, i.e. the bf16 noise
  floor), DDP and FSDP2 on ``--nproc`` processes. Reports max |delta loss| of each against ``one``
  (pass: at most max(``--noise-factor`` x the noise floor, 1e-3)), the val-loss deltas and whether the logged batch hashes (``train.log_batch_hash``: the step's
  global batch) equal ``one``'s.
* ``resume``: DDP and FSDP2 on ``--nproc`` processes checkpointing every steps/2; the launcher's
  and its workers are SIGKILLed ``--kill-delay`` s after the first checkpoint appears (mid-way
  to the next), then the same command resumes. Pass: the metrics (losses, grad norms, batch hashes, val losses) equal the
  uninterrupted run of ``equal`` bit for bit (the max |delta| is reported when they do not).
* ``throughput``: tokens/s per GPU (median over steps after ``--warmup``) of ``--tp-variants`` at
  ``--sizes`` on 1 process and on ``--nproc`` processes (DDP and FSDP2), the per-GPU batch fixed
  (weak scaling), and the scaling efficiency = per-GPU tok/s on nproc / per-GPU tok/s on 1.
* ``workflow``: ``snakemake TARGET --resources nvidia_gpu=N --configfile config/gpu_small.yaml
  config/gpus2.yaml OVERLAY`` on one train job (OVERLAY: ``resources.gpus_per_run: N``, ``--steps``,
  a scratch results_dir):
  the target from the dry run, the torchrun command in the job's log, ``world_size`` in the run's
  provenance.

Writes ``$OUT/multigpu_check.json`` (results, pass flags, versions, the exact commands),
``equal_losses.csv``, ``throughput.csv`` and ``logs/``; run directories go to ``--scratch`` and lose
their model.pt and checkpoint (GBs) after each run. Exit code 1 if a check failed, 2 on bad input.

    python benchmarks/multigpu_check.py --out $OUT/equal_resume --stages equal resume      # ~6-8 min, 2 GPUs
    python benchmarks/multigpu_check.py --out $OUT/tp_100M --stages throughput --sizes 100M  # ~4 min
    python benchmarks/multigpu_check.py --out $OUT/tp_1B --stages throughput --sizes 1B      # ~8 min
    python benchmarks/multigpu_check.py --out $OUT/workflow --stages workflow --wf-corpus synthetic:5000000
    # CPU rehearsal (gloo, 2 processes; key=value overrides first: options with several values take
    # what follows them):
    python benchmarks/multigpu_check.py model.preset=debug data.corpus=synthetic:100000 data.seq_len=64 \
        data.val_tokens=512 train.threads=1 --out /tmp/mg --device cpu --dtype fp32 --steps 60 --micro 2 \
        --variant mhar_eager --stages equal resume
"""
from __future__ import annotations

import statistics
import argparse
import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mhar.model.presets import PRESETS  # noqa: E402  (stdlib only; the path above makes it importable)
from mhar.safe_yaml import read_yaml_file  # noqa: E402  (yaml only)

# NVLink multicast (NVLS) stays off on the lent machines; exported to every child process.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
VARIANTS = {  # name -> model.residual overrides
    "baseline": ["model.residual.variant=baseline"],
    "mhar_fused": ["model.residual.variant=mhar", "model.residual.heads=8", "model.residual.routing_impl=fused"],
    "mhar_eager": ["model.residual.variant=mhar", "model.residual.heads=8", "model.residual.routing_impl=eager"],
}
# The throughput stage's per-GPU micro-batch (sequences) of a paper size is its benchmark micro-batch
# (mhar.model.presets ``micro_batch``), except here: the 1B training step fits twice as many on one H200 in bf16.
THROUGHPUT_MICRO = {"1B": 4}
STAGES = ("equal", "resume", "throughput", "workflow")


class CheckError(RuntimeError):
    """Bad input or a run that did not produce its files."""


def _env() -> dict:
    env = dict(os.environ, **NO_MULTICAST, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return env


def _shell(cmd: list[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in NO_MULTICAST.items()) + " PYTHONPATH=. " + shlex.join(cmd)


class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, Path(args.out)
        self.scratch = Path(args.scratch or tempfile.mkdtemp(prefix="mhar_multigpu_"))
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.commands: list[str] = []

    def train_cmd(self, nproc: int, overrides: list[str], run: Path) -> list[str]:
        launch = [sys.executable]
        if nproc > 1:
            launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        a = self.args
        base = [f"train.device={a.device}", f"data.cache_dir={self.scratch / 'cache'}", "train.log_every=10"]
        if a.dtype:
            base.append(f"train.dtype={a.dtype}")
        return [*launch, "-m", "mhar.train", a.config, *base, *overrides, *a.overrides, "--out", str(run)]

    def train(self, name: str, nproc: int, overrides: list[str], kill: bool = False) -> Path:
        """Train into scratch/name (fresh); returns the kept records' directory. ``kill``: SIGKILL the
        launcher and its workers after the first checkpoint, then run the same command again."""
        run = self.scratch / name
        shutil.rmtree(run, ignore_errors=True)
        cmd = self.train_cmd(nproc, overrides, run)
        log = self.logs / f"{name}.log"
        self.commands.append(_shell(cmd))
        print(f"[multigpu_check] {name}: {_shell(cmd)}", flush=True)
        with open(log, "w") as f:
            f.write(f"$ {_shell(cmd)}\n")
            f.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            if kill:
                killed = self._kill_after_checkpoint(proc, run / "checkpoint")
                if not killed or (run / "summary.json").is_file():
                    raise CheckError(f"{name}: the run ended before the kill (see {log}); give it more --steps "
                                     "or a shorter --kill-delay")
                f.write(f"\n[multigpu_check] SIGKILL to the launcher and its workers {self.args.kill_delay} s after the "
                        f"first checkpoint; resuming with the same command\n$ {_shell(cmd)}\n")
                f.flush()
                self.commands.append(f"# SIGKILLed {self.args.kill_delay} s after the first checkpoint, then "
                                     f"again: {_shell(cmd)}")
                proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            rc = proc.wait(timeout=self.args.run_timeout)
        if rc != 0 or not (run / "summary.json").is_file():
            tail = "\n".join(log.read_text().splitlines()[-25:])
            raise CheckError(f"{name}: exit code {rc}, no summary.json (log {log}):\n{tail}")
        keep = self.out / "runs" / name
        keep.mkdir(parents=True, exist_ok=True)
        for f in ("summary.json", "metrics.jsonl", "provenance.json", "config.yaml"):
            shutil.copy(run / f, keep / f)
        for big in ("model.pt", "model_raw.pt", "checkpoint"):
            p = run / big
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        return keep

    def _kill_after_checkpoint(self, proc: subprocess.Popen, ckpt_dir: Path) -> bool:
        """SIGKILL the launcher and its workers ``--kill-delay`` s after the first training checkpoint
        appears (metrics are flushed only at checkpoints, so the checkpoint file is the signal);
        False if the process ended first."""
        while proc.poll() is None:
            if any(ckpt_dir.glob("state-*.pt.sha256")):  # a complete checkpoint (mhar.runs.run_dir.RunFolder.save_state)
                time.sleep(self.args.kill_delay)
                if proc.poll() is not None:
                    return False
                for pid in [proc.pid, *_descendants(proc.pid)]:  # torchrun's workers have their own sessions
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                proc.wait()
                return True
            time.sleep(0.01)
        return False


def _descendants(pid: int) -> list[int]:
    """Process ids of all descendants of ``pid`` (Linux /proc), children first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _rows(metrics: Path) -> list[dict]:
    rows = []
    for line in metrics.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return rows


def _train_rows(run: Path) -> list[dict]:
    return [r for r in _rows(run / "metrics.jsonl") if r["split"] == "train"]


def _val(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["val_loss"]) for r in _rows(run / "metrics.jsonl") if r["split"] == "val"]


def _settings(run: Path) -> dict | None:
    """A run's config without the checkpoint cadence (None if there is no run)."""
    if not (run / "config.yaml").is_file():
        return None
    cfg = read_yaml_file(run / "config.yaml")
    cfg.get("train", {}).pop("checkpoint_every", None)
    return cfg


def _max_delta(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        raise CheckError(f"runs logged {len(a)} and {len(b)} steps")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


# --- stages ---------------------------------------------------------------------------------------
def stage_equal(r: Runner, res: dict) -> bool:
    a, n = r.args, r.args.nproc
    micro = a.micro
    common = [f"train.steps={a.steps}", f"train.global_batch={n * micro}", "train.log_batch_hash=true",
              f"train.eval_every={max(1, a.steps // 2)}", "train.checkpoint_every=1000000",
              *VARIANTS[a.variant]]
    runs = {
        "one": r.train("equal_one", 1, [*common, f"train.micro_batch={micro}"]),
        "ddp": r.train("equal_ddp", n, [*common, f"train.micro_batch={micro}", "train.parallel=ddp"]),
        "fsdp": r.train("equal_fsdp", n, [*common, f"train.micro_batch={micro}", "train.parallel=fsdp"]),
    }
    if micro % 2 == 0:
        runs["one_half"] = r.train("equal_one_half", 1, [*common, f"train.micro_batch={micro // 2}"])
    rows = {k: _train_rows(v) for k, v in runs.items()}
    loss = {k: [x["loss"] for x in v] for k, v in rows.items()}
    floor = _max_delta(loss["one_half"], loss["one"]) if "one_half" in loss else None
    tol = max(a.noise_factor * floor, 1e-3) if floor is not None else a.abs_tol
    out = {"variant": a.variant, "global_batch": n * micro, "micro_batch": micro, "steps": a.steps,
           "noise_floor_max_abs_delta": floor, "tolerance": tol,
           "tolerance_rule": f"max(noise_factor={a.noise_factor} x noise floor, 1e-3)" if floor is not None
           else f"--abs-tol {a.abs_tol} (micro-batch odd: no noise-floor run)", "modes": {}}
    ok = True
    for mode in ("ddp", "fsdp"):
        d = _max_delta(loss[mode], loss["one"])
        dv = _max_delta([v for _, v in _val(runs[mode])], [v for _, v in _val(runs["one"])])
        same_hash = [x["batch_sha256"] for x in rows[mode]] == [x["batch_sha256"] for x in rows["one"]]
        prov = json.loads((runs[mode] / "provenance.json").read_text())
        passed = d <= tol and same_hash and prov["world_size"] == n
        ok &= passed
        out["modes"][mode] = {"max_abs_delta_loss": d, "step1_abs_delta_loss": abs(loss[mode][0] - loss["one"][0]),
                              "max_abs_delta_val_loss": dv, "batch_hashes_equal": same_hash,
                              "world_size": prov["world_size"], "pass": passed}
        print(f"[multigpu_check] equal {mode}: max|dloss| {d:.3g} (tol {tol:.3g}), val {dv:.3g}, "
              f"hashes equal {same_hash} -> {'PASS' if passed else 'FAIL'}", flush=True)
    with open(r.out / "equal_losses.csv", "w", newline="") as f:
        w = csv.writer(f)
        names = list(loss)
        w.writerow(["step", *names])
        for i, x in enumerate(rows["one"]):
            w.writerow([x["step"], *(loss[k][i] for k in names)])
    res["equal"] = out
    return ok


def stage_resume(r: Runner, res: dict) -> bool:
    a, n = r.args, r.args.nproc
    half = max(1, a.steps // 2)
    common = [f"train.steps={a.steps}", f"train.global_batch={n * a.micro}", f"train.micro_batch={a.micro}",
              "train.log_batch_hash=true", f"train.eval_every={half}", *VARIANTS[a.variant]]
    out, ok = {"checkpoint_step": half, "kill_delay_s": a.kill_delay, "modes": {}}, True
    for mode in ("ddp", "fsdp"):
        run = r.train(f"resume_{mode}", n, [*common, f"train.checkpoint_every={half}", f"train.parallel={mode}"],
                      kill=True)
        ref = r.out / "runs" / f"equal_{mode}"  # the uninterrupted run of the equal stage, if it has our settings
        if _settings(ref) != _settings(run):
            ref = r.train(f"equal_{mode}", n, [*common, "train.checkpoint_every=1000000", f"train.parallel={mode}"])
        strip = lambda rows: [{k: v for k, v in x.items() if k != "wall_s"} for x in rows]  # noqa: E731
        got, want = strip(_rows(run / "metrics.jsonl")), strip(_rows(ref / "metrics.jsonl"))
        exact = got == want
        d = _max_delta([x["loss"] for x in _train_rows(run)], [x["loss"] for x in _train_rows(ref)])
        prov = json.loads((run / "provenance.json").read_text())
        resumed_at = [x["step"] for x in prov.get("resumes", [])]
        passed = exact and resumed_at == [half]
        ok &= passed
        out["modes"][mode] = {"metrics_equal_uninterrupted": exact, "max_abs_delta_loss": d,
                              "resumed_from_steps": resumed_at, "pass": passed}
        print(f"[multigpu_check] resume {mode}: resumed from {resumed_at}, metrics equal {exact} "
              f"(max|dloss| {d:.3g}) -> {'PASS' if passed else 'FAIL'}", flush=True)
    res["resume"] = out
    return ok


def steady_tokens_per_s(metrics: Path, warmup: int) -> float:
    """Median tokens/s over train steps after ``warmup`` of a run's metrics.jsonl, skipping steps that follow an
    evaluation."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    rates, prev, after_eval = [], None, False
    for r in rows:
        if r["split"] == "val":
            after_eval = True
            continue
        if prev is not None and r["step"] > warmup and not after_eval:
            rates.append((r["tokens"] - prev["tokens"]) / max(r["wall_s"] - prev["wall_s"], 1e-9))
        prev, after_eval = r, False
    return statistics.median(rates) if rates else float("nan")


def throughput_micro(size: str, default: int) -> int:
    """Per-GPU micro-batch (sequences) of ``size`` in the throughput stage (``default``: not a paper size)."""
    if size in THROUGHPUT_MICRO:
        return THROUGHPUT_MICRO[size]
    p = PRESETS.get(size)
    return p.micro_batch[0] if p is not None and p.paper_scale and p.micro_batch else default


def stage_throughput(r: Runner, res: dict) -> bool:
    # lazy: the driver starts with the standard library only (see the import at the top)
    from benchmarks.common import env_columns

    a, n = r.args, r.args.nproc
    rows = []
    for size in a.sizes:
        micro = throughput_micro(size, a.micro)
        for variant in a.tp_variants:
            per_gpu_1 = None
            for nproc, mode in [(1, "single")] + [(n, m) for m in a.tp_parallel]:
                name = f"tp_{size}_{variant}_{mode}"
                ov = [f"model.preset={size}", f"train.steps={a.tp_steps}", f"train.global_batch={nproc * micro}",
                      f"train.micro_batch={micro}", f"train.eval_every={a.tp_steps}",
                      "train.checkpoint_every=1000000", *VARIANTS[variant]]
                if mode != "single":
                    ov.append(f"train.parallel={mode}")
                try:
                    run = r.train(name, nproc, ov)
                except CheckError as e:  # e.g. out of memory: recorded, the others still run
                    print(f"[multigpu_check] {e}", flush=True)
                    rows.append({"size": size, "variant": variant, "parallel": mode, "gpus": nproc,
                                 "status": str(e).splitlines()[0], "command": r.commands[-1]})
                    continue
                tok = steady_tokens_per_s(run / "metrics.jsonl", warmup=a.warmup)
                summ = json.loads((run / "summary.json").read_text())
                per_gpu = tok / nproc
                per_gpu_1 = per_gpu if mode == "single" else per_gpu_1
                rows.append({"size": size, "variant": variant, "parallel": mode, "gpus": nproc, "status": "ok",
                             "micro_batch": micro, "seq_len": _seq_len(run), "tokens_per_s": round(tok),
                             "tokens_per_s_per_gpu": round(per_gpu),
                             "scaling_efficiency": round(per_gpu / per_gpu_1, 4) if per_gpu_1 else None,
                             "peak_mem_gb_rank0": summ["peak_mem_gb"], "params": summ["params"],
                             "command": r.commands[-1]})
                print(f"[multigpu_check] throughput {name}: {per_gpu:,.0f} tok/s per GPU", flush=True)
    cols = {k: v for k, v in env_columns().items() if k != "command"}  # each row has its own command
    keys = sorted({k for x in rows for k in x}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(r.out / "throughput.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*keys, *cols])
        w.writeheader()
        for x in rows:
            w.writerow({**x, **cols})
    res["throughput"] = rows
    return all(x["status"] == "ok" for x in rows)


def _seq_len(run: Path) -> int:
    # lazy: the driver starts with the standard library only (see the import at the top)
    from mhar.runs.config import run_config_from_dict

    return run_config_from_dict(read_yaml_file(run / "config.yaml")).data.seq_len


def stage_workflow(r: Runner, res: dict) -> bool:
    """One train job of the workflow on nproc GPUs. The GPU count goes in through a config overlay:
    snakemake reads nested ``--config`` values as strings, which the schema refuses."""
    import yaml  # lazy: the driver starts with the standard library only (see the import at the top)

    a, n = r.args, r.args.nproc
    overlay = {"results_dir": str(r.scratch / "wf_results"),
               "resources": {"gpus_per_run": n, "threads_per_run": 2 * n},
               "train": {"train": {"steps": a.steps}}}
    if a.wf_corpus:
        overlay["train"]["data"] = {"corpus": a.wf_corpus}
    overlay_path = r.out / "workflow_overlay.yaml"
    overlay_path.write_text(yaml.safe_dump(overlay, sort_keys=False))
    opts = ["-c", str(2 * n), "--resources", f"nvidia_gpu={n}", f"gpu={n}",
            "--configfile", *a.wf_configfile, str(overlay_path)]  # last: --configfile takes several values
    dry_cmd = [sys.executable, "-m", "snakemake", "-n", "all", *opts]
    dry = subprocess.run(dry_cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    r.commands.append(_shell(dry_cmd))
    (r.logs / "workflow_dry_run.log").write_text(dry.stdout + dry.stderr)
    targets = re.findall(r"output: (\S+/summary\.json)", dry.stdout + dry.stderr)
    if dry.returncode != 0 or not targets:
        raise CheckError(f"workflow dry run failed or listed no train job (log {r.logs / 'workflow_dry_run.log'})")
    target = next((t for t in targets if "/mhar/" in t), targets[0])
    cmd = [sys.executable, "-m", "snakemake", target, *opts]
    r.commands.append(_shell(cmd))
    print(f"[multigpu_check] workflow: {_shell(cmd)}", flush=True)
    with open(r.logs / "workflow.log", "w") as f:
        rc = subprocess.call(cmd, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT, timeout=a.run_timeout)
    run = (ROOT / target).parent  # ROOT / an absolute path is that path
    job_logs = [p for p in (r.scratch / "wf_results").rglob("*.log")
                if f"--nproc_per_node={n}" in p.read_text(errors="replace")]
    prov = json.loads((run / "provenance.json").read_text()) if (run / "provenance.json").is_file() else {}
    passed = rc == 0 and bool(job_logs) and prov.get("world_size") == n
    res["workflow"] = {"target": target, "overlay": overlay, "exit_code": rc, "job_logs_with_torchrun":
                       [str(p) for p in job_logs], "world_size": prov.get("world_size"),
                       "parallel": prov.get("parallel"), "pass": passed}
    for p in job_logs[:1]:
        shutil.copy(p, r.logs / "workflow_train_job.log")
    print(f"[multigpu_check] workflow: exit {rc}, torchrun in the job log {bool(job_logs)}, "
          f"world_size {prov.get('world_size')} -> {'PASS' if passed else 'FAIL'}", flush=True)
    return passed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", required=True, help="records: multigpu_check.json, CSVs, logs/, runs/")
    p.add_argument("--stages", nargs="+", default=["equal", "resume"], choices=STAGES)
    p.add_argument("--nproc", type=int, default=2, help="processes (GPUs) of the multi-process runs")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default=None, help="train.dtype for every run (default: the config's)")
    p.add_argument("--config", default=str(ROOT / "config" / "train" / "gpu_smoke.yaml"))
    p.add_argument("--variant", default="mhar_fused", choices=sorted(VARIANTS), help="equal/resume variant")
    p.add_argument("--steps", type=int, default=50, help="steps of the equal/resume/workflow runs")
    p.add_argument("--micro", type=int, default=8, help="micro-batch per process in equal/resume (G = nproc x micro)")
    p.add_argument("--noise-factor", type=float, default=3.0)
    p.add_argument("--abs-tol", type=float, default=0.05, help="loss tolerance when no noise-floor run is possible")
    p.add_argument("--sizes", nargs="+", default=["100M", "1B"], help="throughput presets")
    p.add_argument("--tp-variants", nargs="+", default=["baseline", "mhar_fused"], choices=sorted(VARIANTS))
    p.add_argument("--tp-parallel", nargs="+", default=["ddp", "fsdp"], choices=("ddp", "fsdp"))
    p.add_argument("--tp-steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=8, help="throughput: steps left out of the median")
    p.add_argument("--wf-configfile", nargs="+", default=["config/gpu_small.yaml", "config/gpus2.yaml"],
                   help="workflow config file(s); an overlay with the GPU count, --steps and a scratch "
                        "results_dir is added after them")
    p.add_argument("--wf-corpus", default=None,
                   help="workflow: data.corpus instead of the config's (e.g. synthetic:5000000 without a data dir)")
    p.add_argument("--kill-delay", type=float, default=1.0, help="resume: seconds from the first checkpoint to the kill")
    p.add_argument("--run-timeout", type=float, default=900, help="seconds per training command")
    p.add_argument("--scratch", default=None, help="run directories (default: a temp dir)")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every training run (after the stage's)")
    args = p.parse_args(argv)

    import torch  # lazy: the driver starts with the standard library only (see the import at the top)

    if args.nproc < 2:
        p.error("--nproc must be at least 2")
    if args.device == "cuda" and torch.cuda.device_count() < args.nproc:
        print(f"error: --nproc {args.nproc} needs {args.nproc} visible GPUs, found {torch.cuda.device_count()}; "
              "run on a multi-GPU machine or rehearse with --device cpu", file=sys.stderr)
        return 2
    # lazy: the driver starts with the standard library only (see the import at the top)
    from mhar.runs.provenance import collect_provenance

    r = Runner(args)
    res: dict = {"stages": args.stages, "nproc": args.nproc, "device": args.device, "env": NO_MULTICAST,
                 "provenance": collect_provenance()}
    ok = True
    try:
        for stage in args.stages:
            ok &= {"equal": stage_equal, "resume": stage_resume, "throughput": stage_throughput,
                   "workflow": stage_workflow}[stage](r, res)
    except CheckError as e:
        print(f"error: {e}", file=sys.stderr)
        res["error"], ok = str(e), False
    except BaseException:
        ok = False
        raise
    finally:
        res["commands"], res["pass"] = r.commands, ok
        (r.out / "multigpu_check.json").write_text(json.dumps(res, indent=1, default=str))
        print(f"[multigpu_check] {'PASS' if ok else 'FAIL'}; wrote {r.out / 'multigpu_check.json'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
