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
from mhar.runs.config import identity_config, pairing_hash, recorded_run_config

from .common import AnalysisInputError, is_finite_number, read_json, read_mapping, read_yaml


@dataclass
class RunSummary:
    """One training run's ``summary.json`` (plus the residual head count)."""

    path: Path
    variant: str
    size: str
    seed: int
    pairing: str  # pairing hash (mhar.runs.config.pairing_hash); else the record's config_hash
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


def _display_record(d: Any) -> Optional[dict]:
    if not (isinstance(d, dict) and isinstance(d.get("display"), str)):
        return None
    out = {"display": d["display"], "order": int(d.get("order", 100)), "shows_heads": bool(d.get("shows_heads"))}
    if d.get("heads") is not None:
        out["heads"] = int(d["heads"])
    return out


def display_of(record: dict, variant: str, where: Any) -> Optional[dict]:
    """The variant's display record {display, order, shows_heads[, heads]}: the record's own ``display``
    (summary.json, or its ``run`` block), else the residual registry's (``mhar.model.residuals.display_record``);
    None when the registry does not know the variant (a user's module that is not importable here)."""
    run = record.get("run") if isinstance(record.get("run"), dict) else {}
    for d in (record.get("display"), run.get("display")):
        if _display_record(d) is not None:
            return _display_record(d)
    try:  # lazy: the registry imports torch, which the analysis environment lacks; recorded displays need neither
        from mhar.model.residuals import display_record
    except ImportError as e:
        raise AnalysisInputError(f"{where}: no 'display' record, and the residual registry that gives a variant's "
                                 f"display cannot be imported here ({e}); run the table where mhar imports "
                                 "(e.g. the eval environment), or re-record the run") from None
    try:
        return _display_record(display_record(variant))
    except ValueError:  # ConfigError: not registered
        return None


def residual_from_config(run_dir: Path) -> dict:
    """The run's resolved ``model.residual`` section from ``config.yaml`` ({} when absent)."""
    cfg = read_mapping(Path(run_dir) / "config.yaml")
    for keys in (("model", "residual"), ("residual",)):
        node: Any = cfg
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            return node
    return {}


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


def _config_identity(run_dir: Path, where: Path) -> Optional[dict]:
    """The identity config (mhar.runs.config.identity_config) of the run dir's config.yaml; None without one."""
    cfg_p = Path(run_dir) / "config.yaml"
    if not cfg_p.is_file():
        return None
    raw = read_yaml(cfg_p)
    try:
        return identity_config(recorded_run_config(raw))
    except ValueError as e:  # ConfigError
        raise AnalysisInputError(f"{cfg_p}: not a valid run config ({e}); the run cannot be identified") from None


def run_identity(record: dict, where: Path, run_dir: Optional[Path] = None) -> dict:
    """What run a record (summary.json / results.json) belongs to, from its ``run`` block, never from the path:
    {label, variant, heads, display, knobs, residual, size, seed, data_seed, identity, pairing, config,
    config_hash, where}.

    ``config`` is the run's identity config (``run.config``; else that of the run dir's config.yaml), None when
    neither is there (an evaluation record without it); then ``config_hash`` (the resolved config without
    residual section and seeds) and ``data_seed`` are all that pairing (mhar.runs.pairing) can check. Records
    without a ``run`` block are read from their flat keys and config.yaml's ``model.residual``."""
    run = record.get("run") if isinstance(record.get("run"), dict) else {}
    config = run.get("config") if isinstance(run.get("config"), dict) else None
    if config is None and run_dir is not None:
        config = _config_identity(run_dir, where)
    res = run.get("residual") if isinstance(run.get("residual"), dict) else {}
    if not res and config is not None:
        res = (config.get("model") or {}).get("residual") or {}
    if not res and run_dir is not None:
        res = residual_from_config(run_dir)
    label = run.get("label") or record.get("variant")
    size, seed = run.get("size", record.get("size")), run.get("seed", record.get("seed"))
    for k, v in (("variant (run.label)", label), ("size", size), ("seed", seed)):
        if v is None:
            raise AnalysisInputError(f"{where}: missing field {k!r} (neither the 'run' block nor the flat key; "
                                     "see docs/ARCHITECTURE.md 'Run directory')")
    variant = res.get("variant") or record.get("residual_variant")
    heads = res.get("heads") if res.get("heads") is not None else record.get("heads", record.get("residual_heads"))
    display = display_of(record, str(variant or label), where)
    if not variant:
        # a record without a residual section: its flat 'variant' (the run label) is the residual variant
        if display is None:
            raise AnalysisInputError(
                f"{where}: run label {label!r} is not a residual variant and neither the record's run.residual nor "
                "config.yaml with model.residual.variant is there; keep config.yaml beside summary.json")
        variant = label
    variant = str(variant)
    if display is None:  # a variant the registry here does not know: its run label, after the registered ones
        display = {"display": str(label), "order": 100, "shows_heads": False, "heads": heads}
    elif display["display"] == variant != label:  # a variant without a display name of its own: its run label
        display = {**display, "display": str(label)}
    if display.get("shows_heads"):
        if heads is None:
            raise AnalysisInputError(
                f"{where}: variant {variant!r} needs the routing head count, but neither run.residual.heads, the "
                "summary field 'heads' nor config.yaml: model.residual.heads is present")
    else:  # a head count the variant fixes (single-head routing: 1), or none
        heads = display.get("heads")
    data_seed = run.get("data_seed", seed)
    if config is not None:
        train_seed, cfg_data_seed = (config.get("train") or {}).get("seed"), (config.get("data") or {}).get("seed")
        if train_seed is not None and int(train_seed) != int(seed):
            raise AnalysisInputError(f"{where}: the record says seed {seed} but its config says train.seed "
                                     f"{train_seed}; the records of this run disagree: re-run the step that wrote it")
        data_seed = cfg_data_seed if cfg_data_seed is not None else data_seed
    pairing = str(run.get("pairing") or "") or (pairing_hash(config) if config else "")
    cfg_hash = str(run.get("config_hash") or record.get("config_hash") or "")
    return {"label": str(label), "variant": variant, "heads": None if heads is None else int(heads), "display": display,
            "knobs": residual_knobs(res), "residual": {k: v for k, v in res.items() if k != "routing_impl"},
            "size": str(size), "seed": int(seed), "data_seed": None if data_seed is None else int(data_seed),
            "identity": str(run.get("identity") or run.get("identity_hash") or record.get("identity") or ""),
            "pairing": pairing or cfg_hash, "config": config, "config_hash": cfg_hash, "where": str(where)}


_SUMMARY_NUMBERS = ("steps", "tokens", "wall_s", "flops", "params", "tokens_per_s", "peak_mem_gb", "tail_k")


def load_summary(path: str | os.PathLike) -> RunSummary:
    """Read ``summary.json`` (a file or a run directory holding one).

    The run's identity (label, residual config, size, seeds, identity config and pairing hash) comes from the
    summary's ``run`` block; a summary without one is read from its flat keys (``variant`` = the label,
    ``size``, ``seed``, ``config_hash``, ``heads``) and the run dir's ``config.yaml`` (see run_identity).
    Moving a run folder never changes what it is.
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
    ident = run_identity(d, p, p.parent)
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
    """Which run an eval dir belongs to: run_identity's dict plus ``model``.

    Read from the ``run`` block that ``eval.run`` copies from the model into each
    ``<task>/results.json``; results without it are traced to the run directory of the recorded model path
    (``model`` / ``model_path`` / ``pretrained``: the directory holding ``summary.json``). Never from
    the eval dir's own path.
    """
    root = Path(eval_dir)
    rps = sorted(root.glob("*/results.json"))
    if not rps:
        raise AnalysisInputError(f"{root}: no <task>/results.json; evaluate into this directory first "
                                 "(python -m eval.run ... --out DIR)")
    res = read_json(rps[0])
    res = res if isinstance(res, dict) else {}
    model = next((res[k] for k in ("model", "model_path", "model_name", "pretrained") if isinstance(res.get(k), str)),
                 None)
    c = run_dir = None
    if model is not None:
        c = Path(model.removeprefix("hf:"))
        if not c.is_absolute():  # relative to the working directory of the workflow that wrote it
            base = next((a for a in root.resolve().parents if (a / c).parent.is_dir()), None)
            c = (base / c) if base is not None else c
        run_dir = next((d for d in (c, c.parent) if (d / "summary.json").is_file()), None)
    if isinstance(res.get("run"), dict):
        run = res["run"]
        if run_dir is not None and _display_record(res.get("display")) is None and \
                _display_record(run.get("display")) is None:
            # the training run's display record, as its summary gives Table 1 (an eval record carries none;
            # the registry here may not know a user's variant): one name for the variant in every table
            summary = read_json(run_dir / "summary.json")
            summary = summary if isinstance(summary, dict) else {}
            variant_of = lambda r: ((r.get("run") or {}).get("residual") or {}).get("variant")  # noqa: E731
            shown = _display_record(summary.get("display")) if variant_of(summary) == variant_of(res) else None
            res = {**res, "display": shown} if shown is not None else res
        info = run_identity(res, rps[0])
        info["model"] = model
        return info
    if run_dir is not None:
        return {**load_summary(run_dir).ident, "model": str(c)}
    raise AnalysisInputError(
        f"{rps[0]}: cannot tell which run was evaluated: no 'run' block and no model path whose run directory "
        "holds summary.json; re-evaluate with the current eval.run (it records the run) or keep the run dir")

