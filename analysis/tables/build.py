"""Result tables (CSV + Markdown + LaTeX), each with the published value beside ours and a verdict.

    python -m analysis.tables TABLE --inputs FILES... --out PREFIX [--published ID] [--arms ARMS.json]

TABLE: a name of analysis/tables/registry.py (table1, seeds, heads, downstream, cpt, cost, released, ...).

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
Anything else exits 2 with one ``error:`` line naming both runs and the first field that differs. A row that
finds nothing to be compared with (no baseline among the inputs, or only one of another size) is tabulated
without a delta, and why is a note of the table and a ``TABLE: ...`` line on stderr (``pairs.unpaired_reason``).

Every table CSV carries the common columns ``comparison, delta, ci_low, ci_high, p, p_holm,
published_delta, judged, verdict`` (empty where not applicable) so forest plots and the report can
read any of them. Tests, multiplicity and the verdict rule live in ``analysis.verdict``. The published column
quotes one source (``--published ID``; the workflow's ``published:`` block; default: the table's record in
``analysis.tables.registry``), named in the notes and in the CSV column ``published_source``.
One module per table, each one record of ``analysis.tables.registry`` (builder, inputs, title, published source);
``render`` writes them.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import yaml

from mhar.atomic import atomic_write_text

from ..load.common import AnalysisInputError, run_cli
from .registry import TABLES, Build, builder, table_spec
from .released import read_arms
from .render import write_table


def make_table(kind: str, inputs: Sequence[str | Path], out: str | Path, n_resamples: int = 4999,
               command: Optional[str] = None, published: Optional[dict] = None,
               options: Optional[dict] = None) -> list[Path]:
    """Build table ``kind`` (a record of analysis.tables.registry) from ``inputs`` and write OUT.csv/.md/.tex
    (``command`` is recorded as provenance; by default the equivalent CLI command). ``published``: {table kind:
    source id} of the published numbers quoted (the workflow's ``published:`` block); a kind it leaves out quotes
    its record's default source. ``options``: the table's own (the released table's ``arms``)."""
    table_spec(kind)  # an unknown kind: ValueError naming the registered ones
    if not inputs:
        raise AnalysisInputError(f"{kind}: no inputs given")
    t = builder(kind)(list(inputs), Build(dict(published or {}), n_resamples, dict(options or {})))
    t.provenance["command"] = command or f"python -m analysis.tables {kind} --inputs {' '.join(map(str, inputs))} --out {out}"
    t.provenance.update(options or {})
    for reason in t.unpaired:  # a table whose rows say "-": why, also where the user ran it
        print(f"{kind}: {reason}", file=sys.stderr)
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
    atomic_write_text(mpath, yaml.safe_dump(manifest, sort_keys=False))
    return make_table("cpt", [mpath], out_prefix, n_resamples=n_resamples, published=published)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.tables", description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=list(TABLES))
    ap.add_argument("--inputs", "--summaries", "--runs", "--evals", "--bench", dest="inputs", nargs="+", required=True,
                    help="; ".join(f"{n}: {s.usage}" for n, s in TABLES.items()))
    ap.add_argument("--out", required=True, help="output prefix; writes PREFIX.csv, PREFIX.md, PREFIX.tex")
    ap.add_argument("--resamples", type=int, default=4999, help="bootstrap / permutation resamples")
    ap.add_argument("--published", metavar="ID", default=None,
                    help="source of the published numbers quoted (an id of analysis/published_sources.csv)")
    ap.add_argument("--arms", metavar="ARMS.json", default=None,
                    help="released: the config's released block as JSON (the published row each arm is compared with)")
    a = ap.parse_args(argv)
    pub = {a.kind: a.published} if a.published else None

    def make(cmd: str) -> list[Path]:
        options = {"arms": read_arms(a.arms) if a.arms else {}} if a.kind == "released" else None
        return make_table(a.kind, a.inputs, a.out, a.resamples, command=cmd, published=pub, options=options)

    return run_cli("analysis.tables", make, argv)


if __name__ == "__main__":
    sys.exit(main())
