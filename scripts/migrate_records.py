"""Convert the records of earlier harness versions to the one shape the analysis reads. A one-off tool, not part of
the library (the readers in ``analysis.load.runs`` refuse an older record with a line naming this script):

    python scripts/migrate_records.py --results results [--dry-run]

The current shape (what ``python -m mhar.train`` and ``python -m eval.run`` write today):

* ``summary.json`` carries the ``run`` block (:func:`mhar.runs.config.run_identity`: label, residual, size, seed,
  data_seed, identity, pairing, config) and the ``display`` record (:func:`mhar.model.residuals.display_record`);
* ``<task>/results.json`` carries the ``run`` block of the model it evaluated (a released checkpoint's block has
  ``released`` and no config) and that ``display`` record.

Older summaries (flat ``variant`` = run label, ``config_hash``, heads in ``config.yaml``; or a ``run`` block
without ``config``; or no ``display``) get both blocks from the run folder's ``config.yaml`` and the residual
registry, keeping the label, pairing and identity they were read with. Older results.json (no ``run`` block, or one
with a ``config_hash`` instead of ``config``) get the blocks of the run folder of the model they name (the folder
holding ``summary.json`` beside, or above, the model file); one with a current run block but no ``display`` gets
that run's display record, else the registry's. Every other key of a record is kept as it was; nothing is
retrained or re-evaluated.

Everything is planned first: a record that cannot be converted (a config.yaml that does not load, a seed or size
that disagrees with its config, a variant whose module does not import here) refuses the migration with one
``error:`` line before any file is written. Each file is then rewritten atomically, so a killed migration is
finished by running it again. Records it cannot place (an evaluation of an ``hf:`` model that records no run, or
whose run folder is gone) are listed and left as they are.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from mhar.model.config import ConfigError  # noqa: E402
from mhar.model.residuals import display_record, import_variant_module  # noqa: E402
from mhar.atomic import atomic_write_text, os_error_line, read_json  # noqa: E402
from mhar.runs.config import recorded_run_config, run_identity  # noqa: E402
from mhar.safe_yaml import read_yaml_file  # noqa: E402

_MODEL_KEYS = ("model", "model_path", "model_name", "pretrained")


class MigrationError(RuntimeError):
    """A record that cannot be converted (nothing was written)."""


@dataclass
class Plan:
    writes: dict = field(default_factory=dict)  # path -> converted record
    left: list = field(default_factory=list)  # "path: why" of records left as they are


def _valid_display(d: Any) -> bool:
    return isinstance(d, dict) and isinstance(d.get("display"), str)


def is_current(record: dict) -> bool:
    """Whether ``record`` (summary.json / results.json) has the current shape (module docstring)."""
    run = record.get("run")
    return (isinstance(run, dict) and (isinstance(run.get("config"), dict) or isinstance(run.get("released"), str))
            and _valid_display(record.get("display")))


def _display(variant: str, module: Optional[str], where: Path) -> dict:
    try:
        if module:
            import_variant_module(module)
        return display_record(variant)
    except ConfigError as e:
        raise MigrationError(f"{where}: the display record of variant {variant!r} comes from the residual registry, "
                             f"which does not know it here ({e}); run the migration where its module imports") from None


def convert_summary(path: Path, d: dict) -> dict:
    """The current-shape summary of an older one (the module docstring says how)."""
    old_run = d.get("run") if isinstance(d.get("run"), dict) else {}
    if isinstance(old_run.get("config"), dict):
        run = dict(old_run)
        residual = run.get("residual") or {}
        variant, module = residual.get("variant"), residual.get("module")
    else:
        cfg_p = path.parent / "config.yaml"
        try:
            cfg = recorded_run_config(read_yaml_file(cfg_p))
        except FileNotFoundError:
            raise MigrationError(f"{path}: an older summary without its run's config.yaml beside it; put the run's "
                                 "config.yaml back, then migrate") from None
        except Exception as e:  # unreadable file, YAML error, unknown key, ...
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise MigrationError(f"{cfg_p}: not a valid run config ({why}); fix it, then migrate") from None
        run = run_identity(cfg)
        for key, recorded in (("size", old_run.get("size", d.get("size"))),
                              ("seed", old_run.get("seed", d.get("seed")))):
            if recorded is not None and str(recorded) != str(run[key]):
                raise MigrationError(f"{path}: records {key} {recorded!r} but {cfg_p} says {run[key]!r}; the records "
                                     "of this run disagree: move it out of the results folder, then migrate")
        # what the tables read the run as before: its recorded label, pairing and identity
        label = old_run.get("label") or d.get("variant")
        if label:
            run["label"] = str(label)
        for key in ("pairing", "identity"):
            if old_run.get(key):
                run[key] = str(old_run[key])
        if not old_run.get("identity") and (old_run.get("identity_hash") or d.get("identity")):
            run["identity"] = str(old_run.get("identity_hash") or d.get("identity"))
        variant, module = cfg.model.residual.variant, cfg.model.residual.module
    display = next((x for x in (d.get("display"), old_run.get("display")) if _valid_display(x)), None)
    if display is None:
        display = _display(str(variant), module, path)
    return {**d, "run": run, "display": display}


def _model_run_dir(rp: Path, record: dict) -> Optional[Path]:
    """The run folder (holding summary.json) of the model a results.json names, as earlier readers traced it."""
    model = next((record[k] for k in _MODEL_KEYS if isinstance(record.get(k), str)), None)
    if model is None:
        return None
    c = Path(model.removeprefix("hf:"))
    if not c.is_absolute():  # relative to the working directory of the workflow that wrote it
        base = next((a for a in rp.parent.resolve().parents if (a / c).parent.is_dir()), None)
        c = (base / c) if base is not None else c
    return next((r for r in (c, c.parent) if (r / "summary.json").is_file()), None)


def plan_migration(results: str | Path) -> Plan:
    """Every conversion that brings the records under ``results`` to the current shape; MigrationError (one
    line) when one is not possible. Nothing is written here."""
    root = Path(results)
    plan = Plan()
    summaries: dict[Path, dict] = {}  # run folder -> its (converted) summary
    for path in sorted(root.rglob("summary.json")):
        d = read_json(path, MigrationError)
        if not isinstance(d, dict) or "tail_mean_val_loss" not in d:
            continue  # not a training run's summary
        if not is_current(d):
            d = plan.writes[path] = convert_summary(path, d)
        summaries[path.parent.resolve()] = d
    for rp in sorted(root.rglob("results.json")):
        d = read_json(rp, MigrationError)
        if not isinstance(d, dict) or is_current(d):
            continue
        run = d.get("run") if isinstance(d.get("run"), dict) else None
        if run is not None and (isinstance(run.get("config"), dict) or isinstance(run.get("released"), str)):
            res = run.get("residual") if isinstance(run.get("residual"), dict) else {}
            if not res.get("variant"):
                plan.left.append(f"{rp}: its run block names no residual variant")
                continue
            run_dir = _model_run_dir(rp, d)
            s = summaries.get(run_dir.resolve()) if run_dir is not None else None
            if s is not None and s["run"].get("residual", {}).get("variant") == res["variant"]:
                display = s["display"]  # its training run's (a user's variant need not import here)
            else:
                display = _display(str(res["variant"]), res.get("module"), rp)
            plan.writes[rp] = {**d, "display": display}
            continue
        run_dir = _model_run_dir(rp, d)
        if run_dir is None:
            why = ("it evaluated a model that records no training run" if "run" in d and d["run"] is None else
                   "the run folder of the model it names is not there")
            plan.left.append(f"{rp}: {why}")
            continue
        s = summaries.get(run_dir.resolve())
        if s is None:  # a run folder outside the results folder
            s = read_json(run_dir / "summary.json", MigrationError)
            if not isinstance(s, dict):
                plan.left.append(f"{rp}: {run_dir / 'summary.json'} is not a JSON object")
                continue
            s = s if is_current(s) else convert_summary(run_dir / "summary.json", s)
        plan.writes[rp] = {**d, "run": s["run"], "display": s["display"]}
    return plan


def migrate(results: str | Path, dry_run: bool = False) -> Plan:
    root = Path(results)
    if not root.is_dir():
        raise MigrationError(f"{root}: no such results folder (give --results DIR)")
    plan = plan_migration(root)
    if not dry_run:
        for path, d in plan.writes.items():
            atomic_write_text(path, json.dumps(d, indent=1))
    return plan


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/migrate_records.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--dry-run", action="store_true", help="print the conversions, change nothing")
    a = p.parse_args(argv)
    try:
        plan = migrate(a.results, a.dry_run)
    except MigrationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {os_error_line(e, 'migrating')}; run the migration again to finish", file=sys.stderr)
        return 2
    for path in plan.writes:
        print(f"{'would convert' if a.dry_run else 'converted'} {path}")
    for what in plan.left:
        print(f"left as it is: {what}")
    print(f"{len(plan.writes)} record(s) {'to convert' if a.dry_run else 'converted'}" if plan.writes else
          "nothing to convert: every record has the current shape")
    return 0


if __name__ == "__main__":
    sys.exit(main())
