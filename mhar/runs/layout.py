"""Where runs live and what each run folder is.

    python -m mhar runs [--results results]             # list every run; writes results/runs/INDEX.md

Layout (the workflow's paths are built from these patterns; ``rid`` = the first ``PATH_ID_LEN`` hex digits
of the run identity, :func:`mhar.runs.config.identity_hash`)::

    results/runs/<label>/<size>/seed<k>/<rid>/                       a training run (mhar.train --out)
    results/eval/<label>/<size>/seed<k>/<rid>/<ehash>/<task>/        its evaluations (eval.run)
    results/logs/train/<label>/<size>/seed<k>/<rid>.log              the workflow's logs, likewise
    results/data/<data key>/shards.json                              the tokenization job's record

The listing reads each run folder's own records (``config.yaml``, ``summary.json``, ``diverged.json``,
``metrics.jsonl``, the trainer's ``.lock``), never its path: label, size, seed, identity, status
(finished / running / diverged / incomplete) and the run's metrics. A folder that is not where its identity
puts it (a hand-made ``--out``, or a folder of another layout: scripts/migrate_run_layout.py moves those) is
flagged.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from mhar.atomic import atomic_write_text, os_error_line, pid_alive, read_json
from mhar.model.config import config_hash
from mhar.runs.config import PATH_ID_LEN, RunConfig, identity_hash, recorded_run_config, run_identity
from mhar.safe_yaml import read_yaml_file

__all__ = ["RUN_LAYOUT", "EVAL_LAYOUT", "TRAIN_LOG_LAYOUT", "EVAL_LOG_LAYOUT", "run_key", "run_relpath", "data_key",
           "RunInfo", "run_dirs", "trainer_alive", "scan", "index_markdown", "write_index", "main"]

# Path patterns under the results folder (Snakemake wildcard names; {variant} is the run's label).
RUN_LAYOUT = "runs/{variant}/{size}/seed{seed}/{rid}"
EVAL_LAYOUT = "eval/{variant}/{size}/seed{seed}/{rid}/{ehash}/{task}"
TRAIN_LOG_LAYOUT = "logs/train/{variant}/{size}/seed{seed}/{rid}.log"
EVAL_LOG_LAYOUT = "logs/eval/{variant}/{size}/seed{seed}/{rid}/{ehash}/{task}.log"


def run_key(cfg: RunConfig) -> dict:
    """The path components of a run: {variant (the label), size, seed, rid}."""
    run = run_identity(cfg)
    return {"variant": run["label"], "size": cfg.size, "seed": cfg.seed, "rid": identity_hash(cfg)[:PATH_ID_LEN]}


def run_relpath(cfg: RunConfig) -> str:
    """``runs/<label>/<size>/seed<k>/<rid>``: where the workflow trains ``cfg`` (relative to the results folder)."""
    return RUN_LAYOUT.format(**run_key(cfg))


def data_key(cfg: RunConfig) -> str:
    """Key of the workflow's tokenization record: the data section that decides the token shards (not the
    data-order seed, not locations) and the model's vocabulary size."""
    data = {k: v for k, v in cfg.to_dict()["data"].items() if k not in ("seed", "cache_dir", "data_dir")}
    return config_hash({"data": data, "vocab_size": cfg.model.vocab_size}, PATH_ID_LEN)


# --- listing ------------------------------------------------------------------------------------------
@dataclass
class RunInfo:
    path: Path  # the run folder
    rel: str  # its path relative to the runs root
    label: str = "?"
    size: str = "?"
    seed: Optional[int] = None
    identity: str = ""
    status: str = "incomplete"  # finished | running | diverged | incomplete | unreadable
    step: Optional[int] = None
    steps: Optional[int] = None
    metrics: dict = field(default_factory=dict)
    expected_rel: Optional[str] = None  # where the current layout puts it (None: unknown)
    note: str = ""

    @property
    def misplaced(self) -> bool:
        return self.expected_rel is not None and self.expected_rel != self.rel


def run_dirs(runs_root: Path) -> list[Path]:
    """Folders under ``runs_root`` that hold a ``config.yaml`` (a run folder's subfolders are not searched)."""
    out = []
    if not runs_root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(runs_root):
        if "config.yaml" in filenames and Path(dirpath) != runs_root:
            out.append(Path(dirpath))
            dirnames[:] = []
        else:
            dirnames.sort()
    return sorted(out)


def trainer_alive(path: Path) -> bool:
    """Whether the trainer whose pid ``path/.lock`` names is alive on this machine (and is a Python process).

    The pid, not a probe of the lock itself: taking the lock even for an instant could make a trainer that
    starts at that instant refuse its folder. A trainer on another machine of a shared file system is not seen."""
    try:
        pid = int((path / ".lock").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    if not pid_alive(pid):
        return False
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _last_step(metrics: Path) -> Optional[int]:
    """The step of the last complete line of metrics.jsonl (read from its end)."""
    try:
        with open(metrics, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError, UnicodeDecodeError):
            continue
        if isinstance(step, int):
            return step
    return None


def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def run_info(path: Path, runs_root: Path, check_layout: bool = True) -> RunInfo:
    """What one run folder is, from its own records (``check_layout``: note when it is not where the results
    layout puts it; off for folders outside a results folder)."""
    info = RunInfo(path=path, rel=path.relative_to(runs_root).as_posix())
    try:
        cfg = recorded_run_config(read_yaml_file(path / "config.yaml"))
    except Exception as e:  # unreadable YAML, unknown key, ...: listed, not fatal
        info.status, info.note = "unreadable", f"config.yaml: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return info
    key = run_key(cfg)
    info.label, info.size, info.seed = key["variant"], key["size"], key["seed"]
    info.identity, info.steps = identity_hash(cfg), cfg.train.steps
    info.expected_rel = RUN_LAYOUT.format(**key).removeprefix("runs/") if check_layout else None
    summary = read_json(path / "summary.json")
    diverged = read_json(path / "diverged.json")
    if isinstance(summary, dict) and summary.get("tail_mean_val_loss") is not None:
        info.status, info.step = "finished", summary.get("steps")
        info.metrics = {k: _num(summary.get(k)) for k in ("tail_mean_val_loss", "final_val_loss", "wall_s",
                                                          "tokens_per_s")}
    elif trainer_alive(path):
        info.status, info.step = "running", _last_step(path / "metrics.jsonl")
    elif isinstance(diverged, dict):
        info.status, info.step = "diverged", diverged.get("step")
        info.note = str(diverged.get("what", ""))
    else:
        info.status, info.step = "incomplete", _last_step(path / "metrics.jsonl")
    if info.misplaced:
        info.note = (info.note + "; " if info.note else "") + "not where its identity puts it"
    return info


def scan(results: str | os.PathLike) -> list[RunInfo]:
    runs_root = Path(results) / "runs"
    rows = [run_info(p, runs_root) for p in run_dirs(runs_root)]
    return sorted(rows, key=lambda r: (r.label, r.size, r.seed if r.seed is not None else -1, r.rel))


def scan_paths(paths: Sequence[str | os.PathLike]) -> list[RunInfo]:
    """Run folders at or below each path (a run trained with ``--out`` anywhere); folders are shown relative to
    the path's parent, and the results layout is not checked (these are not under a results folder)."""
    rows = []
    for given in map(Path, paths):
        found = [given] if (given / "config.yaml").is_file() else run_dirs(given)
        for d in found:
            info = run_info(d, given, check_layout=False)
            info.rel = d.as_posix()  # as the user named it
            rows.append(info)
    return rows


def _fmt(v: Optional[float], nd: int = 4) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _row(r: RunInfo) -> list[str]:
    prog = f"{r.step if r.step is not None else '-'}/{r.steps if r.steps is not None else '-'}"
    return [r.rel, r.label, r.size, "-" if r.seed is None else str(r.seed), r.identity[:PATH_ID_LEN] or "-", r.status,
            prog, _fmt(r.metrics.get("tail_mean_val_loss")), _fmt(r.metrics.get("final_val_loss")),
            _fmt(r.metrics.get("wall_s"), 0), r.note or ""]


HEADER = ["run folder", "label", "size", "seed", "identity", "status", "step", "tail-mean val loss",
          "final val loss", "wall s", "note"]


def index_markdown(rows: Sequence[RunInfo], results: str | os.PathLike) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines = ["# Runs", "",
             f"Generated by `python -m mhar runs --results {results}` from each run folder's own records; do not "
             "edit (the next listing rewrites it). Folders are relative to this file; identity = the first "
             f"{PATH_ID_LEN} hex digits of `mhar.runs.config.identity_hash` (the `identity` in summary.json).", "",
             ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no runs", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = _row(r)
        cells[0] = f"[{cells[0]}]({cells[0]}/)"
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_index(results: str | os.PathLike, rows: Optional[Sequence[RunInfo]] = None) -> Path:
    """Write (or refresh) ``results/runs/INDEX.md`` atomically; returns its path."""
    rows = scan(results) if rows is None else rows
    return atomic_write_text(Path(results) / "runs" / "INDEX.md", index_markdown(rows, results))


def _print_table(rows: Sequence[RunInfo]) -> None:
    table = [HEADER] + [_row(r) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(HEADER))]
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())


# --- CLI ----------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "list":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="mhar runs", description="List every run folder (label, size, seed, identity, "
                                "status, metrics) and write results/runs/INDEX.md.")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="run folders, or folders holding them, anywhere (runs trained with --out elsewhere); "
                        "listed only, no index written")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--no-index", action="store_true", help="print only; do not write runs/INDEX.md")
    a = p.parse_args(argv)
    if a.paths:
        missing = [x for x in a.paths if not Path(x).is_dir()]
        if missing:
            print(f"error: {missing[0]}: no such folder (give a run folder or a folder holding run folders)",
                  file=sys.stderr)
            return 2
        rows = scan_paths(a.paths)
        if not rows:
            print(f"error: no run folder (one holding config.yaml) at or below {' '.join(a.paths)}", file=sys.stderr)
            return 2
        _print_table(rows)
        return 0
    if not Path(a.results).is_dir():
        print(f"error: {a.results}: no such results folder (give --results DIR)", file=sys.stderr)
        return 2
    rows = scan(a.results)
    _print_table(rows)
    if rows and not a.no_index:
        try:
            print(f"\nwrote {write_index(a.results, rows)}")
        except OSError as e:
            print(f"error: {os_error_line(e, 'writing the index')}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
