"""Pilot of the paper recipe on one GPU: train, stop, resume, evaluate, project the full run.

    OUT=dir bash benchmarks/pilot.sh                       # on the GPU machine (sets caches, data, PYTHONPATH)
    PYTHONPATH=. python -m benchmarks.pilot --out DIR [--sizes 100M 1B] [--steps 100M=300 1B=40]
        [--budget-s 330] [--eval-limit 20] [--set key=value ...]

For each size, with ``config/train/paper_<size>.yaml`` (the paper's shapes, batch and optimizer; a local
corpus; see the config's header):
  1. ``python -m mhar.train CONFIG train.steps=N train.warmup_steps=W --stop-after N/2`` (a run stopped
     half way, as if its job had been killed), then the same command without ``--stop-after``: the run
     resumes from its checkpoint (``provenance.json`` ``resumed_from_step``) and ends at step N;
  2. ``python -m eval.run --model RUN/model.pt --tasks wikitext --limit L`` (lm-eval, rolling
     log-likelihood) when lm-eval is installed;
  3. a row of ``DIR/pilot.csv``: wall time of each part, median step time and tokens/s after warm-up
     (the trainer's own per-step records), train / validation loss at steps 100, 200, 300, the evaluation,
     and the projected time of the paper's full 20K-step run on this one GPU (20K x median step time; the
     evaluations and checkpoints of a full run come on top).
``--single SIZE``: train that size in one process (no stop / resume: at 1B a restart and a 13 GB checkpoint
round trip cost about a minute). The warmup scales with N (1000 of 20K steps in the paper: 5%). Every subprocess gets the time left of
``--budget-s`` (its timeout); a size whose minimum time (``--min-stage-s``, cold compile + a few steps)
no longer fits is skipped and says so. Run folders (checkpoints: GBs at 1B) go to ``--work`` (default
``$PILOT_WORK`` or /tmp/mhar_pilot); only small records are copied under DIR. ``benchmarks/pilot_record.py``
turns DIR/pilot.csv into rows of results/bench/pilot.csv.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from mhar.safe_yaml import read_yaml_file

REPO = Path(__file__).resolve().parents[1]
FULL_STEPS = 20_000  # the paper's run length (PAPER.md)
PAPER_WARMUP_FRACTION = 1000 / FULL_STEPS
LOSS_STEPS = (100, 200, 300)
DEFAULT_STEPS = {"100M": 300, "1B": 40}
# below this many seconds left, a size is skipped: a cold start (process, data, compile, autotuning) took
# about 90 s at 100M and 190 s at 1B on one H200 (results/bench/training.csv trainer rows, 2026-12-02g)
DEFAULT_MIN_STAGE_S = {"100M": 150, "1B": 230}
SKIP_AFTER_START = 5  # steps after each (re)start left out of the step-time median (compile, capture)


def _parse_pairs(items: list[str], what: str, cast=int) -> dict:
    out = {}
    for item in items or []:
        size, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: {what} {item!r}: expected SIZE=VALUE, e.g. 100M=300")
        try:
            out[size] = cast(value)
        except ValueError:
            raise SystemExit(f"error: {what} {item!r}: {value!r} is not a number") from None
    return out


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line cut by a kill
    return rows


def _median(xs: list[float]):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget = time.time(), budget_s

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)


def run_logged(cmd: list[str], log: Path, timeout: float) -> tuple[int, float]:
    """Run ``cmd``, its output appended to ``log`` and echoed; (exit code, 124 when stopped over time; seconds)."""
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        if timeout <= 0:
            f.write("(not started: no time left)\n")
            return 124, 0.0
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)

        def pump() -> None:
            for line in proc.stdout:
                f.write(line)
                sys.stdout.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # over the budget: stop it (checkpoints written so far stay)
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reader.join(5)
            f.write(f"(stopped: over the time budget after {time.time() - t0:.0f} s)\n")
            return 124, time.time() - t0
        reader.join(5)
    return proc.returncode, time.time() - t0


def summarize_run(run_dir: Path, stop_after: int, loss_steps=LOSS_STEPS, skip: int = SKIP_AFTER_START) -> dict:
    """Losses at LOSS_STEPS, median steady step time, resume point, from the trainer's own records."""
    rows = _read_jsonl(run_dir / "metrics.jsonl")
    train = {r["step"]: r for r in rows if r.get("split") == "train"}
    val = {r["step"]: r["val_loss"] for r in rows if r.get("split") == "val"}
    prov = json.loads((run_dir / "provenance.json").read_text()) if (run_dir / "provenance.json").is_file() else {}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    resumed = prov.get("resumed_from_step")
    starts = [0] + ([resumed] if resumed else [])
    steady = [r["step_ms"] for s, r in train.items() if "step_ms" in r
              and not any(st < s <= st + skip for st in starts)]
    out = {"steps_done": max(train) if train else 0, "resumed_from_step": resumed,
           "step_ms_median": round(_median(steady), 3) if steady else None, "steady_steps": len(steady),
           "final_val_loss": summary.get("final_val_loss"), "params": summary.get("params"),
           "peak_mem_gb": summary.get("peak_mem_gb"), "step_plan": summary.get("step_plan"),
           "finished": bool(summary)}
    mfu = [r["mfu"] for s, r in train.items() if "mfu" in r and not any(st < s <= st + skip for st in starts)]
    out["mfu_median"] = _median(mfu)
    for s in loss_steps:
        out[f"train_loss_{s}"] = round(train[s]["loss"], 4) if s in train else None
        out[f"val_loss_{s}"] = round(val[s], 4) if s in val else None
    out["stopped_at_step"] = stop_after
    return out


def evaluate(run_dir: Path, out_eval: Path, limit: int, device: str, log: Path, clock: Clock) -> dict:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        return {"eval_status": "skipped: lm-eval is not installed"}
    if not (run_dir / "model.pt").is_file():
        return {"eval_status": "skipped: no model.pt (training did not finish)"}
    shutil.rmtree(out_eval, ignore_errors=True)
    cmd = [sys.executable, "-m", "eval.run", "--model", str(run_dir / "model.pt"), "--tasks", "wikitext",
           "--limit", str(limit), "--out", str(out_eval), "--device", device, "--bootstrap-iters", "0"]
    rc, wall = run_logged(cmd, log, clock.left())
    res = out_eval / "wikitext" / "results.json"
    if rc != 0 or not res.is_file():
        return {"eval_status": f"failed (exit {rc}; see {log.name})", "eval_wall_s": round(wall, 1)}
    data = json.loads(res.read_text())
    metrics = data.get("metrics") or data.get("results", {}).get("wikitext", {})
    pick = {k.split(",")[0]: v for k, v in metrics.items() if isinstance(v, (int, float))}
    return {"eval_status": "ok", "eval_task": "wikitext", "eval_limit": limit, "eval_wall_s": round(wall, 1),
            "eval_word_perplexity": pick.get("word_perplexity"), "eval_bits_per_byte": pick.get("bits_per_byte")}


def copy_records(run_dir: Path, eval_dir: Path, dest: Path) -> None:
    """The run's small files (no checkpoint, no weights) under DIR/runs/<size>/."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "provenance.json"):
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, dest / name)
    if eval_dir.is_dir():
        shutil.copytree(eval_dir, dest / "eval", dirs_exist_ok=True)


def pilot_size(size: str, args, clock: Clock, log: Path) -> dict:
    cfg_path = Path(args.config_dir) / f"paper_{size}.yaml"
    steps = args.steps.get(size, DEFAULT_STEPS.get(size, 300))
    stop = max(1, steps // 2)
    warmup = max(1, round(steps * PAPER_WARMUP_FRACTION))
    eval_every = min(args.eval_every, steps)
    run_dir = Path(args.work) / size
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [f"train.steps={steps}", f"train.warmup_steps={warmup}", f"train.eval_every={eval_every}",
                 *args.set]
    base = [sys.executable, "-m", "mhar.train", str(cfg_path), *overrides, "--out", str(run_dir)]
    row = {"size": size, "config": str(cfg_path), "target_steps": steps, "warmup_steps": warmup,
           "eval_every": eval_every, "overrides": " ".join(args.set),
           "command": "PYTHONPATH=. python -m mhar.train " + shlex.join([str(cfg_path), *overrides, "--out", "RUN"])
           + ("" if size in args.single else f" [--stop-after {stop}]")}
    t_stage = time.time()
    if size in args.single:  # one process, no stop / resume (saves a restart and a checkpoint round trip)
        stop = None
        rc1, wall1 = run_logged(base, log, clock.left())
        rc2, wall2 = 0, 0.0
    else:
        rc1, wall1 = run_logged([*base, "--stop-after", str(stop)], log, clock.left())
        rc2, wall2 = (run_logged(base, log, clock.left()) if rc1 == 0 else (None, 0.0))
    row.update(wall_s_first=round(wall1, 1), wall_s_resumed=round(wall2, 1),
               train_status="ok" if rc1 == 0 and rc2 == 0 else
               ("over budget" if 124 in (rc1, rc2) else f"failed (exit {rc1 if rc1 else rc2})"))
    row.update(summarize_run(run_dir, stop, args.loss_steps, args.skip_steps))
    ev = (evaluate(run_dir, Path(args.work) / f"eval_{size}", args.eval_limit, args.device, log, clock)
          if args.eval_limit > 0 else {"eval_status": "skipped (--eval-limit 0)"})
    row.update(ev)
    row["wall_s_stage"] = round(time.time() - t_stage, 1)
    cfg = {}
    if (run_dir / "config.yaml").is_file():
        cfg = read_yaml_file(run_dir / "config.yaml") or {}
    data, train = cfg.get("data", {}), cfg.get("train", {})
    row.update(corpus=data.get("corpus"), tokenizer=data.get("tokenizer"), seq_len=data.get("seq_len"),
               global_batch=train.get("global_batch"), micro_batch=train.get("micro_batch"),
               variant=(cfg.get("model", {}).get("residual") or {}).get("variant"))
    if row.get("step_ms_median") and row.get("seq_len") and row.get("global_batch"):
        step_s = row["step_ms_median"] / 1e3
        row["tokens_per_s"] = round(row["global_batch"] * row["seq_len"] / step_s)
        row["projected_full_run_h"] = round(FULL_STEPS * step_s / 3600, 2)
    resumed_ok = row["resumed_from_step"] == stop if stop else row["resumed_from_step"] is None
    row["status"] = "ok" if row["train_status"] == "ok" and resumed_ok else row["train_status"]
    if row["train_status"] == "ok" and not resumed_ok:
        row["status"] = f"resume not recorded (resumed_from_step={row['resumed_from_step']}, expected {stop})"
    copy_records(run_dir, Path(args.work) / f"eval_{size}", Path(args.out) / "runs" / size)
    return row


def print_table(rows: list[dict], loss_steps=LOSS_STEPS) -> None:
    cols = [("size", "size"), ("status", "status"), ("steps_done", "steps"), ("wall_s_stage", "wall s"),
            ("tokens_per_s", "tok/s"), ("step_ms_median", "step ms"),
            *[(f"val_loss_{s}", f"val@{s}") for s in loss_steps],
            *[(f"train_loss_{s}", f"train@{s}") for s in loss_steps],
            ("eval_word_perplexity", "wikitext ppl"), ("projected_full_run_h", "20K steps h/GPU")]
    cells = [[h for _, h in cols]] + [["" if r.get(k) is None else str(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    for i, line in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="records: pilot.csv, pilot.log, runs/<size>/ (small files)")
    ap.add_argument("--sizes", nargs="+", default=["100M", "1B"])
    ap.add_argument("--steps", nargs="*", default=[], help="SIZE=N (default 100M=300 1B=40)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="wall-time budget of the whole pilot")
    ap.add_argument("--min-stage-s", nargs="*", default=[],
                    help="SIZE=S: skip a size when fewer seconds are left (default 100M=150 1B=230)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--skip-steps", type=int, default=SKIP_AFTER_START,
                    help="steps after each (re)start left out of the step-time median (compile, graph capture)")
    ap.add_argument("--loss-steps", type=int, nargs="+", default=list(LOSS_STEPS), help="steps whose losses are reported")
    ap.add_argument("--eval-limit", type=int, default=20, help="wikitext documents (0: no evaluation)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config-dir", default="config/train")
    ap.add_argument("--work", default=os.environ.get("PILOT_WORK", "/tmp/mhar_pilot"),
                    help="run folders with their checkpoints (not copied to --out)")
    ap.add_argument("--set", nargs="*", default=[], help="key=value overrides for every size (e.g. on CPU)")
    ap.add_argument("--single", nargs="*", default=[], metavar="SIZE",
                    help="sizes trained in one process, without the stop half way and the resume")
    args = ap.parse_args(argv)
    args.steps = {**DEFAULT_STEPS, **_parse_pairs(args.steps, "--steps")}
    small = [f"{k}={v}" for k, v in args.steps.items() if k in args.sizes and v < 2]
    if small:
        raise SystemExit(f"error: --steps {' '.join(small)}: a pilot needs at least 2 steps (it stops half way)")
    min_stage = {**DEFAULT_MIN_STAGE_S, **_parse_pairs(args.min_stage_s, "--min-stage-s", float)}
    for size in args.sizes:
        if not (Path(args.config_dir) / f"paper_{size}.yaml").is_file():
            raise SystemExit(f"error: no config {Path(args.config_dir) / f'paper_{size}.yaml'} for size {size!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    log = out / "pilot.log"
    clock = Clock(args.budget_s)

    from benchmarks.common import env_columns, write_csv  # lazy: torch (benchmarks.common), only once rows are written

    env = env_columns(argv=sys.argv[1:] if argv is None else argv, module="benchmarks.pilot")
    env["pilot_command"] = env.pop("command")
    rows = []
    for size in args.sizes:
        need = min_stage.get(size, 0.0)
        if clock.left() < need:
            msg = f"skipped: {clock.left():.0f} s of the {args.budget_s:.0f} s budget left, {size} needs about {need:.0f} s"
            print(f"== {size}: {msg}")
            rows.append({"size": size, "status": msg})
            continue
        print(f"== {size}: {clock.left():.0f} s left")
        rows.append({**pilot_size(size, args, clock, log), **env})
    rows = [{"utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "budget_s": args.budget_s,
             "pilot_wall_s": round(time.time() - clock.t0, 1), **r} for r in rows]
    write_csv(out / "pilot.csv", rows)
    print_table(rows, args.loss_steps)
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
