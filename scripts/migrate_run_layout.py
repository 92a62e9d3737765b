"""Move results laid out by earlier versions of the harness to the current layout, and convert their training
checkpoints to the current run identity. A one-off tool, not part of the library:

    python scripts/migrate_run_layout.py [--results results] [--dry-run]     # a whole results folder
    python scripts/migrate_run_layout.py --run RUN_DIR [--dry-run]           # one run folder made with --out

Folders: run folders of the form ``results/runs/<pairing hash>/<label>/<size>/seed<k>/[<old identity>/]``, with
their evaluation folders, workflow logs and tokenization records, move to the paths the current identity gives
them (``mhar.runs.layout``). Moves are ``os.rename`` (same file system: instant, mtimes kept, nothing copied,
nothing deleted but emptied folders, nothing retrained). The whole plan is checked first: a target that exists,
two folders with one target, a running trainer or an unreadable ``config.yaml`` refuses the migration with one
``error:`` line before anything moves. The plan is written to ``results/.mhar-migrate.json`` before the first
move, so a migration that is killed half-way resumes where it stopped when run again; when done it is kept as
``results/migrations/<time>.json`` (old path -> new path).

Checkpoints: a training state that names its run by the identity of that time (key ``identity_hash``, computed by
:func:`old_identity_hash` from the run folder's ``config.yaml``), including a ``checkpoint/state.pt``, is
rewritten as ``checkpoint/state-<step>.pt`` with the current identity (checksum beside it, written atomically),
so the trainer resumes it. A state whose old identity does not match its folder's config is refused and left.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from mhar.model.config import config_hash  # noqa: E402
from mhar.atomic import atomic_write_text, os_error_line, read_json, sha256_path  # noqa: E402
from mhar.runs.checkpoint import CheckpointError, atomic_torch_save, safe_torch_load  # noqa: E402
from mhar.runs.config import identity_hash, recorded_run_config  # noqa: E402
from mhar.safe_yaml import read_yaml_file  # noqa: E402
from mhar.runs.layout import data_key, run_dirs, run_relpath, trainer_alive, write_index  # noqa: E402
from mhar.runs.provenance import utc_now  # noqa: E402

PLAN_FILE = ".mhar-migrate.json"
# What else the workflow names after a run's folder (relative to the results folder): folders <sub>/<run rel>/
# and files <sub>/<run rel><ext> (evaluations, job logs, the run config a job trained, `benchmark:` records).
_RUN_FOLDERS = ("eval", "logs/eval", "benchmarks/eval")
_RUN_FILES = (("logs/train", ".log"), ("logs/train", ".run_config.yaml"), ("benchmarks/train", ".tsv"))
_HEX = re.compile(r"^[0-9a-f]+$")
_SEED = re.compile(r"^seed\d+$")


class MigrationError(RuntimeError):
    """A migration that cannot be done as planned (nothing was moved)."""



# --- the identity checkpoints recorded before -------------------------------------------------------------
# identity_hash then covered everything but these keys (so also the model preset, routing_impl, compile,
# cuda_graph, device, parallel and micro_batch), over the resolved config as written, 16 hex digits.
_OLD_IDENTITY_EXCLUDE = (
    "meta.name", "meta.variant", "meta.size",
    "train.log_every", "train.checkpoint_every", "train.save_model_every_checkpoint", "train.log_batch_hash",
    "train.threads", "data.cache_dir", "data.data_dir",
)
_OMIT_UNSET = ("model.residual.module",)


def _drop(d: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        d = d.get(p)
        if not isinstance(d, dict):
            return
    d.pop(leaf, None)


def old_identity_hash(recorded: dict) -> str:
    """The identity a checkpoint of the earlier design recorded (key ``identity_hash``), computed from the run
    folder's recorded ``config.yaml`` as that code did."""
    d = copy.deepcopy(recorded) if isinstance(recorded, dict) else {}
    data = d.setdefault("data", {}) if isinstance(d.get("data", {}), dict) else {}
    if data.get("seed") is None:
        data["seed"] = (d.get("train") or {}).get("seed", 0)
    for key in _OLD_IDENTITY_EXCLUDE:
        _drop(d, key)
    for key in _OMIT_UNSET:
        parent, leaf = key.rsplit(".", 1)
        node = d
        for p in parent.split("."):
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(leaf) is None:
            node.pop(leaf, None)
    return config_hash(d, 16)


def old_checkpoints(run: Path) -> list[Path]:
    """The training states in ``run/checkpoint`` that carry an old identity (no ``identity`` key)."""
    ck = run / "checkpoint"
    if not ck.is_dir():
        return []
    found = []
    for p in sorted(ck.glob("state*.pt")):
        if not re.fullmatch(r"state(-\d+)?\.pt", p.name):
            continue
        try:
            blob = safe_torch_load(p)
        except Exception:  # unreadable: the trainer reports it; nothing to convert
            continue
        if isinstance(blob, dict) and "identity" not in blob and "identity_hash" in blob:
            found.append(p)
    return found


def convert_checkpoints(run: Path, dry_run: bool = False, log=print) -> list[Path]:
    """Rewrite the old-identity training states of ``run`` as ``state-<step>.pt`` with the current identity;
    returns the states written. MigrationError when one belongs to another config (nothing of it changed)."""
    found = old_checkpoints(run)
    if not found:
        return []
    raw = read_yaml_file(run / "config.yaml")
    old, new = old_identity_hash(raw), identity_hash(recorded_run_config(raw))
    written = []
    for p in found:
        blob = safe_torch_load(p)
        if blob["identity_hash"] != old:
            raise MigrationError(f"{p} was written by a different config than {run / 'config.yaml'} (old identity "
                                 f"{blob['identity_hash']}, expected {old}); move it out of that folder, then migrate")
        target = p.with_name(f"state-{int(blob['progress']['step']):08d}.pt")
        log(f"{'would convert' if dry_run else 'converted'} {p} -> {target.name} (identity {new})")
        if dry_run:
            continue
        blob["identity"] = new
        del blob["identity_hash"]
        atomic_torch_save(blob, target)
        if p != target:
            p.unlink()
            sha256_path(p).unlink(missing_ok=True)
        written.append(target)
    return written


# --- moving folders ------------------------------------------------------------------------------------------
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

    for path in run_dirs(runs_root):
        rel = path.relative_to(runs_root)
        try:
            cfg = recorded_run_config(read_yaml_file(path / "config.yaml"))
        except Exception as e:  # unreadable file, YAML error, unknown key, ...
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise MigrationError(f"cannot migrate {path}: its config.yaml is unreadable ({why}); move that folder "
                                 "out of the results folder (or fix it), then migrate") from None
        new_rel = Path(run_relpath(cfg)).relative_to("runs")
        if rel == new_rel:
            continue
        if trainer_alive(path):
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
    done = root / "migrations" / f"{utc_now().replace(':', '')}.json"
    done.parent.mkdir(parents=True, exist_ok=True)
    os.replace(plan_path, done)
    return plan


# --- CLI ----------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/migrate_run_layout.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--run", type=Path, help="convert the checkpoints of this one run folder (made with --out)")
    p.add_argument("--dry-run", action="store_true", help="print the moves and conversions, change nothing")
    a = p.parse_args(argv)
    try:
        if a.run is not None:
            if not (a.run / "config.yaml").is_file():
                raise MigrationError(f"{a.run} is not a run folder (no config.yaml)")
            if not convert_checkpoints(a.run, a.dry_run) and not a.dry_run:
                print(f"nothing to convert in {a.run}")
            return 0
        plan = migrate(a.results, dry_run=a.dry_run)
        runs = run_dirs(Path(a.results) / "runs")
        converted = sum(len(convert_checkpoints(r, a.dry_run)) for r in runs)
    except (MigrationError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {os_error_line(e, 'migrating')}; run the migration again to finish", file=sys.stderr)
        return 2
    for old, new in plan.moves:
        print(f"{'would move' if a.dry_run else 'moved'} {Path(a.results) / old} -> {Path(a.results) / new}")
    for what in plan.left:
        print(f"left in place: {Path(a.results) / what}")
    n_runs = sum(old.startswith("runs/") for old, _ in plan.moves)
    print(f"{n_runs} run folder(s) and {len(plan.moves) - n_runs} other path(s) "
          f"{'to move' if a.dry_run else 'moved'}" if plan.moves else "nothing to migrate: every run folder "
          "is where its identity puts it")
    if converted and not a.dry_run:
        print(f"{converted} checkpoint(s) converted")
    if not a.dry_run and (Path(a.results) / "runs").is_dir():
        print(write_index(a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
