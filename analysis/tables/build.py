"""Result tables (CSV + Markdown + LaTeX), each with the published value beside ours and a verdict.

    python -m analysis.tables {table1,downstream,cpt,heads,seeds,cost} --inputs FILES... --out PREFIX [--published ID]

writes PREFIX.csv (raw numbers), PREFIX.md and PREFIX.tex (formatted, with notes and provenance).
Inputs: table1/heads/seeds take summary.json files (or run dirs); downstream takes eval dirs of the
baseline and the variants (which run each dir belongs to is read from results.json / the path);
cpt takes three eval dirs base, plain, mhar (or one JSON/YAML manifest {base, plain, mhar, scale});
cost takes benchmark CSVs. A row is one residual config (variant, heads and every other residual knob; knobs
that differ from their defaults are shown in the row name) at one size, and pools only runs that differ by
seed; rows are paired by seed. Which run a file belongs to is read from its records (the ``run`` block, else
the flat keys / config.yaml of older records), never from its path. Two runs are paired only when their
resolved configs differ in the residual section alone (``mhar.runs.pairing``): same size, same
train and data seeds, same data order and schedule; CPT arms may also differ in their start checkpoint.
Anything else exits 2 with one ``error:`` line naming both runs and the first field that differs.

Every table CSV carries the common columns ``comparison, delta, ci_low, ci_high, p, p_holm,
published_delta, judged, verdict`` (empty where not applicable) so forest plots and the report can
read any of them. Tests, multiplicity and the verdict rule live in ``analysis.verdict``. The published column
quotes one source (``--published ID``; the workflow's ``published:`` block; default
``analysis.load.published.DEFAULT_SOURCES``), named in the notes and in the CSV column ``published_source``.
One module per table (table1, seeds, heads, downstream, cpt, cost); ``render`` writes them.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import yaml

from ..load.common import AnalysisInputError, run_cli
from .cost import cost_table
from .cpt import cpt_table
from .downstream import downstream_table
from .heads import heads_table
from .render import Table, write_table
from .seeds import seeds_table
from .table1 import table1


KINDS = ("table1", "downstream", "cpt", "heads", "seeds", "cost")


def make_table(kind: str, inputs: Sequence[str | Path], out: str | Path, n_resamples: int = 4999,
               command: Optional[str] = None, published: Optional[dict] = None) -> list[Path]:
    """Build table ``kind`` from ``inputs`` and write OUT.csv/.md/.tex (``command`` is recorded as provenance;
    by default the equivalent CLI command). ``published``: {table kind: source id} of the published numbers
    quoted (the workflow's ``published:`` block); a kind it leaves out quotes its default source."""
    if not inputs:
        raise AnalysisInputError(f"{kind}: no inputs given")
    src = dict(published or {})
    builders: dict[str, Callable[[], Table]] = {
        "table1": lambda: table1(inputs, source=src.get("table1")),
        "seeds": lambda: seeds_table(inputs, source=src.get("seeds")),
        "heads": lambda: heads_table(inputs, source=src.get("heads"), table1_source=src.get("table1")),
        "downstream": lambda: downstream_table(inputs, n_resamples=n_resamples, source=src.get("downstream")),
        "cpt": lambda: cpt_table(inputs, n_resamples=n_resamples, source=src.get("cpt")),
        "cost": lambda: cost_table(inputs, source=src.get("cost"))}
    if kind not in builders:
        raise ValueError(f"unknown table {kind!r}; choose one of {', '.join(KINDS)}")
    t = builders[kind]()
    t.provenance["command"] = command or f"python -m analysis.tables {kind} --inputs {' '.join(map(str, inputs))} --out {out}"
    return write_table(t, out)


def write_cpt_table(base_eval: str | Path, plain_eval: str | Path, mhar_eval: str | Path, out_prefix: str | Path,
                    scale: str, batch_check: Optional[dict] = None, n_resamples: int = 4999,
                    published: Optional[dict] = None) -> list[Path]:
    """CPT gain / total gain / MHAR gain table (analysis.tables cpt) from three eval dirs.

    Writes ``<out_prefix>.manifest.yaml`` (inputs + the batch-identity check) next to the table. ``published``:
    {table kind: source id} of the published numbers quoted (the config's ``published`` block).
    """
    out_prefix = Path(out_prefix)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    # relative to the manifest's folder (as analysis.tables reads them): the same file wherever the tree lies
    here = out_prefix.parent.resolve()
    rel = lambda p: os.path.relpath(Path(p).resolve(), here)  # noqa: E731
    manifest = {"base": rel(base_eval), "plain": rel(plain_eval), "mhar": rel(mhar_eval), "scale": scale}
    if batch_check is not None:
        manifest["batch_check"] = batch_check
    mpath = out_prefix.with_name(out_prefix.name + ".manifest.yaml")
    mpath.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return make_table("cpt", [mpath], out_prefix, n_resamples=n_resamples, published=published)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.tables", description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--inputs", "--summaries", "--runs", "--evals", "--bench", dest="inputs", nargs="+", required=True,
                    help="summary.json files / run dirs (table1, heads, seeds), eval dirs (downstream), "
                         "base plain mhar eval dirs or a manifest (cpt), bench CSVs (cost)")
    ap.add_argument("--out", required=True, help="output prefix; writes PREFIX.csv, PREFIX.md, PREFIX.tex")
    ap.add_argument("--resamples", type=int, default=4999, help="bootstrap / permutation resamples")
    ap.add_argument("--published", metavar="ID", default=None,
                    help="source of the published numbers quoted (an id of analysis/published_sources.csv)")
    a = ap.parse_args(argv)
    pub = {a.kind: a.published} if a.published else None
    return run_cli("analysis.tables", lambda cmd: make_table(a.kind, a.inputs, a.out, a.resamples, command=cmd,
                                                         published=pub), argv)


if __name__ == "__main__":
    sys.exit(main())
