"""Loading helpers for the analysis stage: run summaries, metrics, eval samples, bench CSVs,
published numbers, and provenance of generated tables/figures.

Formats are the contract in docs/ARCHITECTURE.md ("Run directory", "Evaluation outputs").
Every loader fails with a message that names the file and the field and says what to do.
"""
from __future__ import annotations

import functools
import json
import math
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from mhar.runs.atomic import read_json

PUBLISHED_CSV = Path(__file__).with_name("published.csv")
PAPER_SCALES = ("100M", "350M", "1B")
# Display metadata of the built-in variants (mhar.model.residuals); a variant not listed here (a new or a user's own)
# is shown under its run label and keeps its recorded head count, so no edit is needed for it.
# Built-in variants whose routing head count H is part of their identity (attnres is H=1, the others have none).
HEADED_VARIANTS = ("mhar", "mhar_delta")
# what the paper calls each built-in variant (tables show both)
DISPLAY = {"baseline": "baseline", "hyper": "hyper-conn", "attnres": "single-head (AttnRes)",
           "block_attnres": "Block AttnRes", "mhar": "MHAR", "mhar_hw": "MHAR-HW", "mhar_delta": "MHAR-delta"}


class AnalysisInputError(ValueError):
    """An input file of the analysis stage is missing or malformed (message names file and field)."""


# --- run summaries ------------------------------------------------------------------------------
@dataclass
class RunSummary:
    """One training run's ``summary.json`` (plus the residual head count)."""

    path: Path
    variant: str
    size: str
    seed: int
    pairing: str  # pairing hash (mhar.runs.config.pairing_hash); an older record's config_hash
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
        its runs differ only by seed (checked by group_runs)."""
        return (self.variant, self.size, self.heads, self.knobs)

    @property
    def label(self) -> str:
        return variant_label(self.variant, self.heads, self.knobs, self.name)


def residual_knobs(residual: dict) -> tuple:
    """((name, value), ...) of the residual knobs that differ from mhar.model.config.ResidualConfig's defaults, besides
    the variant, its heads (shown as H=, and meaningless for variants without routing heads), routing_impl
    (execution, not identity) and module (where a variant outside mhar.model.residuals is defined: it names the
    variant's code, not a setting of it; the run label shows that variant). Two runs whose knobs differ are two rows."""
    from dataclasses import fields

    from mhar.model.config import ResidualConfig

    defaults = {f.name: f.default for f in fields(ResidualConfig)}
    return tuple((k, residual[k]) for k in sorted(residual) if k not in ("variant", "heads", "routing_impl", "module")
                 and k in defaults and residual[k] != defaults[k])


def shown_knobs(keys: Iterable[tuple], by_variant: bool = True) -> dict[tuple, tuple]:
    """For group keys (variant, size, heads, knobs): the knobs each row names, i.e. every knob that is off its
    default in some row of the same variant (of any variant with ``by_variant=False``), with this row's value,
    so two rows that differ in a knob both show it (hyper_n=2 and hyper_n=4)."""
    from dataclasses import fields

    from mhar.model.config import ResidualConfig

    keys = list(keys)
    defaults = {f.name: f.default for f in fields(ResidualConfig)}
    names: dict[str, set] = {}
    for k in keys:
        names.setdefault(k[0] if by_variant else "", set()).update(n for n, _ in k[3])
    return {k: tuple((n, dict(k[3]).get(n, defaults.get(n))) for n in sorted(names[k[0] if by_variant else ""]))
            for k in keys}


def knobs_text(knobs: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs)


def variant_label(variant: str, heads: Optional[int], knobs: tuple = (), label: Optional[str] = None) -> str:
    """Display name: the paper's name of a built-in variant (with H for the headed ones); any other variant
    shows its run ``label`` (else its name, with H when recorded); then the knobs off their defaults."""
    if variant in DISPLAY:
        name = DISPLAY[variant]
        name = f"{name} H={heads}" if variant in HEADED_VARIANTS and heads is not None else name
    else:
        name = label or (f"{variant} H={heads}" if heads is not None else variant)
    return f"{name} ({knobs_text(knobs)})" if knobs else name


_read_json = functools.partial(read_json, error=AnalysisInputError)  # mhar.runs.atomic.read_json


def read_yaml(path: str | os.PathLike) -> Any:
    """A YAML (or JSON) file, safely: a tag that would build a Python object (``!!python/...``) is refused,
    never executed; malformed YAML is one AnalysisInputError line naming the file and the place."""
    import yaml

    from mhar.runs.config import yaml_error_line

    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise AnalysisInputError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise AnalysisInputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        raise AnalysisInputError(f"{path}: not valid YAML: {yaml_error_line(e)}") from None


def _yaml(path: Path) -> dict:
    """A YAML mapping ({} when the file is absent); malformed YAML is an AnalysisInputError."""
    if not path.is_file():
        return {}
    d = read_yaml(path) or {}
    return d if isinstance(d, dict) else {}


def residual_from_config(run_dir: Path) -> dict:
    """The run's resolved ``model.residual`` section from ``config.yaml`` ({} when absent)."""
    cfg = _yaml(Path(run_dir) / "config.yaml")
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
    cfg = _yaml(Path(run_dir) / "config.yaml")
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
    from mhar.runs.config import identity_config, recorded_run_config

    raw = read_yaml(cfg_p)
    try:
        return identity_config(recorded_run_config(raw))
    except ValueError as e:  # ConfigError
        raise AnalysisInputError(f"{cfg_p}: not a valid run config ({e}); the run cannot be identified") from None


def run_identity(record: dict, where: Path, run_dir: Optional[Path] = None) -> dict:
    """What run a record (summary.json / results.json) belongs to, from its ``run`` block, never from the path:
    {label, variant, heads, knobs, residual, size, seed, data_seed, identity, pairing, config, legacy, where}.

    ``config`` is the run's identity config (``run.config``; for older records, that of the run dir's
    config.yaml), None when neither is there (an older evaluation record); then ``legacy`` (the older
    ``config_hash``: the resolved config without residual section and seeds) and ``data_seed`` are all that
    pairing can check. Older records fall back to the flat keys and config.yaml's ``model.residual``."""
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
    if not variant:
        # Records from before run labels: the flat 'variant' was the residual variant, always a built-in one.
        if label not in DISPLAY:
            raise AnalysisInputError(
                f"{where}: run label {label!r} is not a residual variant ({', '.join(DISPLAY)}) and neither "
                "the record's run.residual nor config.yaml with model.residual.variant is there; keep config.yaml "
                "beside summary.json")
        variant = label
    variant = str(variant)
    heads = res.get("heads") if res.get("heads") is not None else record.get("heads", record.get("residual_heads"))
    if heads is None and variant in HEADED_VARIANTS:
        raise AnalysisInputError(
            f"{where}: variant {variant!r} needs the routing head count, but neither run.residual.heads, the "
            "summary field 'heads' nor config.yaml: model.residual.heads is present")
    if variant == "attnres":
        heads = 1
    elif variant in DISPLAY and variant not in HEADED_VARIANTS:
        heads = None
    data_seed = run.get("data_seed", seed)
    if config is not None:
        train_seed, cfg_data_seed = (config.get("train") or {}).get("seed"), (config.get("data") or {}).get("seed")
        if train_seed is not None and int(train_seed) != int(seed):
            raise AnalysisInputError(f"{where}: the record says seed {seed} but its config says train.seed "
                                     f"{train_seed}; the records of this run disagree: re-run the step that wrote it")
        data_seed = cfg_data_seed if cfg_data_seed is not None else data_seed
    from mhar.model.config import config_hash
    from mhar.runs.config import IDENTITY_LEN, pairing_config

    pairing = str(run.get("pairing") or "") or (config_hash(pairing_config(config), IDENTITY_LEN) if config else "")
    legacy = str(run.get("config_hash") or record.get("config_hash") or "")
    return {"label": str(label), "variant": variant, "heads": None if heads is None else int(heads),
            "knobs": residual_knobs(res), "residual": {k: v for k, v in res.items() if k != "routing_impl"},
            "size": str(size), "seed": int(seed), "data_seed": None if data_seed is None else int(data_seed),
            "identity": str(run.get("identity") or run.get("identity_hash") or record.get("identity") or ""),
            "pairing": pairing or legacy, "config": config, "legacy": legacy, "where": str(where)}


def _short(v: Any) -> str:
    t = json.dumps(v, default=str) if not isinstance(v, str) else repr(v)
    return t if len(t) <= 60 else t[:57] + "..."


def pairing_difference(a: dict, b: dict, ignore: Sequence[str] = ()) -> Optional[str]:
    """None when runs ``a`` and ``b`` (run_identity dicts) may be paired: their resolved configs differ in the
    residual section (mhar.runs.config.PAIRING_VARIES) and ``ignore`` alone. Otherwise the first field that
    differs, as 'field (value of a vs value of b)'. Two records without ``run.config`` that declare a
    ``run.pairing`` (released checkpoints' arms, never trained here) pair when size, seeds and pairing agree."""
    from mhar.runs.config import PAIRING_VARIES, first_difference

    skip = tuple(PAIRING_VARIES) + tuple(ignore)
    if a["config"] is not None and b["config"] is not None:
        d = first_difference(a["config"], b["config"], ignore=skip)
        return None if d is None else f"{d[0]} ({_short(d[1])} vs {_short(d[2])})"
    checks = [("size", a["size"], b["size"])]
    if "train.seed" not in skip:
        checks.append(("seed", a["seed"], b["seed"]))
    if "data.seed" not in skip:
        checks.append(("data seed", a["data_seed"], b["data_seed"]))
    for name, va, vb in checks:
        if va != vb:
            return f"{name} ({_short(va)} vs {_short(vb)})"
    if a["config"] is None and b["config"] is None:
        if not a["legacy"] and not b["legacy"] and a["pairing"] and b["pairing"]:
            # arms that were never trained here (released checkpoints: run.pairing "released-<group>", no
            # run.config): they pair as their run blocks declare, within the size and seed checked above
            if a["pairing"] != b["pairing"]:
                return f"pairing ({_short(a['pairing'])} vs {_short(b['pairing'])})"
            return None
        if a["legacy"] and b["legacy"] and a["legacy"] != b["legacy"]:
            return (f"config_hash ({a['legacy']} vs {b['legacy']}; older records: the resolved config without the "
                    "residual section and seeds)")
        if a["legacy"] and b["legacy"]:
            return None
    old = a if a["config"] is None else b
    return (f"an unknown part of the resolved config ({old['where']} is an older record without run.config, "
            "so the pairing cannot be checked; re-evaluate it with the current eval.run)")


def is_finite_number(v: Any) -> bool:
    """A real, finite number (not a string such as "NaN", not None, not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_SUMMARY_NUMBERS = ("steps", "tokens", "wall_s", "flops", "params", "tokens_per_s", "peak_mem_gb", "tail_k")


def load_summary(path: str | os.PathLike) -> RunSummary:
    """Read ``summary.json`` (a file or a run directory holding one).

    The run's identity (label, residual config, size, seeds, identity config and pairing hash) comes from the
    summary's ``run`` block; older summaries fall back to the flat keys (``variant`` = the label,
    ``size``, ``seed``, ``config_hash``, ``heads``) and the run dir's ``config.yaml`` (see run_identity).
    Moving a run folder never changes what it is.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    d = _read_json(p)
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
            raise AnalysisInputError(f"{r.path} and {seen[key]} are the same run ({r.label} {r.size} seed {r.seed}, "
                                     f"identity {key[-1] or '-'}); pass each run once")
        seen[key] = r.path
    return runs


def describe_run(ident: dict, where: Any) -> str:
    """'<label> (<size>, seed k, <where>)' for error lines."""
    return f"{ident['label']} ({ident['size']}, seed {ident['seed']}, {where})"


def check_row(members: Sequence[tuple[dict, Any]]) -> None:
    """The runs of one table row (same residual config and size) must differ only by their seeds; otherwise one
    AnalysisInputError naming two runs and the first field that differs."""
    (i0, w0), rest = members[0], members[1:]
    for i, w in rest:
        diff = pairing_difference(i0, i, ignore=("train.seed", "data.seed"))
        if diff is not None:
            raise AnalysisInputError(f"{describe_run(i0, w0)} and {describe_run(i, w)} are runs of one row "
                                     f"({variant_label(i0['variant'], i0['heads'], i0['knobs'])}) but their resolved "
                                     f"configs differ in {diff}; a row pools seeds of one config only: pass "
                                     "runs of one config")


def group_runs(runs: Sequence[RunSummary]) -> dict[tuple, dict[int, RunSummary]]:
    """{(residual variant, size, heads, knobs): {seed: run}}; the runs of a group differ only by seed."""
    out: dict[tuple, dict[int, RunSummary]] = {}
    for r in runs:
        g = out.setdefault(r.group, {})
        if r.seed in g:
            o = g[r.seed]
            diff = pairing_difference(o.ident, r.ident, ignore=()) or "nothing (the same config twice)"
            raise AnalysisInputError(
                f"{r.path} and {o.path}: two runs of {r.label} {r.size} seed {r.seed} (labels {r.name!r} vs "
                f"{o.name!r}) whose resolved configs differ in {diff}; pass one run per seed and residual config")
        g[r.seed] = r
    for g in out.values():
        check_row([(r.ident, r.run_dir) for _, r in sorted(g.items())])
    return out


def _jsonl_rows(path: Path) -> Iterable[tuple[int, Any]]:
    """(line number, parsed row) of each non-blank line of a JSONL file."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as e:
            raise AnalysisInputError(f"{path}:{i}: not valid JSON ({e})") from None


_METRIC_NUMBERS = {"val": ("step", "val_loss", "tokens", "wall_s", "flops"), "train": ("step", "loss", "tokens")}


def load_metrics(run_dir: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """(train lines, val lines) of ``metrics.jsonl``; empty lists if the file is absent. A loss, step or
    counter that is not a finite number (``NaN``, ``"NaN"``) is an AnalysisInputError naming the line."""
    p = Path(run_dir) / "metrics.jsonl"
    if not p.is_file():
        return [], []
    train, val = [], []
    for i, d in _jsonl_rows(p):
        if not isinstance(d, dict):
            raise AnalysisInputError(f"{p}:{i}: expected a JSON object per line")
        split = "val" if d.get("split") == "val" else "train"
        for k in _METRIC_NUMBERS[split]:
            if k in d and not is_finite_number(d[k]):
                raise AnalysisInputError(f"{p}:{i}: {k}={d[k]!r} is not a finite number (a diverged or damaged "
                                         "run); retrain it or leave it out of the inputs")
        (val if split == "val" else train).append(d)
    return train, val


def val_curve(run: RunSummary) -> dict[str, np.ndarray]:
    """Validation curve with compute axes: arrays step, loss, wall_s, flops, tokens.

    Uses ``metrics.jsonl`` val lines when present; otherwise ``summary.val_losses`` with
    wall-clock/FLOPs/tokens interpolated linearly in step from the run totals.
    """
    _, val = load_metrics(run.run_dir)
    if val:
        rows = sorted(val, key=lambda d: d["step"])
        get = lambda k: np.array([float(d.get(k, np.nan)) for d in rows])  # noqa: E731
        return {"step": get("step"), "loss": get("val_loss"), "wall_s": get("wall_s"),
                "flops": get("flops"), "tokens": get("tokens")}
    if not run.val_losses:
        raise AnalysisInputError(f"{run.path}: no validation curve (neither metrics.jsonl val lines nor val_losses)")
    step = np.array([s for s, _ in run.val_losses], float)
    loss = np.array([v for _, v in run.val_losses], float)
    total = float(run.steps or step.max() or 1)
    frac = step / total
    scale = lambda tot: frac * tot if tot is not None else np.full_like(frac, np.nan)  # noqa: E731
    return {"step": step, "loss": loss, "wall_s": scale(run.wall_s), "flops": scale(run.flops),
            "tokens": scale(run.tokens)}


# --- evaluation outputs -------------------------------------------------------------------------------
@dataclass
class EvalTask:
    """One task of one evaluated model: per-document metrics keyed by doc_id."""

    task: str
    path: Path
    docs: dict[Any, dict]  # doc_id -> {"prompt_hash": str|None, "metrics": {name: value}}
    results: dict

    def metric_names(self) -> list[str]:
        names: list[str] = []
        for d in self.docs.values():
            for k in d["metrics"]:
                if k not in names:
                    names.append(k)
        return names


# Document field that groups related questions (clustered standard errors): several HellaSwag items
# come from one ActivityNet / WikiHow source. A sample's own "group"/"cluster" field takes precedence.
CLUSTER_FIELDS = {"hellaswag": "source_id"}


def eval_tasks(eval_dir: str | os.PathLike) -> list[str]:
    """Tasks with a samples.jsonl under EVAL_DIR."""
    root = Path(eval_dir)
    if not root.is_dir():
        raise AnalysisInputError(f"{root}: eval directory not found (run `python -m eval.run ... --out {root}`)")
    return sorted(p.parent.name for p in root.glob("*/samples.jsonl"))


def _bad_metric(v: Any) -> Optional[str]:
    """Why a per-document metric value is unusable (None when it is a finite number or [loglik, weight])."""
    if isinstance(v, (list, tuple)):
        if not v:
            return "an empty list"
        for x in v:
            why = _bad_metric(x)
            if why:
                return why
        return None
    if isinstance(v, bool):
        return None  # 0/1 scores stored as booleans
    if isinstance(v, (int, float)):
        return None if math.isfinite(v) else "not finite"
    return "not a number"


def _expected_docs(results: dict, rp: Path) -> tuple[Optional[list], Optional[int], str]:
    """(the recorded doc ids, or None; the recorded count, or None; where it was read) of a results.json."""
    ids = results.get("doc_ids")
    if isinstance(ids, list):
        return ids, len(ids), f"{rp} doc_ids"
    n = results.get("n")
    if isinstance(n, int) and not isinstance(n, bool):
        return None, n, f"{rp} n"
    total, sub = results.get("n_docs_total"), results.get("subset")
    spec = sub.get("spec") if isinstance(sub, dict) else sub
    if isinstance(total, int) and spec in (None, "full"):
        return None, total, f"{rp} n_docs_total"
    return None, None, ""


def load_eval_task(eval_dir: str | os.PathLike, task: str) -> EvalTask:
    """One task's per-document records, validated before any use: each doc_id once, every metric a finite
    number, and the documents those that ``results.json`` records (``doc_ids``; else its count ``n``, the
    subset / ``--limit`` it was run with). Anything else is one AnalysisInputError naming the file and the
    first bad record."""
    d = Path(eval_dir) / task
    sp = d / "samples.jsonl"
    if not sp.is_file():
        raise AnalysisInputError(f"{sp}: missing; evaluate task {task!r} into {eval_dir} first")
    redo = f"re-run the evaluation of {task!r} (python -m eval.run ... --out {eval_dir})"
    docs: dict[Any, dict] = {}
    lines: dict[Any, int] = {}
    for i, rec in _jsonl_rows(sp):
        if not isinstance(rec, dict) or "doc_id" not in rec or not isinstance(rec.get("metrics"), dict):
            raise AnalysisInputError(f"{sp}:{i}: each line needs 'doc_id' and a 'metrics' object")
        doc_id = rec["doc_id"]
        if not isinstance(doc_id, (int, str)) or isinstance(doc_id, bool):
            raise AnalysisInputError(f"{sp}:{i}: doc_id {doc_id!r} is not an integer or string; {redo}")
        if doc_id in lines:
            raise AnalysisInputError(f"{sp}:{i}: doc_id {doc_id!r} appears again (first on line {lines[doc_id]}); "
                                     f"each document is recorded once, so the file is damaged: {redo}")
        lines[doc_id] = i
        for name, v in rec["metrics"].items():
            why = _bad_metric(v)
            if why:
                raise AnalysisInputError(f"{sp}:{i}: doc_id {doc_id!r} metric {name!r} = {v!r} is {why}; a "
                                         f"damaged or failed evaluation cannot be compared: {redo}")
        group = rec.get("group", rec.get("cluster"))
        if group is None and task in CLUSTER_FIELDS and isinstance(rec.get("doc"), dict):
            group = rec["doc"].get(CLUSTER_FIELDS[task])
        # the all-arguments hash (``arguments_hash``; older files stored it as ``prompt_hash``)
        docs[doc_id] = {"prompt_hash": rec.get("arguments_hash", rec.get("prompt_hash")),
                        "metrics": rec["metrics"], "group": group}
    rp = d / "results.json"
    results = _read_json(rp) if rp.is_file() else {}
    if not isinstance(results, dict):
        raise AnalysisInputError(f"{rp}: expected a JSON object")
    want_ids, want_n, src = _expected_docs(results, rp)
    if want_ids is not None and set(want_ids) != set(docs):
        missing = [k for k in want_ids if k not in docs]
        extra = [k for k in docs if k not in set(want_ids)]
        what = (f"{len(missing)} recorded document(s) are missing (first: doc_id {missing[0]!r})" if missing else
                f"{len(extra)} document(s) are not in the recorded selection (first: doc_id {extra[0]!r}, line "
                f"{lines[extra[0]]})")
        raise AnalysisInputError(f"{sp}: {what}; {src} lists {len(want_ids)}, the file holds {len(docs)}: {redo}")
    if want_n is not None and want_n != len(docs):
        raise AnalysisInputError(f"{sp}: holds {len(docs)} documents, {src} records {want_n}: the file is incomplete "
                                 f"or damaged: {redo}")
    return EvalTask(task=task, path=sp, docs=docs, results=results)


def align(a: EvalTask, b: EvalTask) -> list:
    """The doc_ids of a pair, in a's order: both sides must hold the same documents (a pair is never
    reduced to the documents they happen to share) and agree on the prompt hash where both record it."""
    common = [k for k in a.docs if k in b.docs]
    if not common:
        raise AnalysisInputError(f"{a.path} and {b.path} share no doc_id; were they evaluated on the same subset?")
    only_a = [k for k in a.docs if k not in b.docs]
    only_b = [k for k in b.docs if k not in a.docs]
    if only_a or only_b:
        side, k = (a.path, only_a[0]) if only_a else (b.path, only_b[0])
        raise AnalysisInputError(
            f"{a.path} vs {b.path}: the pair holds different documents ({len(only_a)} only in the first, {len(only_b)} "
            f"only in the second; first: doc_id {k!r} in {side}); evaluate both on the same subset (--limit / "
            "--subset) and re-run the incomplete one")
    bad = [k for k in common if a.docs[k]["prompt_hash"] and b.docs[k]["prompt_hash"]
           and a.docs[k]["prompt_hash"] != b.docs[k]["prompt_hash"]]
    if bad:
        raise AnalysisInputError(f"{a.path} vs {b.path}: prompt_hash differs for doc_id(s) {bad[:5]}; the two "
                                 "evaluations used different prompts (task version / few-shot seed); re-run one")
    return common


def _metric(rec: dict, name: str):
    m = rec["metrics"]
    if name in m:
        return m[name]
    for k, v in m.items():  # lm-eval style "exact_match,strict-match"
        if k.split(",")[0] == name:
            return v
    raise KeyError(name)


def metric_arrays(task: EvalTask, name: str, doc_ids: Sequence) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Per-document values of metric ``name``: (values, None) for scalar scores, or
    (loglikelihoods, weights) when the metric is stored as [loglik, weight] (perplexities)."""
    vals = []
    for k in doc_ids:
        try:
            vals.append(_metric(task.docs[k], name))
        except KeyError:
            raise AnalysisInputError(f"{task.path}: doc_id {k!r} has no metric {name!r} "
                                     f"(available: {list(task.docs[k]['metrics'])})") from None
    if vals and isinstance(vals[0], (list, tuple)):
        arr = np.asarray(vals, float)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise AnalysisInputError(f"{task.path}: metric {name!r} must be a number or [loglik, weight]")
        return arr[:, 0], arr[:, 1]
    return np.asarray(vals, float), None


def identify_eval(eval_dir: str | os.PathLike) -> dict:
    """Which run an eval dir belongs to: run_identity's dict plus ``model``.

    Read from the ``run`` block that ``eval.run`` copies from the model into each
    ``<task>/results.json``; older results fall back to the run directory of the recorded model path
    (``model`` / ``model_path`` / ``pretrained``: the directory holding ``summary.json``). Never from
    the eval dir's own path.
    """
    root = Path(eval_dir)
    rps = sorted(root.glob("*/results.json"))
    if not rps:
        raise AnalysisInputError(f"{root}: no <task>/results.json; evaluate into this directory first "
                                 "(python -m eval.run ... --out DIR)")
    res = _read_json(rps[0])
    res = res if isinstance(res, dict) else {}
    model = next((res[k] for k in ("model", "model_path", "model_name", "pretrained") if isinstance(res.get(k), str)),
                 None)
    if isinstance(res.get("run"), dict):
        info = run_identity(res, rps[0])
        info["model"] = model
        return info
    if model is not None:
        c = Path(model.removeprefix("hf:"))
        if not c.is_absolute():  # relative to the working directory of the workflow that wrote it
            base = next((a for a in root.resolve().parents if (a / c).parent.is_dir()), None)
            c = (base / c) if base is not None else c
        for run_dir in (c, c.parent):
            if (run_dir / "summary.json").is_file():
                s = load_summary(run_dir)
                return {**s.ident, "model": str(c)}
    raise AnalysisInputError(
        f"{rps[0]}: cannot tell which run was evaluated: no 'run' block and no model path whose run directory "
        "holds summary.json; re-evaluate with the current eval.run (it records the run) or keep the run dir")


# --- benchmark CSVs ----------------------------------------------------------------------------------------
_BENCH_ALIASES = {"tokens_per_s": ("tokens_per_s", "tok_per_s", "throughput", "tokens_per_sec", "tps"),
                  "peak_mem_gb": ("peak_mem_gb", "peak_mem_gib", "mem_gb", "peak_memory_gb", "memory_gb"),
                  "size": ("size", "preset", "scale", "model"),
                  "provider": ("provider", "impl", "routing", "routing_impl", "method", "variant"),
                  "ratio": ("ratio", "thr_ratio", "throughput_ratio", "rel_throughput")}
PROVIDER_NAMES = {"baseline": "baseline", "mhar_eager": "eager", "eager": "eager", "reference": "eager",
                  "mhar_compile": "compile", "compile": "compile", "mhar_fused": "fused", "fused": "fused",
                  "mhar_auto": "auto", "mhar_compile_sub": "compile"}
# bench_training variant names in records written before the routing names were unified (through commit aee597a):
# what routing_impl fused runs now was measured as mhar_fused_v7_sg8_pdl, and mhar_fused / mhar_fused_sub named
# withdrawn kernels. Rows written since carry a routing_resolved column and keep their names.
LEGACY_BENCH_VARIANTS = {"mhar_fused_v7_sg8_pdl": "mhar_fused", "mhar_fused": "mhar_fused_v6",
                         "mhar_fused_sub": "mhar_fused_v5"}


def bench_variant(variant, routing_resolved=None) -> str:
    """A training-throughput row's variant under the current names: a row of an older record (no
    ``routing_resolved`` value) is renamed by ``LEGACY_BENCH_VARIANTS``."""
    if isinstance(routing_resolved, str) and routing_resolved.strip():
        return str(variant)
    return LEGACY_BENCH_VARIANTS.get(str(variant), str(variant))


def provider_name(name) -> str:
    """The routing implementation a benchmark row names: bench_training's variants ``mhar_<routing_impl>``
    (``mhar_fused_nopdl`` -> ``fused_nopdl``; an old record's ``mhar_fused_v7_sg8`` -> ``fused_v7_sg8``) and the
    aliases above; other names lower-cased as given."""
    v = str(name).lower()
    if v in PROVIDER_NAMES:
        return PROVIDER_NAMES[v]
    return v[len("mhar_"):] if v.startswith("mhar_fused_") else v


_INFERENCE_COLS = ("size", "variant", "routing_impl", "prefill_tok_s", "decode_ms_per_token", "peak_mem_gib")


def _read_bench_csv(path: str | os.PathLike):
    """(path, DataFrame with stripped lower-case column names) of one listed benchmark CSV."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise AnalysisInputError(f"{p}: benchmark CSV not found (run the benchmark first)")
    df = pd.read_csv(p)
    df.columns = [c.strip().lower() for c in df.columns]
    return p, df


def _is_inference(df) -> bool:
    return "prefill_tok_s" in df.columns


def load_inference(paths: Iterable[str | os.PathLike]):
    """The inference records (``benchmarks/bench_inference.py`` CSVs) among ``paths``, one DataFrame with
    columns size, provider (baseline / hf = transformers' Qwen3 / the routing implementation), batch,
    score_tok_s (NaN in records older than the scoring column), prefill_tok_s, decode_ms_per_token, peak_mem_gb,
    source; empty when none is listed. A listed inference CSV without the core columns is an error."""
    import numpy as np
    import pandas as pd

    frames = []
    for p in paths:
        p, df = _read_bench_csv(p)
        if not _is_inference(df):
            continue
        missing = [c for c in _INFERENCE_COLS if c not in df.columns]
        if missing:
            raise AnalysisInputError(f"{p}: inference record without columns {missing}: not a "
                                     "benchmarks/bench_inference.py CSV")

        def num(col: str):
            return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(np.nan, index=df.index)

        out = pd.DataFrame({
            "size": df["size"].astype(str),
            "provider": [str(v) if str(v) in ("baseline", "hf") else provider_name(i)
                         for v, i in zip(df["variant"], df["routing_impl"])],
            "batch": num("batch"),
            "score_tok_s": num("score_tok_s"),
            "prefill_tok_s": num("prefill_tok_s"),
            "decode_ms_per_token": num("decode_ms_per_token"),
            "peak_mem_gb": num("peak_mem_gib"),
            "source": str(p)})
        frames.append(out)
    cols = ["size", "provider", "batch", "score_tok_s", "prefill_tok_s", "decode_ms_per_token", "peak_mem_gb",
            "source"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def load_bench(paths: Iterable[str | os.PathLike]):
    """Concatenate training-throughput benchmark CSVs into one DataFrame with columns size, provider
    (baseline/eager/compile/fused), tokens_per_s, peak_mem_gb, ratio (throughput / baseline throughput),
    status, source, paired (the ratio came with the record: the variant against the baseline of its own run).
    ``paths`` is an explicit list (the workflow's ``cost.bench_files``); inference records
    among them (``load_inference``) are left to the caller; any other listed CSV that is
    not a training-throughput benchmark (no throughput column, e.g. routing-op timings) is an error, not
    skipped. Memory is taken as reported (GiB when the CSV says ``peak_mem_gib``)."""
    import pandas as pd

    frames = []
    for p in paths:
        p, df = _read_bench_csv(p)
        if _is_inference(df):  # benchmarks/bench_inference.py records: read by load_inference
            continue
        if "mode" in df.columns:  # bench_training.py --trainer-steps rows re-measure the same step through
            df = df[df["mode"].astype(str) != "trainer"].reset_index(drop=True)  # mhar.train: not repeats
        cols = {canon: next((a for a in aliases if a in df.columns), None) for canon, aliases in _BENCH_ALIASES.items()}
        if cols["tokens_per_s"] is None:
            raise AnalysisInputError(f"{p}: no tokens_per_s column (or one of {_BENCH_ALIASES['tokens_per_s']}): "
                                     "not a training-throughput benchmark; list only benchmarks/bench_training.py "
                                     "CSVs (cost.bench_files)")
        for canon in ("size", "provider"):
            if cols[canon] is None:
                raise AnalysisInputError(f"{p}: needs a column {canon!r} (or one of {_BENCH_ALIASES[canon]}); "
                                         f"has {list(df.columns)}")
        out = pd.DataFrame(index=df.index)
        for canon, col in cols.items():
            out[canon] = df[col] if col is not None else np.nan
        out["status"] = df["status"].astype(str) if "status" in df.columns else "ok"
        out["tokens_per_s"] = pd.to_numeric(out["tokens_per_s"], errors="coerce")
        if cols["provider"] == "variant":  # bench_training's variant names (older records: bench_variant)
            resolved = df["routing_resolved"] if "routing_resolved" in df.columns else [None] * len(df)
            out["provider"] = [bench_variant(v, r) for v, r in zip(out["provider"], resolved)]
        out["provider"] = [provider_name(v) for v in out["provider"]]
        out["size"] = out["size"].astype(str)
        out["source"] = str(p)
        frames.append(out)
    if not frames:
        raise AnalysisInputError("no training-throughput CSV given: list benchmarks/bench_training.py CSVs "
                                 "(cost.bench_files)")
    df = pd.concat(frames, ignore_index=True)
    df["ratio"] = pd.to_numeric(df["ratio"], errors="coerce")
    # a ratio the record carries pairs the variant with the baseline of its own run (bench_training.py's
    # thr_ratio); a missing one is filled against the mean baseline of the size: not paired
    df["paired"] = df["ratio"].notna() & (df["provider"] != "baseline")
    for size, sub in df.groupby("size"):
        base = sub.loc[sub["provider"] == "baseline", "tokens_per_s"].astype(float).mean()
        missing = sub["ratio"].isna()
        if np.isfinite(base) and base > 0:
            df.loc[sub.index[missing], "ratio"] = sub.loc[missing, "tokens_per_s"].astype(float) / base
    return df


# --- published numbers -------------------------------------------------------------------------------------
def load_published(path: str | os.PathLike = PUBLISHED_CSV):
    import pandas as pd

    df = pd.read_csv(path, dtype={"heads": "Int64"}, keep_default_na=False, na_values=[""])  # "null" is a method
    for col in ("table", "scale", "method", "metric", "value"):
        if col not in df.columns:
            raise AnalysisInputError(f"{path}: missing column {col!r}")
    df["task"] = df["task"].fillna("")
    return df


def published_value(df, table: str, scale: str, method: str, metric: str, heads: Optional[int] = None,
                    task: str = "", as_fraction: bool = True) -> Optional[float]:
    """One published number (percent converted to a fraction), or None when the paper has none."""
    sel = (df["table"] == table) & (df["scale"] == scale) & (df["method"] == method) & \
          (df["metric"] == metric) & (df["task"] == task)
    if heads is not None:
        sel &= df["heads"].fillna(-1) == heads
    sub = df[sel & df["value"].notna()]
    if sub.empty:
        return None
    row = sub.iloc[0]
    v = float(row["value"])
    if as_fraction and str(row.get("unit", "")) == "percent":
        v /= 100.0
    return v


def paper_scale(size: str) -> tuple[str, bool]:
    """(paper scale to compare with, whether the scales match). Non-paper sizes compare with 100M (sign only)."""
    return (size, True) if size in PAPER_SCALES else ("100M", False)


# --- provenance ------------------------------------------------------------------------------------------------
def provenance(inputs: Sequence[str | os.PathLike], command: Optional[Sequence[str]] = None) -> dict:
    """Where a generated table/figure came from: command, inputs, git commit, versions, time."""
    from mhar.runs.provenance import git_info, utc_now

    versions = {}
    for mod in ("numpy", "scipy", "statsmodels", "pandas", "matplotlib", "torch"):
        m = sys.modules.get(mod)
        if m is not None:
            versions[mod] = getattr(m, "__version__", "?")
    return {"command": " ".join(command if command is not None else sys.argv),
            "inputs": [str(p) for p in inputs], "git": git_info(), "python": platform.python_version(),
            "versions": versions, "generated_utc": utc_now()}


def run_cli(prog: str, produce, argv: Optional[Sequence[str]]) -> int:
    """Run ``produce(command)`` for a ``python -m <prog>`` CLI: print the written paths, or one
    ``error:`` line and exit code 2 on bad input (AnalysisInputError)."""
    cmd = f"python -m {prog} " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        paths = produce(cmd)
    except AnalysisInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an output location that cannot be written (a file in the way, no permission, ...)
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        print(f"error: cannot write{where}: {e.strerror or e}; choose another --out", file=sys.stderr)
        return 2
    print("\n".join(map(str, paths)))
    return 0
