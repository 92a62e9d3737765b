"""Where runs live, what each run folder is, and moving results from the older layout.

    python -m mhar runs [--results results]             # list every run; writes results/runs/INDEX.md
    python -m mhar runs migrate [--results results] [--dry-run]

Layout (the workflow's paths are built from these patterns; ``rid`` = the first ``PATH_ID_LEN`` hex digits
of the run identity, :func:`mhar.runs.config.identity_hash`)::

    results/runs/<label>/<size>/seed<k>/<rid>/                       a training run (mhar.train --out)
    results/eval/<label>/<size>/seed<k>/<rid>/<ehash>/<task>/        its evaluations (eval.run)
    results/logs/train/<label>/<size>/seed<k>/<rid>.log              the workflow's logs, likewise
    results/data/<data key>/shards.json                              the tokenization job's record

The listing reads each run folder's own records (``config.yaml``, ``summary.json``, ``diverged.json``,
``metrics.jsonl``, the trainer's ``.lock``), never its path: label, size, seed, identity, status
(finished / running / diverged / incomplete) and the run's metrics. A folder that is not where its identity
puts it (older layout, a hand-made ``--out``) is flagged.

``migrate`` moves run folders of an older layout (``results/runs/<pairing hash>/<label>/<size>/seed<k>/
[<old identity>/]``), with their evaluation folders, workflow logs and tokenization records, to the paths the
current identity gives them. Moves are ``os.rename`` (same file system: instant, mtimes kept, nothing copied,
nothing deleted but emptied folders, nothing retrained). The whole plan is checked first: a target that
exists, two folders with one target, a running trainer or an unreadable ``config.yaml`` refuses the
migration with one ``error:`` line before anything moves. The plan is written to
``results/.mhar-migrate.json`` before the first move, so a migration that is killed half-way resumes where it
stopped when run again; when done it is kept as ``results/migrations/<time>.json`` (old path -> new path).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from mhar.runs.atomic import atomic_write_text, os_error_line, read_json
from mhar.model.config import config_hash
from mhar.runs.config import PATH_ID_LEN, RunConfig, identity_hash, recorded_run_config, run_identity, yaml_load

__all__ = ["RUN_LAYOUT", "EVAL_LAYOUT", "run_key", "run_relpath", "data_key", "RunInfo", "scan", "index_markdown",
           "write_index", "plan_migration", "migrate", "MigrationError", "main"]

# Path patterns under the results folder (Snakemake wildcard names; {variant} is the run's label).
RUN_LAYOUT = "runs/{variant}/{size}/seed{seed}/{rid}"
EVAL_LAYOUT = "eval/{variant}/{size}/seed{seed}/{rid}/{ehash}/{task}"
TRAIN_LOG_LAYOUT = "logs/train/{variant}/{size}/seed{seed}/{rid}.log"
EVAL_LOG_LAYOUT = "logs/eval/{variant}/{size}/seed{seed}/{rid}/{ehash}/{task}.log"
PLAN_FILE = ".mhar-migrate.json"
# What else the workflow names after a run's folder (relative to the results folder): folders <sub>/<run rel>/
# and files <sub>/<run rel><ext> (evaluations, job logs, the run config a job trained, `benchmark:` records).
_RUN_FOLDERS = ("eval", "logs/eval", "benchmarks/eval")
_RUN_FILES = (("logs/train", ".log"), ("logs/train", ".run_config.yaml"), ("benchmarks/train", ".tsv"))
_HEX = re.compile(r"^[0-9a-f]+$")
_SEED = re.compile(r"^seed\d+$")


class MigrationError(RuntimeError):
    """A migration that cannot be done as planned (nothing was moved)."""


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


def _run_dirs(runs_root: Path) -> list[Path]:
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


def _locked(path: Path) -> bool:
    """Whether the trainer whose pid ``path/.lock`` names is alive on this machine (and is a Python process).

    The pid, not a probe of the lock itself: taking the lock even for an instant could make a trainer that
    starts at that instant refuse its folder. A trainer on another machine of a shared file system is not seen."""
    try:
        pid = int((path / ".lock").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
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


def run_info(path: Path, runs_root: Path) -> RunInfo:
    """What one run folder is, from its own records."""
    info = RunInfo(path=path, rel=path.relative_to(runs_root).as_posix())
    try:
        cfg = recorded_run_config(yaml_load((path / "config.yaml").read_text()))
    except Exception as e:  # unreadable YAML, unknown key, ...: listed, not fatal
        info.status, info.note = "unreadable", f"config.yaml: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return info
    key = run_key(cfg)
    info.label, info.size, info.seed = key["variant"], key["size"], key["seed"]
    info.identity, info.steps = identity_hash(cfg), cfg.train.steps
    info.expected_rel = RUN_LAYOUT.format(**key).removeprefix("runs/")
    summary = read_json(path / "summary.json")
    diverged = read_json(path / "diverged.json")
    if isinstance(summary, dict) and summary.get("tail_mean_val_loss") is not None:
        info.status, info.step = "finished", summary.get("steps")
        info.metrics = {k: _num(summary.get(k)) for k in ("tail_mean_val_loss", "final_val_loss", "wall_s",
                                                          "tokens_per_s")}
    elif _locked(path):
        info.status, info.step = "running", _last_step(path / "metrics.jsonl")
    elif isinstance(diverged, dict):
        info.status, info.step = "diverged", diverged.get("step")
        info.note = str(diverged.get("what", ""))
    else:
        info.status, info.step = "incomplete", _last_step(path / "metrics.jsonl")
    if info.misplaced:
        info.note = (info.note + "; " if info.note else "") + "not at its current-layout path (python -m mhar runs migrate)"
    return info


def scan(results: str | os.PathLike) -> list[RunInfo]:
    runs_root = Path(results) / "runs"
    rows = [run_info(p, runs_root) for p in _run_dirs(runs_root)]
    return sorted(rows, key=lambda r: (r.label, r.size, r.seed if r.seed is not None else -1, r.rel))


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


# --- migration ----------------------------------------------------------------------------------------
@dataclass
class Plan:
    moves: list[tuple[str, str]] = field(default_factory=list)  # (old, new) relative to the results folder
    left: list[str] = field(default_factory=list)  # what stays where it is, and why

    def to_json(self) -> str:
        return json.dumps({"format": "mhar-migrate-v1", "moves": self.moves, "left": self.left}, indent=1)


def _old_hash(rel_parts: Sequence[str]) -> Optional[str]:
    """The pairing hash component of an older run path (<hash>/<label>/<size>/seed<k>[/<rid>]), if any."""
    if len(rel_parts) == 5 and _SEED.match(rel_parts[3]) and _HEX.match(rel_parts[4]) and _HEX.match(rel_parts[0]):
        return rel_parts[0]
    if len(rel_parts) == 4 and _SEED.match(rel_parts[3]) and _HEX.match(rel_parts[0]):
        return rel_parts[0]
    return None


def plan_migration(results: str | os.PathLike) -> Plan:
    """Every move that brings ``results`` to the current layout; MigrationError (one line) when one is not
    possible. Nothing is moved here."""
    root = Path(results)
    runs_root = root / "runs"
    plan = Plan()
    targets: dict[str, str] = {}
    data_moves: dict[str, set] = {}  # old pairing hash -> new data keys

    def claim(old: str, new: str) -> None:
        if new in targets:
            raise MigrationError(f"{root / targets[new]} and {root / old} would both move to {root / new} (one "
                                 "run identity twice); move one of them out of the results folder, then migrate")
        if (root / new).exists():
            raise MigrationError(f"cannot move {root / old} to {root / new}: that path already exists; compare the "
                                 "two, move one out of the results folder, then migrate")
        targets[new] = old
        plan.moves.append((old, new))

    for path in _run_dirs(runs_root):
        rel = path.relative_to(runs_root)
        try:
            cfg = recorded_run_config(yaml_load((path / "config.yaml").read_text()))
        except Exception as e:  # unreadable file, YAML error, unknown key, ...
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise MigrationError(f"cannot migrate {path}: its config.yaml is unreadable ({why}); move that folder "
                                 "out of the results folder (or fix it), then migrate") from None
        new_rel = Path(run_relpath(cfg)).relative_to("runs")
        if rel == new_rel:
            continue
        if _locked(path):
            raise MigrationError(f"a trainer is running in {path}; wait for it to finish (or stop it), then migrate")
        if str(new_rel).startswith(str(rel) + "/") or str(rel).startswith(str(new_rel) + "/"):
            raise MigrationError(f"cannot move {path} to {runs_root / new_rel}: one lies inside the other")
        old_s, new_s = rel.as_posix(), new_rel.as_posix()
        claim(f"runs/{old_s}", f"runs/{new_s}")
        for sub in _RUN_FOLDERS:  # folders named like the run's folder: its evaluations, their logs, ...
            if (root / sub / old_s).is_dir():
                claim(f"{sub}/{old_s}", f"{sub}/{new_s}")
        for sub, ext in _RUN_FILES:  # files named like it: its train log, run config, job benchmark
            if (root / sub / (old_s + ext)).is_file():
                claim(f"{sub}/{old_s}{ext}", f"{sub}/{new_s}{ext}")
        h = _old_hash(rel.parts)
        if h is not None:
            data_moves.setdefault(h, set()).add(data_key(cfg))
    taken: set = set()
    for h, keys in sorted(data_moves.items()):
        if len(keys) != 1:  # an older hash whose runs now have different data keys: leave it, it is rebuilt
            plan.left.append(f"data/{h}: its runs have {len(keys)} data keys now")
            continue
        key = next(iter(keys))
        if not (root / "data" / h).is_dir():
            continue
        if (root / "data" / key).exists() or key in taken:
            plan.left.append(f"data/{h}: data/{key} is already there (the same tokenization record)")
            continue
        taken.add(key)
        claim(f"data/{h}", f"data/{key}")
        for sub, ext in (("logs/data", ".log"), ("benchmarks/data", ".tsv")):
            if (root / sub / f"{h}{ext}").is_file() and not (root / sub / f"{key}{ext}").exists():
                claim(f"{sub}/{h}{ext}", f"{sub}/{key}{ext}")
    moved = [old for old, _ in plan.moves if old.startswith("eval/")]
    for rp in sorted((root / "eval").glob("**/results.json")) if (root / "eval").is_dir() else []:
        rel = rp.parent.relative_to(root).as_posix()
        parts = rel.split("/")
        # current layout: eval/<label>/<size>/seed<k>/<rid>/<ehash>/<task> of an existing run folder
        current = len(parts) == 7 and (runs_root / "/".join(parts[1:5]) / "config.yaml").is_file()
        if not current and not any(rel.startswith(m + "/") for m in moved):
            plan.left.append(f"{rel}: no run folder of it was found, so its new path is unknown")
    return plan


def _remove_empty_parents(path: Path, stop: Path) -> None:
    """Remove ``path`` and its parents up to (not including) ``stop`` while they are empty folders."""
    path = path.resolve()
    stop = stop.resolve()
    while path != stop and stop in path.parents:
        try:
            path.rmdir()
        except OSError:
            return
        path = path.parent


def migrate(results: str | os.PathLike, dry_run: bool = False, log=print) -> Plan:
    """Plan (or resume an interrupted plan) and move; returns the plan. MigrationError: nothing moved."""
    root = Path(results)
    if not root.is_dir():
        raise MigrationError(f"{root}: no such results folder (give --results DIR)")
    plan_path = root / PLAN_FILE
    saved = read_json(plan_path) if plan_path.is_file() else None
    if isinstance(saved, dict) and saved.get("format") == "mhar-migrate-v1":
        plan = Plan([tuple(m) for m in saved["moves"]], list(saved.get("left", [])))
        log(f"resuming the interrupted migration recorded in {plan_path}")
    else:
        plan = plan_migration(root)
    if dry_run:
        return plan
    if not plan.moves:
        return plan
    atomic_write_text(plan_path, plan.to_json())  # before the first move: a kill resumes from it
    for old, new in plan.moves:
        src, dst = root / old, root / new
        if not src.exists() and dst.exists():
            continue  # moved before an interruption
        if dst.exists():
            raise MigrationError(f"cannot move {src} to {dst}: that path appeared meanwhile; nothing more was "
                                 f"moved (the plan is in {plan_path}; run migrate again after resolving it)")
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src, dst)  # same file system: atomic, keeps mtimes
        _remove_empty_parents(src.parent, root)
    from mhar.runs.provenance import utc_now

    done = root / "migrations" / f"{utc_now().replace(':', '')}.json"
    done.parent.mkdir(parents=True, exist_ok=True)
    os.replace(plan_path, done)
    return plan


# --- CLI ----------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "migrate":
        p = argparse.ArgumentParser(prog="mhar runs migrate",
                                    description="Move run and evaluation folders of an older layout to the current "
                                                "one (os.rename: mtimes kept; nothing deleted or retrained).")
        p.add_argument("--results", default="results", help="results folder (default: results)")
        p.add_argument("--dry-run", action="store_true", help="print the moves, move nothing")
        a = p.parse_args(argv[1:])
        try:
            plan = migrate(a.results, dry_run=a.dry_run)
        except MigrationError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"error: {os_error_line(e, 'migrating')}; run migrate again to finish", file=sys.stderr)
            return 2
        for old, new in plan.moves:
            print(f"{'would move' if a.dry_run else 'moved'} {Path(a.results) / old} -> {Path(a.results) / new}")
        for what in plan.left:
            print(f"left in place: {Path(a.results) / what}")
        n_runs = sum(old.startswith("runs/") for old, _ in plan.moves)
        print(f"{n_runs} run folder(s) and {len(plan.moves) - n_runs} other path(s) "
              f"{'to move' if a.dry_run else 'moved'}" if plan.moves else "nothing to migrate: every run folder "
              "is where its identity puts it")
        if not a.dry_run and (Path(a.results) / "runs").is_dir():
            print(write_index(a.results))
        return 0
    if argv and argv[0] == "list":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="mhar runs", description="List every run folder (label, size, seed, identity, "
                                "status, metrics) and write results/runs/INDEX.md. Subcommand: migrate.")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--no-index", action="store_true", help="print only; do not write runs/INDEX.md")
    a = p.parse_args(argv)
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
