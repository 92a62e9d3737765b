"""The released-models table: each released checkpoint's numbers beside the ones its authors published, every
published number with its source, and a paired per-question test of each AttnRes arm against the baseline arm of
its size.

    python -m analysis.tables released --inputs EVAL_DIRS... --arms ARMS.json --out PREFIX

writes PREFIX.csv, PREFIX.md and PREFIX.tex. EVAL_DIRS are the released arms' evaluation folders (the workflow's
results/eval/released/<label>/<ehash>); which arm a folder belongs to is read from its records (``run`` block).
ARMS is the config's ``released:`` block as JSON ({label: {"published": {"source", "scale", "method"} or null}}):
which published row each arm is compared with. Published numbers are the rows of ``analysis/published.csv`` with
table ``released``, each naming its source (``analysis/published_sources.csv``: repository, file, commit, section); a
choice that names no row there is an error. Where another source states a different number for the same model, or
the same number for another model, the row says so ("other sources", CSV column ``published_others``).

Pairing: an arm whose residual variant is not ``baseline`` is compared with the baseline arm of the same size
label whose run block pairs with it (same ``released-<group>``), on the same documents (analysis.load.samples.align).
The test per task is analysis.verdict's evidence for one model per arm (exact McNemar for 0/1 scores, the
cluster-robust t where questions share a context, the document bootstrap for perplexity); p (Holm) adjusts across
the table's comparison rows. A released checkpoint is one trained model, so the verdict says only whether these
two models differ (analysis.verdict, single seed).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from mhar.runs.pairing import pairing_difference

from mhar.runs.sidecar import provenance

from .. import stats as st
from .. import verdict as vd
from ..load.common import AnalysisInputError
from ..load.published import PUBLISHED_CSV, SOURCES_CSV, load_published as load_published_df, load_sources
from ..load.runs import identify_eval
from ..load.samples import EvalTask, eval_tasks, load_eval_task, metric_arrays
from .pairs import judge
from .questions import compare_task, primary_metric
from .registry import TABLES, Build
from .render import Column, Table, f_ci, f_num, f_p

TABLE = "released"  # the rows of analysis/published.csv this table quotes


@dataclass(frozen=True)
class Published:
    """One published number and where it is written."""

    source: str
    repository: str
    file: str
    commit: str
    section: str
    scale: str
    method: str
    task: str
    metric: str
    value: float
    unit: str
    note: str

    def where(self) -> str:
        return f"{self.repository} {self.file} @ {self.commit}, {self.section}"


def load_published(path: str | Path = PUBLISHED_CSV, sources: str | Path = SOURCES_CSV) -> list[Published]:
    """The published numbers of released models (table ``released``), each with where its source is written."""
    df = load_published_df(path, sources)
    src = load_sources(sources)
    out = []
    for _, r in df[df["table"] == TABLE].iterrows():
        s = src.loc[r["source"]]
        if not (s.get("repository") and s.get("file") and s.get("commit")):
            raise AnalysisInputError(f"{sources}: source {r['source']!r} of released numbers needs repository, file "
                                     "and commit")
        out.append(Published(source=r["source"], repository=s["repository"], file=s["file"], commit=s["commit"],
                             section=s["table"], scale=str(r["scale"]), method=str(r["method"]), task=str(r["task"]),
                             metric=str(r["metric"]), value=float(r["value"]), unit=str(r.get("unit") or ""),
                             note=str(r.get("note") or "")))
    return out


def _chosen(pub: Sequence[Published], spec: Optional[dict], label: str) -> list[Published]:
    """The published rows an arm is compared with (config ``released.<label>.published``); [] for none."""
    if not spec:
        return []
    if not isinstance(spec, dict) or not {"source", "scale", "method"} <= set(spec):
        raise AnalysisInputError(f"released arm {label!r}: published must name source, scale and method "
                                    f"(got {spec!r})")
    rows = [p for p in pub if (p.source, p.scale, p.method) == (spec["source"], str(spec["scale"]), spec["method"])]
    if not rows:
        known = sorted({f"{p.source} {p.scale} {p.method}" for p in pub})
        raise AnalysisInputError(
            f"released arm {label!r}: no published numbers for source {spec['source']!r}, scale {spec['scale']!r}, "
            f"method {spec['method']!r} in analysis/published.csv (table {TABLE}); known: {'; '.join(known)}")
    return rows


def check_choices(arms: dict, pub: Optional[Sequence[Published]] = None) -> None:
    """Every arm's ``published`` choice names rows of the published file (else an AnalysisInputError)."""
    pub = load_published() if pub is None else pub
    for label, arm in arms.items():
        _chosen(pub, (arm or {}).get("published"), label)


def _value_text(v: Any, metric: str) -> str:
    return f_num(v, 2 if "perplexity" in metric or metric == "ppl" else 3)


def other_sources(pub: Sequence[Published], chosen: Published) -> list[tuple[Published, str]]:
    """What the other sources state about the chosen number (same scale and task): the same model with the same
    or another value ('agrees' / 'differs'), or the same value given to another model ('gives X to M')."""
    out = []
    for p in pub:
        if p.source == chosen.source or p.scale != chosen.scale or p.task != chosen.task:
            continue
        same = math.isclose(p.value, chosen.value, rel_tol=1e-9)
        if p.method == chosen.method:
            out.append((p, f"{p.source}: {_value_text(p.value, p.metric)} ({'agrees' if same else 'differs'})"))
        elif same:
            out.append((p, f"{p.source} gives {_value_text(p.value, p.metric)} to {p.method}"))
    return out


def _checkpoint(results: dict) -> str:
    src = (results.get("run") or {}).get("source") or {}
    if src.get("kind") == "hub":
        return f"{src.get('repo')}@{str(src.get('commit'))[:12]}"
    if src.get("kind") == "local":  # the full path is in the run block and provenance.json
        return f"local {Path(str(src.get('folder'))).name} (content {str(src.get('content_sha256'))[:12]})"
    return "-"


def _arm_value(task: EvalTask, metric: str) -> float:
    ids = list(task.docs)
    x, w = metric_arrays(task, metric, ids)
    if w is not None:
        return st.perplexity(x, w)
    return float(x.mean())


def released_table(eval_dirs: Sequence[str | Path], arms: Optional[dict] = None,
                   published: Optional[Sequence[Published]] = None, n_resamples: int = 4999) -> Table:
    """The released-models table (module docstring) of the arms evaluated in ``eval_dirs``."""
    pub = load_published() if published is None else list(published)
    arms = arms or {}
    found: dict[str, tuple[Path, dict]] = {}
    for d in map(Path, eval_dirs):
        info = identify_eval(d)
        if info["label"] in found:
            raise AnalysisInputError(f"{d} and {found[info['label']][0]}: two evaluations of released arm "
                                        f"{info['label']!r}; pass each arm's eval dir once")
        found[info["label"]] = (d, info)
    chosen = {label: _chosen(pub, (arms.get(label) or {}).get("published"), label) for label in found}

    def reference(label: str) -> Optional[str]:
        d, info = found[label]
        cands = [k for k, (_, i) in found.items() if k != label and i["variant"] == "baseline"
                 and i["size"] == info["size"] and pairing_difference(info, i) is None]
        if len(cands) > 1:
            raise AnalysisInputError(f"released arm {label!r} ({d}) pairs with {len(cands)} baseline arms "
                                        f"({', '.join(sorted(cands))}); give each pair its own size or group")
        return cands[0] if cands else None

    order = sorted(found, key=lambda k: (found[k][1]["size"], found[k][1]["variant"] != "baseline", k))
    rows, results, skipped, used = [], [], [], set()
    for label in order:
        d, info = found[label]
        ref = reference(label) if info["variant"] != "baseline" else None
        if info["variant"] != "baseline" and ref is None:
            skipped.append(f"{label}: no baseline arm of size {info['size']} in its group to compare with")
        tasks = eval_tasks(d)
        for task in tasks:
            ta = load_eval_task(d, task)
            metric = primary_metric(ta)
            mine = next((p for p in chosen[label] if p.task == task), None)
            others = other_sources(pub, mine) if mine else []
            row: dict[str, Any] = {
                "size": info["size"], "arm": label, "variant": info["variant"], "model": info.get("model"),
                "checkpoint": _checkpoint(ta.results), "task": task, "metric": metric, "n": len(ta.docs),
                "subset": (ta.results.get("subset") or {}).get("spec") if isinstance(ta.results.get("subset"), dict)
                else ta.results.get("subset"),
                "ours": _arm_value(ta, metric), "published": mine.value if mine else None,
                "published_metric": mine.metric if mine else None, "published_source": mine.source if mine else None,
                "published_method": mine.method if mine else None,
                "published_others": "; ".join(t for _, t in others) or None,
                "published_commit": mine.commit if mine else None,
                "reference": ref, "comparison": None, "delta": None, "ci_low": None, "ci_high": None, "p": None,
                "p_holm": None, "published_delta": None, "judged": None, "verdict": None, "test": None}
            used.update((p.source, p.where()) for p in ([mine] if mine else []) + [p for p, _ in others])
            res = None
            if ref is not None and task in eval_tasks(found[ref][0]):
                tb = load_eval_task(found[ref][0], task)
                c = compare_task(ta, tb, metric, n_resamples=n_resamples)
                res = c.result
                theirs = next((p for p in chosen.get(ref, []) if p.task == task), None)
                pdelta = mine.value - theirs.value if (mine and theirs) else None
                row.update(comparison=f"{label} - {ref}: {task} ({info['size']})", delta=res.estimate,
                           ci_low=res.ci_low, ci_high=res.ci_high, p=res.p_value, test=res.method,
                           published_delta=pdelta,
                           published_delta_sources=(f"{mine.source} - {theirs.source}" if pdelta is not None
                                                    else None))
                if pdelta is not None and math.isfinite(res.estimate) and res.estimate != 0:
                    row["sign_vs_published"] = ("same sign" if math.copysign(1, res.estimate) ==
                                                math.copysign(1, pdelta) else "opposite sign")
            rows.append(row)
            results.append(res)
    judge(rows, results, single_seed=True)  # one trained model per arm: whether these two models differ
    cols = [Column("size", lambda r: r["size"]), Column("model", lambda r: r["arm"]),
            Column("checkpoint", lambda r: r["checkpoint"]),
            Column("task / metric", lambda r: f"{r['task']} {r['metric']}"), Column("n", lambda r: str(r["n"])),
            Column("ours", lambda r: _value_text(r["ours"], r["metric"])),
            Column("published [source]", lambda r: (f"{_value_text(r['published'], r['metric'])} "
                                                    f"[{r['published_source']}]") if r["published"] is not None
                   else "-"),
            Column("other sources", lambda r: r["published_others"] or "-"),
            Column("Δ vs baseline [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            Column("published Δ", lambda r: f_ci(r["published_delta"], None, None)),
            Column("test", lambda r: r["test"] or "-"), Column("p", lambda r: f_p(r["p"])),
            Column("p (Holm)", lambda r: f_p(r["p_holm"])), Column("verdict", lambda r: r["verdict"] or "-")]
    subsets = sorted({str(r["subset"]) for r in rows if r.get("subset")})
    ours = ", ".join(sorted({f"{r['task']} {r['metric']}" for r in rows}))
    notes = [f"Source {s}: {where}." for s, where in sorted(used)]
    notes += [
        "Sources disagree where 'other sources' says 'differs' (another number for the same model) or 'gives X to' "
        "(the same number attributed to another model); the published column quotes the source the config names "
        "(released.<arm>.published).",
        "Their evaluation protocol is not stated (document subset, WikiText-2 perplexity definition, LAMBADA "
        f"variant): ours is lm-eval's {ours or '-'} on {', '.join(subsets) or 'the configured subset'} of each "
        "task, so ours - published may be protocol, not model. Accuracies are fractions.",
        "Δ = arm - the baseline arm of its size, paired by document; the column 'test' names the test whose p is "
        "printed; p (Holm) adjusts across this table's comparison rows. A released checkpoint is one trained "
        f"model: the verdict says whether these two models differ ('{vd.MODELS_DIFFER}' / '{vd.NO_DIFFERENCE}'), "
        "never whether the method reproduces (analysis/verdict.py VERDICT_RULE).",
    ] + [f"not compared: {s}" for s in skipped]
    return Table("released", TABLES["released"].title, rows, cols, notes, provenance([str(d) for d in eval_dirs]))


def build(inputs: Sequence[str | Path], b: Build) -> Table:
    """The registry's builder of table released (analysis.tables.registry): options ``arms``, the config's
    ``released:`` block ({label: {"published": ...}})."""
    return released_table(inputs, b.options.get("arms") or {}, n_resamples=b.n_resamples)


def read_arms(path: str) -> dict:
    """The ``--arms`` JSON file of ``python -m analysis.tables released``."""
    try:
        arms = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise AnalysisInputError(f"--arms {path}: cannot read a JSON object ({e})") from None
    if not isinstance(arms, dict):
        raise AnalysisInputError(f"--arms {path}: expected a JSON object label -> arm")
    return arms
