"""The table registry: one record per table, read by everything that names a table.

``python -m analysis.tables`` (``build.make_table``: which builder, the CLI's choices), ``analysis.report`` (the
section title, the command a missing table is made with), the published numbers (``analysis.load.published``:
which source a table quotes by default), the workflow config check (``check_published``: the keys of the config's
``published:`` block; config/schema.yaml leaves them to it) and the workflow (``workflow/rules/tables.smk``: one
rule for every table whose inputs the workflow lists, ``INPUTS``; output names ``<reports>/<name>.{md,csv,tex}``).

A new table is one module with its builder plus one record: ``register_table(TableSpec(...))`` here for the
project's tables, or in the table's own module for a table defined elsewhere (tests/toy_table.py). A builder is
``fn(inputs, build: Build) -> analysis.tables.render.Table``, named ``"module:function"`` so that this module
imports nothing (the workflow reads it where the analysis environment's packages may be missing).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["TableSpec", "Build", "INPUTS", "TABLES", "register_table", "table_spec", "builder", "default_sources",
           "check_published"]

# What a table reads, as the workflow lists it (workflow/rules/tables.smk maps each kind to its files):
INPUTS = {
    "table1_runs": "summary.json of the Table 1 runs (table1.variants x sizes x seeds)",
    "heads_runs": "summary.json of the head-sweep runs (heads.variants x sizes x seeds)",
    "downstream_evals": "eval dirs of the downstream runs and the released arms",
    "released_evals": "eval dirs of the released arms (released:)",
    "bench": "benchmark CSVs (cost.bench_files, + the fresh one with cost.run_benchmark)",
    "cpt": "base, plain, mhar eval dirs or a manifest (built by workflow/rules/cpt.smk's own rule)",
}


@dataclass(frozen=True)
class TableSpec:
    """One table: ``name`` (the CLI's kind, the output names ``<name>.{md,csv,tex}``, the key of the config's
    ``published:`` block), ``title`` (the report's section), ``builder`` ("module:function"), ``inputs`` (a key
    of :data:`INPUTS`), ``usage`` (the CLI's inputs, as the report's Missing list prints them), ``source`` (the
    published source it quotes by default, an id of analysis/published_sources.csv; None: it quotes none or
    per row), ``about`` (one sentence: what it shows), ``optional`` (absent from a config that does not ask for
    it: not listed as missing in the report)."""

    name: str
    title: str
    builder: str
    inputs: str
    usage: str
    source: Optional[str] = None
    about: str = ""
    optional: bool = False
    outputs: tuple = field(default=("md", "csv", "tex"))


@dataclass(frozen=True)
class Build:
    """What a builder gets besides its inputs: the config's ``published:`` block ({table: source id}; a table left
    out quotes its record's default), the resamples of bootstrap / permutation tests, and table-specific options
    (the released table's ``arms``)."""

    published: dict = field(default_factory=dict)
    n_resamples: int = 4999
    options: dict = field(default_factory=dict)

    def source(self, name: str) -> Optional[str]:
        return self.published.get(name) or TABLES[name].source


TABLES: dict[str, TableSpec] = {}


def register_table(spec: TableSpec) -> TableSpec:
    """Add a table (an error for a taken name or an unknown input kind); returns the record."""
    if spec.name in TABLES and TABLES[spec.name] != spec:
        raise ValueError(f"table {spec.name!r} is already registered (builder {TABLES[spec.name].builder})")
    if spec.inputs not in INPUTS:
        raise ValueError(f"table {spec.name!r}: input kind {spec.inputs!r} is not one of {', '.join(INPUTS)}")
    if ":" not in spec.builder:
        raise ValueError(f"table {spec.name!r}: builder {spec.builder!r} must be 'module:function'")
    TABLES[spec.name] = spec
    return spec


def table_spec(name: str) -> TableSpec:
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; choose one of {', '.join(TABLES)}")
    return TABLES[name]


def builder(name: str) -> Callable[..., Any]:
    """The builder function of table ``name`` (imported on first use)."""
    module, _, fn = table_spec(name).builder.partition(":")
    return getattr(importlib.import_module(module), fn)


def default_sources() -> dict[str, str]:
    """{table: the published source it quotes by default} for the tables that quote one."""
    return {n: s.source for n, s in TABLES.items() if s.source}


def check_published(published: Optional[dict], known_sources: list[str]) -> Optional[str]:
    """The config check of a ``published:`` block ({table: source id}): None when every key is a registered
    table that quotes a source and every value one of ``known_sources``; else the problem, one line."""
    for name, source in (published or {}).items():
        if name not in TABLES or not TABLES[name].source:
            quoting = [n for n, s in TABLES.items() if s.source]
            return (f"published.{name}: no table {name!r} quotes a published source; the keys are tables: "
                    f"{', '.join(quoting)} (analysis/tables/registry.py)")
        if source not in known_sources:
            return (f"published.{name}: unknown published source {source!r}; choose one of "
                    f"{', '.join(known_sources)} (analysis/published_sources.csv)")
    return None


# --- the project's tables, in report order -------------------------------------------------------------------
for _spec in (
    TableSpec("table1", "Table 1: tail-mean validation loss", "analysis.tables.table1:build", "table1_runs",
              "RUN/summary.json...", "arxiv-v2-table1",
              "Table 1: tail-mean validation loss of each residual variant at each size (mean over seeds), with the "
              "paired comparison against the baseline."),
    TableSpec("seeds", "Seed table", "analysis.tables.seeds:build", "table1_runs", "RUN/summary.json...",
              "arxiv-v2-seeds", "Seed table: every seed's validation loss per variant, and the paired per-seed "
              "differences against the baseline."),
    TableSpec("heads", "Head-count sweep", "analysis.tables.heads:build", "heads_runs", "RUN/summary.json...",
              "arxiv-v2-heads", "Head sweep: validation loss of MHAR with H routing heads (attnres is H=1)."),
    TableSpec("downstream", "Downstream evaluation", "analysis.tables.downstream:build", "downstream_evals",
              "EVAL_DIR...", "arxiv-v2-table2",
              "Downstream lm-eval tasks: per-task metrics of each variant, paired over questions (and seeds) against "
              "the baseline, Holm-adjusted across the family."),
    TableSpec("cpt", "Continued pretraining", "analysis.tables.cpt:build", "cpt",
              "BASE PLAIN MHAR (eval dirs) or MANIFEST.yaml", "arxiv-v2-table3",
              "Continued pretraining: CPT gain, total gain and MHAR gain of the plain and MHAR-delta arms over the "
              "base model."),
    TableSpec("cost", "Cost", "analysis.tables.cost:build", "bench", "BENCH.csv... (cost.bench_files)",
              "arxiv-v2-cost", "Cost: training throughput (and inference, when recorded) of each routing "
              "implementation relative to the baseline, from the benchmark records."),
    TableSpec("released", "Released models: ours vs their README", "analysis.tables.released:build", "released_evals",
              "EVAL_DIR... --arms ARMS.json", None,
              "Released checkpoints: each arm's numbers beside the ones its authors published (each with its "
              "source), and the paired test of each AttnRes arm against the baseline arm of its size.",
              optional=True),
):
    register_table(_spec)
