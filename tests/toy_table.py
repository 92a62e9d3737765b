"""A table defined outside analysis.tables (tests/analysis/test_table_registry.py builds it, reports it and has the
workflow's config check accept it).

``toy_steps``: the training steps and tokens of each run per residual config and size, read from the runs'
summaries. Adding it is the whole of adding a table: this module (its builder) plus its record, registered here as
a variant registers itself (tests/toy_variant.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from analysis.load.runs import load_summaries
from analysis.tables.registry import Build, TableSpec, register_table
from analysis.tables.render import Column, Table, f_num
from analysis.tables.rows import group_runs, run_label
from mhar.runs.sidecar import provenance

SPEC = register_table(TableSpec(
    "toy_steps", "Toy: training steps per run", "tests.toy_table:build", "table1_runs", "RUN/summary.json...",
    source="arxiv-v2-table1", about="Toy table: steps and tokens of each run (a table added from outside)."))


def build(inputs: Sequence[str | Path], b: Build) -> Table:
    rows = []
    for (variant, size, heads, knobs), byseed in group_runs(load_summaries(inputs)).items():
        first = next(iter(byseed.values()))
        rows.append({"size": size, "method": run_label(first, knobs), "n_seeds": len(byseed),
                     "steps": sum(r.steps or 0 for r in byseed.values()), "published_source": b.source(SPEC.name)})
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: str(r["n_seeds"])), Column("steps", lambda r: f_num(r["steps"], 0))]
    return Table(SPEC.name, SPEC.title, rows, cols, [f"Published source: {b.source(SPEC.name)}."],
                 provenance([str(p) for p in inputs]))
