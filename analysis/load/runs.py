"""Training runs as the tables read them: ``summary.json`` and the run's identity record (its residual knobs and
display record). Row labels and the grouping of runs into table rows are the table layer's
(``analysis.tables.rows``).

Which run a record belongs to is read from its ``run`` block, never from its path; the pairing rule itself
is :func:`mhar.runs.pairing.pairing_difference`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Optional

from mhar.model.config import ResidualConfig

from .common import AnalysisInputError, is_finite_number, read_json, read_mapping


@dataclass
class RunSummary:
    """One training run's ``summary.json`` (plus the residual head count)."""

    path: Path
    variant: str
    size: str
    seed: int
    pairing: str  # pairing hash (mhar.runs.config.pairing_hash; "released-<group>" for a released arm)
    heads: Optional[int]
    tail_mean_val_loss: float
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    steps: Optional[int] = None
    tokens: Optional[float] = None
    wall_s: Optional[float] = None
    flops: Optional[float] = None
    params: Optional[int] = None
    tokens_per_s: Optional[float] = None
    peak_mem_gb: Optional[float] = None
    name: str = ""  # the run's label, e.g. "mhar_h8"; variant is the residual variant
    tail_k: Optional[int] = None
    setup: dict = field(default_factory=dict)  # corpus, tokenizer, seq_len, hardware (from the run's records)
    knobs: tuple = ()  # residual knobs that differ from their defaults, ((name, value), ...) (see residual_knobs)
    ident: dict = field(default_factory=dict)  # the run's identity record (run_identity)

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    @property
    def group(self) -> tuple:
        """(variant, size, heads, knobs): the full residual config and the size. One group is one table row;
        its runs differ only by seed (checked by analysis.tables.rows.group_runs)."""
        return (self.variant, self.size, self.heads, self.knobs)

    @property
    def display(self) -> dict:
        """The variant's display record (display name, table order, whether its head count shows)."""
        return self.ident["display"]


def residual_knobs(residual: dict) -> tuple:
    """((name, value), ...) of the residual knobs that differ from mhar.model.config.ResidualConfig's defaults, besides
    the variant, its heads (shown as H=, and meaningless for variants without routing heads), routing_impl
    (execution, not identity) and module (where a variant outside mhar.model.residuals is defined: it names the
    variant's code, not a setting of it; the run label shows that variant). Two runs whose knobs differ are two rows."""
    defaults = {f.name: f.default for f in fields(ResidualConfig)}
    return tuple((k, residual[k]) for k in sorted(residual) if k not in ("variant", "heads", "routing_impl", "module")
                 and k in defaults and residual[k] != defaults[k])


# The one command that converts the records of earlier harness versions (the readers name it when they refuse one).
MIGRATE_RECORDS = "python scripts/migrate_records.py --results RESULTS_DIR"


def _old_record(where: Any, what: str) -> AnalysisInputError:
    return AnalysisInputError(f"{where}: a record of an earlier harness version ({what}); convert it once with "
                              f"`{MIGRATE_RECORDS}`")


def display_of(record: dict) -> Optional[dict]:
    """The display record {display, order, shows_heads[, heads]} the record carries (``display``: written by
    the trainer into summary.json, by ``eval.run`` into results.json, by ``eval.probe`` into its JSON, from the
    variant's class attributes); None when it has none."""
    d = record.get("display")
    if not (isinstance(d, dict) and isinstance(d.get("display"), str)):
        return None
    out = {"display": d["display"], "order": int(d.get("order", 100)), "shows_heads": bool(d.get("shows_heads"))}
    if d.get("heads") is not None:
        out["heads"] = int(d["heads"])
    return out


def run_setup(run_dir: Path) -> dict:
    """What the report's setup section needs from a run's records: corpus, tokenizer, sequence length
    (config.yaml ``data``) and hardware (provenance.json ``hardware``); missing entries are left out."""
    cfg = read_mapping(Path(run_dir) / "config.yaml")
    data = cfg.get("data") if isinstance(cfg.get("data"), dict) else {}
    out = {k: data[k] for k in ("corpus", "tokenizer", "seq_len") if data.get(k) is not None}
    prov_p = Path(run_dir) / "provenance.json"
    if prov_p.is_file():
        try:
            hw = (json.loads(prov_p.read_text()) or {}).get("hardware") or {}
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            hw = {}
        gpus = [g.get("name") for g in hw.get("gpus") or [] if isinstance(g, dict)]
        if gpus:
            out["hardware"] = f"{len(gpus)}x {gpus[0]}"
        elif hw.get("cpu"):
            out["hardware"] = f"CPU {hw['cpu']}"
    return out


def is_released(run: dict) -> bool:
    """A released checkpoint's run block (workflow/scripts/import_released.py): never trained here, so no
    ``config``; it pairs by its declared ``pairing`` ("released-<group>")."""
    return isinstance(run.get("released"), str)


def run_identity(record: dict, where: Any) -> dict:
    """What run a record (summary.json / results.json) belongs to, from its ``run`` block and ``display`` record,
    never from the path: {label, variant, heads, display, knobs, residual, size, seed, data_seed, identity,
    pairing, config, where}.

    One record shape, the current one: ``run`` = :func:`mhar.runs.config.run_identity` (label, residual, size,
    seed, data_seed, identity, pairing, config), or a released checkpoint's block (``released``, no config), and
    ``display``. A record without them (an earlier harness version's) is refused with one line naming the file
    and the script that converts it."""
    run = record.get("run")
    if not isinstance(run, dict):
        raise _old_record(where, "no 'run' block")
    config = run.get("config") if isinstance(run.get("config"), dict) else None
    if config is None and not is_released(run):
        raise _old_record(where, "its 'run' block has no 'config'")
    display = display_of(record)
    if display is None:
        raise _old_record(where, "no 'display' record")
    res = run.get("residual")
    for k, v in (("label", run.get("label")), ("residual.variant", isinstance(res, dict) and res.get("variant")),
                 ("size", run.get("size")), ("seed", run.get("seed")), ("pairing", run.get("pairing")),
                 ("identity", run.get("identity"))):
        if v is None or v is False or v == "":
            raise AnalysisInputError(f"{where}: missing field 'run.{k}' (see docs/ARCHITECTURE.md 'Run directory'); "
                                     "the record is damaged: re-run the step that wrote it")
    label, variant, seed = str(run["label"]), str(res["variant"]), run["seed"]
    heads = res.get("heads")
    if display["display"] == variant != label:  # a variant without a display name of its own: its run label
        display = {**display, "display": label}
    if display.get("shows_heads"):
        if heads is None:
            raise AnalysisInputError(f"{where}: variant {variant!r} needs the routing head count, but "
                                     "run.residual.heads is missing; re-run the step that wrote it")
    else:  # a head count the variant fixes (single-head routing: 1), or none
        heads = display.get("heads")
    data_seed = run.get("data_seed")
    if config is not None:
        train_seed, data_seed = (config.get("train") or {}).get("seed"), (config.get("data") or {}).get("seed")
        if train_seed is not None and int(train_seed) != int(seed):
            raise AnalysisInputError(f"{where}: the record says seed {seed} but its config says train.seed "
                                     f"{train_seed}; the records of this run disagree: re-run the step that wrote it")
    return {"label": label, "variant": variant, "heads": None if heads is None else int(heads), "display": display,
            "knobs": residual_knobs(res), "residual": {k: v for k, v in res.items() if k != "routing_impl"},
            "size": str(run["size"]), "seed": int(seed), "data_seed": None if data_seed is None else int(data_seed),
            "identity": str(run["identity"]), "pairing": str(run["pairing"]), "config": config, "where": str(where)}


_SUMMARY_NUMBERS = ("steps", "tokens", "wall_s", "flops", "params", "tokens_per_s", "peak_mem_gb", "tail_k")


def load_summary(path: str | os.PathLike) -> RunSummary:
    """Read ``summary.json`` (a file or a run directory holding one).

    The run's identity (label, residual config, size, seeds, identity config and pairing hash) comes from the
    summary's ``run`` block and its display from ``display`` (see run_identity): moving a run folder never
    changes what it is.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    d = read_json(p)
    if not isinstance(d, dict):
        raise AnalysisInputError(f"{p}: expected a JSON object")
    if d.get("tail_mean_val_loss") is None:
        raise AnalysisInputError(f"{p}: missing field 'tail_mean_val_loss' (see docs/ARCHITECTURE.md 'Run directory')")
    bad = [f"{k}={d[k]!r}" for k in ("tail_mean_val_loss", "final_val_loss") if d.get(k) is not None
           and not is_finite_number(d[k])]
    bad += [f"val_losses[{i}]={v!r}" for i, v in enumerate(d.get("val_losses") or [])
            if isinstance(v, (list, tuple)) and len(v) == 2 and not is_finite_number(v[1])]
    bad += [f"{k}={d[k]!r}" for k in _SUMMARY_NUMBERS if d.get(k) is not None and not is_finite_number(d[k])]
    if bad:
        raise AnalysisInputError(f"{p}: non-finite {', '.join(bad[:3])} (not a finite number: a diverged or damaged "
                                 "run); a table cannot compare it: retrain it or leave it out of the inputs")
    ident = run_identity(d, p)
    try:
        vl = [(int(s), float(v)) for s, v in d.get("val_losses") or []]
    except (TypeError, ValueError):
        raise AnalysisInputError(f"{p}: field 'val_losses' must be [[step, loss], ...]") from None

    def opt(k: str, tp=float):
        v = d.get(k)
        return None if v is None else tp(v)

    return RunSummary(path=p, variant=ident["variant"], size=ident["size"], seed=ident["seed"],
                      pairing=ident["pairing"], heads=ident["heads"], knobs=ident["knobs"], ident=ident,
                      tail_mean_val_loss=float(d["tail_mean_val_loss"]), val_losses=vl, steps=opt("steps", int),
                      tokens=opt("tokens"), wall_s=opt("wall_s"), flops=opt("flops"), params=opt("params", int),
                      tokens_per_s=opt("tokens_per_s"), peak_mem_gb=opt("peak_mem_gb"), name=ident["label"],
                      tail_k=opt("tail_k", int), setup=run_setup(p.parent))


def load_summaries(paths: Iterable[str | os.PathLike]) -> list[RunSummary]:
    runs = [load_summary(p) for p in paths]
    seen: dict[tuple, Path] = {}
    for r in runs:
        key = (*r.group, r.seed, r.ident.get("identity") or r.pairing)
        if key in seen:
            raise AnalysisInputError(f"{r.path} and {seen[key]} are the same run ({r.name} {r.size} seed {r.seed}, "
                                     f"identity {key[-1] or '-'}); pass each run once")
        seen[key] = r.path
    return runs


def describe_run(ident: dict, where: Any) -> str:
    """'<label> (<size>, seed k, <where>)' for error lines."""
    return f"{ident['label']} ({ident['size']}, seed {ident['seed']}, {where})"


def identify_eval(eval_dir: str | os.PathLike) -> dict:
    """Which run an eval dir belongs to: run_identity's dict plus ``model``, read from the ``run`` block and
    ``display`` record that ``eval.run`` copies from the model into each ``<task>/results.json``; never from
    the eval dir's own path."""
    root = Path(eval_dir)
    rps = sorted(root.glob("*/results.json"))
    if not rps:
        raise AnalysisInputError(f"{root}: no <task>/results.json; evaluate into this directory first "
                                 "(python -m eval.run ... --out DIR)")
    res = read_json(rps[0])
    res = res if isinstance(res, dict) else {}
    model = res.get("model") if isinstance(res.get("model"), str) else None
    if "run" in res and res["run"] is None and (model or "").startswith("hf:"):
        raise AnalysisInputError(f"{rps[0]}: evaluated from {model}, a model that records no training run, so no "
                                 "table can pair it; evaluate a model.pt (mhar.train's export, or import-hf with its "
                                 "run record)")
    info = run_identity(res, rps[0])
    info["model"] = model
    return info
