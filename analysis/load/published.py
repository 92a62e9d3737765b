"""Published numbers, each with its source.

``analysis/published.csv`` holds one published number a row (``table, scale, method, heads, task, metric, value,
sd, unit, source, note``); ``source`` is an id of ``analysis/published_sources.csv`` (``id, kind, title, version,
table, corpus, repository, file, commit, note``: a paper's version and table, or a repository's file at a
commit). A comparison names the source it quotes (the workflow's ``published:`` block, default the table's
record in ``analysis.tables.registry``); where another source gives a different value for the same quantity, the
table says so.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import pandas as pd

from mhar.model.presets import PRESETS, size_key

from .common import AnalysisInputError

PUBLISHED_CSV = Path(__file__).resolve().parents[1] / "published.csv"
SOURCES_CSV = Path(__file__).resolve().parents[1] / "published_sources.csv"


def load_sources(path: str | os.PathLike = SOURCES_CSV):
    """The sources file as a DataFrame indexed by id."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for col in ("id", "kind", "title", "version", "table"):
        if col not in df.columns:
            raise AnalysisInputError(f"{path}: missing column {col!r}")
    if df["id"].duplicated().any():
        raise AnalysisInputError(f"{path}: source id {df['id'][df['id'].duplicated()].iloc[0]!r} appears twice")
    return df.set_index("id")


def load_published(path: str | os.PathLike = PUBLISHED_CSV, sources: str | os.PathLike = SOURCES_CSV):
    """The published numbers; every row's ``source`` must be an id of the sources file."""
    df = pd.read_csv(path, dtype={"heads": "Int64"}, keep_default_na=False, na_values=[""])  # "null" is a method
    for col in ("table", "scale", "method", "metric", "value", "source"):
        if col not in df.columns:
            raise AnalysisInputError(f"{path}: missing column {col!r}")
    df["task"] = df["task"].fillna("")
    known = set(load_sources(sources).index)
    unknown = sorted(set(df["source"].fillna("")) - known)
    if unknown:
        raise AnalysisInputError(f"{path}: source {unknown[0]!r} is not an id of {sources}; add it there "
                                 "(paper version and table, or repository, file and commit)")
    return df


def check_source(df, source: str) -> str:
    """``source`` when some published row quotes it, else one AnalysisInputError naming the known ids."""
    if source not in set(df["source"]):
        raise AnalysisInputError(f"published source {source!r} is unknown; choose one of "
                                 f"{', '.join(sorted(set(df['source'])))} (analysis/published_sources.csv)")
    return source


def _rows(df, source: Optional[str], scale: str, method: str, metric: str, heads: Optional[int], task: str):
    sel = (df["scale"] == scale) & (df["method"] == method) & (df["metric"] == metric) & (df["task"] == task) & \
          df["value"].notna()
    if source is not None:
        sel &= df["source"] == source
    if heads is not None:
        sel &= df["heads"].fillna(-1) == heads
    return df[sel]


def _value(row, as_fraction: bool) -> float:
    v = float(row["value"])
    if as_fraction and str(row.get("unit", "")) == "percent":
        v /= 100.0
    return v


def published_value(df, source: str, scale: str, method: str, metric: str, heads: Optional[int] = None,
                    task: str = "", as_fraction: bool = True) -> Optional[float]:
    """One published number of ``source`` (percent converted to a fraction), or None when it has none."""
    sub = _rows(df, source, scale, method, metric, heads, task)
    return None if sub.empty else _value(sub.iloc[0], as_fraction)


def published_tasks(df, source: str) -> set[str]:
    """The tasks ``source`` publishes any number for (a task outside them, e.g. a user's own, has no paper
    column to fill)."""
    sel = (df["source"] == source) & df["value"].notna() & (df["task"] != "")
    return set(df[sel]["task"].astype(str))


def published_sd(df, source: str, scale: str, method: str, metric: str) -> Optional[float]:
    """The spread (``sd``) published beside a number, or None."""
    sub = _rows(df, source, scale, method, metric, None, "")
    if sub.empty:
        return None
    sd = sub["sd"].iloc[0]
    return float(sd) if sd is not None and math.isfinite(float(sd)) else None


def other_values(df, source: str, scale: str, method: str, metric: str, heads: Optional[int] = None,
                 task: str = "", as_fraction: bool = True) -> dict[str, float]:
    """{source id: value} of the same quantity published by sources other than ``source`` that differ from
    ``source``'s value (all of them when ``source`` has none): where sources disagree."""
    mine = published_value(df, source, scale, method, metric, heads, task, as_fraction)
    out = {}
    for _, row in _rows(df, None, scale, method, metric, heads, task).iterrows():
        v = _value(row, as_fraction)
        if row["source"] != source and row["source"] not in out and (mine is None or abs(v - mine) > 1e-12):
            out[row["source"]] = v
    return out


def others_text(others: dict[str, float]) -> str:
    return "; ".join(f"{k} {v:.4g}" for k, v in others.items())


def describe_source(source: str, path: str | os.PathLike = SOURCES_CSV) -> str:
    """One line naming a source: title, version, table and corpus; or repository, file and commit."""
    src = load_sources(path)
    if source not in src.index:
        return f"{source} (not in {Path(path).name})"
    r = src.loc[source]
    where = (f"{r['repository']} {r['file']} at {r['commit'][:12]}" if r.get("repository") else r["version"])
    corpus = f", {r['corpus']}" if r.get("corpus") else ""
    return f"{source}: {r['title']}, {where}, {r['table']}{corpus}"


def paper_scale(size: str) -> tuple[str, bool]:
    """(published scale to compare with, whether the scales match): the size preset's ``paper_scale``
    (mhar.model.presets); a size that is not a paper scale compares with the smallest paper scale (sign only)."""
    p = PRESETS.get(size)
    if p is not None and p.paper_scale:
        return p.paper_scale, True
    return paper_scales()[0], False


def paper_scales() -> tuple[str, ...]:
    """The paper's scales, smallest first (the presets that are paper sizes, in preset order)."""
    return tuple(PRESETS[n].paper_scale for n in sorted(PRESETS, key=size_key) if PRESETS[n].paper_scale)


def source_notes(source: str, disagree: list[str]) -> list[str]:
    """A table's notes on its published numbers: the source it quotes and, where other sources give another
    value for the same quantity, which ones (``disagree``: 'row: id value; ...' lines)."""
    notes = [f"Published numbers quoted: {describe_source(source)} (config `published`, analysis/published_sources.csv)."]
    disagree = list(dict.fromkeys(disagree))  # one line per quantity, however many of our rows compare with it
    if disagree:
        notes.append("Sources disagree for the same quantity (other source: value): " + " | ".join(disagree[:6])
                     + (f" | ... ({len(disagree)} quantities)" if len(disagree) > 6 else ""))
    return notes


def sources_section(table_csvs: dict[str, Optional[os.PathLike]]) -> list[str]:
    """Markdown lines for a report's setup: which published source each table quotes (its CSV's
    ``published_source`` column) and, for the quantities where other sources disagree, that they do."""
    lines = []
    for name, path in table_csvs.items():
        if path is None:
            continue
        df = pd.read_csv(path)
        if "published_source" not in df.columns:
            continue
        ids = sorted({str(s) for s in df["published_source"].dropna()})
        disagree = int(df["published_others"].notna().sum()) if "published_others" in df.columns else 0
        lines.append(f"- `{name}`: " + "; ".join(describe_source(i) for i in ids)
                     + (f" (other sources disagree on {disagree} row(s): see the table's notes)" if disagree else ""))
    if not lines:
        return []
    return ["**Published numbers quoted** (config `published`; every number's source in analysis/published.csv, "
            "the sources in analysis/published_sources.csv):", ""] + lines + [""]
