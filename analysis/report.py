"""Assemble reports/REPORT.md from whatever tables, figures and probe results exist.

    python -m analysis.report --reports reports --out reports/REPORT.md

Reads the files it is given (``--inputs``; the workflow passes the report rule's inputs: this config's own
outputs), or else the reports folder's own layout (``Inputs``): the tables written by ``analysis.tables``
(``<name>.csv`` + ``<name>.md``), the figures written by ``analysis.figures`` (``figures/<name>.png``) and probe
JSONs (``eval.probe``, ``probe/<size>/<variant>.json``); never another config's reports in a subfolder. Each
item gets a one-line reading computed from its CSV; whatever is absent is listed under "Missing" with the
command that makes it, so the report works after any subset of the workflow (e.g. only ``reproduce_table1``).
Never edit the output by hand.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from mhar.atomic import atomic_write_text

from mhar.runs import sidecar
from . import verdict as vd
from mhar.runs.sidecar import provenance
from .load.published import load_published, paper_scales, sources_section
from .tables.registry import TABLES

# What a reader must know beside a table (shown under its reading line).
TABLE_NOTES = {
    "cpt": ("**Unit of evidence:** the paper's own continued-pretraining evidence (its Table 3) is of this kind "
            "too: one run per arm and an exact McNemar test over questions. Such a test shows that these two "
            "trained models differ, not that MHAR does better than plain continued pretraining in general (one "
            "run per arm cannot separate the method from run-to-run noise); hence the single-seed verdicts "
            "(see the verdict rule above)."),
}
FIGURES = {  # name -> one-line reading of what the figure shows
    "loss_curves": "validation loss per variant; line = mean over seeds, band = min..max across seeds.",
    "loss_vs_compute": "validation loss against training FLOPs (the trainer's count, the same on every rerun): what "
                       "the routing costs per unit of loss in compute; its cost in time is the cost table's measured "
                       "throughput (a training run's wall-clock varies with the machine's load).",
    "routing_heatmap": "per-head total-variation distance of each head's mean depth distribution from the "
                       "head-average and from uniform, per site, one panel per model (display name) and reference: "
                       "bright = heads that route differently; a panel that is identically 0 (one routing head vs "
                       "its head-mean) is left out and named under the figure.",
    "head_sweep": "tail-mean loss vs routing heads H as the paired difference to the smallest H (mean ± sd over "
                  "seeds), with the paper's 1B sweep (dashed): look for the U-shape.",
    "forest": "paired deltas with 95% CIs per comparison of Table 1 and the downstream table (n per row), "
              "coloured by verdict; x = the paper's delta.",
    "cost": "the cost table drawn: throughput relative to the baseline (± 2 SE over repeats) and peak memory per "
            "routing implementation (today's routing paths; n = the table's runs of that size on each bar); x = the "
            "paper's H100 numbers; OOM / unmeasured cells are labelled.",
}


class Inputs:
    """The files one report reads: the workflow's list (the report rule's inputs: this config's own tables,
    figures and probe JSONs), or without a list the reports folder's own layout (``<name>.csv``,
    ``figures/<name>.png``, ``probe/<size>/<variant>.json``), never a recursive glob: another config's reports
    kept in a subfolder (reports/gpu_small/) are not this report's."""

    def __init__(self, root: Path, files: Optional[Sequence[str | Path]] = None):
        self.root = root
        if files is None:
            files = [*root.glob("*.csv"), *root.glob("*.md"), *(root / "figures").glob("*.png"),
                     *(root / "probe").glob("*/*.json")]
        self.files = [Path(f) for f in files]

    def find(self, filename: str) -> Optional[Path]:
        hits = sorted((p for p in self.files if p.name == filename and p.is_file()),
                      key=lambda p: (len(p.parts), str(p)))
        return hits[0] if hits else None

    def probes(self, out: Path) -> list[Path]:
        return sorted({p for p in self.files if p.suffix == ".json" and p.is_file() and p.resolve() != out.resolve()
                       and not p.name.endswith(sidecar.SUFFIX) and _is_probe(p)})


def _fmt(x, nd=3) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "-"
    return f"{x:+.{nd}f}" if math.isfinite(x) else "-"


def table_reading(name: str, csv_path: Path) -> str:
    """One line summarising a table CSV: verdict counts and the comparison that stands out (``_standout``)."""
    import pandas as pd  # lazy: pandas (a slow import), only for this section

    df = pd.read_csv(csv_path)
    if df.empty:
        return "the table is empty (no comparable runs among the inputs)."
    parts = []
    if "verdict" in df.columns:
        v = df["verdict"].dropna()
        v = v[v.astype(str).str.len() > 0]
        if len(v):
            counts = v.astype(str).str.split(":").str[0].value_counts()  # "effect differs: smaller (..)" -> kind
            order = list(vd.VERDICTS) + sorted(k for k in counts.index if k not in vd.VERDICTS)
            parts.append(", ".join(f"{counts[k]} {k}" for k in order if k in counts) + f" (of {len(v)} comparisons)")
    if name == "seeds" and "per_seed_delta" in df.columns:
        parts.append("descriptive; the test and verdict of these deltas are Table 1's (counted once there): "
                     + ", ".join(f"{r.method}@{r.size} mean Δ {_fmt(r.delta)} over seeds {r.seeds}"
                                 for r in df.itertuples()))
    elif name == "cost" and "ratio" in df.columns:
        sub = df[df["provider"] != "baseline"]
        if not sub.empty:
            parts.append("throughput ratios " + ", ".join(
                f"{r.provider}@{r.size} {float(r.ratio):.2f}" + (f" (paper {float(r.published_ratio):.2f})"
                                                                  if pd.notna(r.published_ratio) else "")
                for r in sub.itertuples() if pd.notna(r.ratio)))
    elif {"comparison", "delta", "p"} <= set(df.columns):
        parts.append(_standout(df))
    if name == "heads" and "best" in df.columns:
        for size, sub in df.groupby("size"):
            if len(sub) < 2:
                parts.append(f"{size}: only H={int(sub.iloc[0]['heads'])} present, no sweep")
                continue
            b = sub[sub["best"].astype(str) == "True"]
            if not b.empty:
                interior = str(b.iloc[0].get("interior_best")) == "True"
                where = " (interior: U-shape)" if interior else " (at the edge of the sweep)"
                parts.append(f"{size}: best H={int(b.iloc[0]['heads'])}{where}")
    return "; ".join(parts) + "." if parts else "no comparisons in this table."


def _standout(df) -> str:
    """The comparison that stands out by its deciding evidence: the smallest Holm-adjusted p (the p the verdict
    used; the raw p where a table judges a row on its own), among the rows significant at the verdict's alpha;
    "no result stands out" when none is (a +0.000, p=1 row is never the headline)."""
    import pandas as pd  # lazy: pandas (a slow import), only for this section

    sub = df[df["comparison"].notna() & df["delta"].notna()]
    deciding = pd.to_numeric(sub["p_holm"] if "p_holm" in sub.columns else sub["p"], errors="coerce")
    sig = sub.assign(_p=deciding, _size=pd.to_numeric(sub["delta"], errors="coerce").abs())
    sig = sig[sig["_p"] < vd.ALPHA].sort_values(["_p", "_size"], ascending=[True, False], kind="stable")
    tested = int(deciding.notna().sum())
    if sig.empty:
        return (f"no result stands out (none of {tested} tested comparisons has Holm p < {vd.ALPHA})" if tested
                else "no result stands out (no comparison carries a test)")
    r = sig.iloc[0]
    ci = f" [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]" if pd.notna(r.get("ci_low")) else ""
    which = "p (Holm)" if "p_holm" in sub.columns else "p"
    more = f" (1 of {len(sig)} with {which} < {vd.ALPHA})" if len(sig) > 1 else ""
    return (f"stands out{more}: {r['comparison']}{_metric_of(r)}: Δ {_fmt(r['delta'])}{ci}, {which}={r['_p']:.3g}"
            f"{_paper_beside(r)}")


def _metric_of(r) -> str:
    m = r.get("metric")
    return f" {str(m).split(',')[0]}" if isinstance(m, str) and m else ""


def _paper_beside(r) -> str:
    """The published delta after ours in a headline, only where the two can be compared: the same metric, and
    its magnitude only at the paper's own scale (elsewhere the sign alone, which is all the verdict judges)."""
    import pandas as pd  # lazy: pandas (a slow import), only for this section

    pub = r.get("published_delta")
    if pub is None or not pd.notna(pub):
        return ""
    pm, m = r.get("published_metric"), r.get("metric")
    same_metric = not (isinstance(pm, str) and isinstance(m, str) and pm != m.split(",")[0])
    same_scale = str(r.get("same_scale", True)) not in ("False", "false", "0")
    if same_metric and same_scale:
        return f", paper {_fmt(pub)}"
    sign = "lower" if float(pub) < 0 else "higher" if float(pub) > 0 else "no change in"
    where = f" at {r.get('published_scale')}" if isinstance(r.get("published_scale"), str) else ""
    what = f" {pm}" if not same_metric else ""
    return f" (paper{where}: {sign}{what}; sign compared only)"


SETUP_COLUMNS = (("params", "parameters"), ("tokens", "training tokens"), ("steps", "steps"),
                 ("tail_k", "tail (evals averaged)"), ("corpus", "corpus"), ("tokenizer", "tokenizer"),
                 ("seq_len", "sequence length"), ("hardware", "hardware"))


def _setup_value(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or str(v) in ("", "nan"):
        return "-"
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int) and abs(v) >= 10 ** 6:
        return f"{v / 1e6:,.1f}M"
    return str(v)


def setup_section(table1_csv: Optional[Path]) -> list[str]:
    """The experimental setup as the runs' own records state it (via table1.csv: one row per size)."""
    lines = ["## Setup", ""]
    if table1_csv is None:
        return lines + ["Table 1 was not generated, so the setup of the runs is not summarised here.", ""]
    import pandas as pd  # lazy: pandas (a slow import), only for this section

    df = pd.read_csv(table1_csv)
    have = [(k, lab) for k, lab in SETUP_COLUMNS if k in df.columns]
    if df.empty or not have:
        return lines + ["The run records carry no setup fields (re-generate table1 from current summaries).", ""]
    lines += ["| size | seeds | " + " | ".join(lab for _, lab in have) + " |",
              "|" + "---|" * (len(have) + 2)]
    for size, sub in df.groupby("size", sort=False):
        r = sub.iloc[0]
        seeds = sorted({str(s) for x in sub.get("seeds", pd.Series(dtype=str)).dropna() for s in str(x).split()})
        lines.append(f"| {size} | {' '.join(seeds) or '-'} | " +
                     " | ".join(_setup_value(r[k]) for k, _ in have) + " |")
    return lines + ["", "Read from each run's summary.json, config.yaml (data) and provenance.json (hardware); "
                        "values of the first run of each size (the runs of one size are paired: they share the resolved config "
                        "apart from the residual section).", ""]


def _size_of(model_path: str) -> Optional[str]:
    parts = Path(model_path).parts
    for i in range(len(parts) - 1, 0, -1):
        if parts[i].startswith("seed") and parts[i][4:].isdigit():
            return parts[i - 1]
    return None


def probe_section(paths: list[Path]) -> list[str]:
    """Markdown for probe JSONs, with the paper's S=4 values at the model's scale where it has one."""
    pub = load_published()
    pr = pub[pub["table"] == "probe"]

    def paper(scale: Optional[str], method: str) -> Optional[float]:
        v = pr[(pr["scale"] == scale) & (pr["method"] == method)]["value"]
        return float(v.iloc[0]) if len(v) else None

    lines = ["## Mechanism probe", "",
             "| model | slices | tokens | KL trained | KL null | trained/null | mean source cosine | paper trained / null |",
             "|---|---|---|---|---|---|---|---|"]
    for p in paths:
        d = json.loads(p.read_text())
        ratio = d["kl_trained"] / d["kl_null"] if d.get("kl_null") else float("nan")
        size = _size_of(str(d.get("model", "")))
        pt, pn = paper(size, "attnres"), paper(size, "null")
        ref = f"{pt:.3f} / {pn:.3f} ({size})" if pt is not None and pn is not None else "- (scale not in paper)"
        lines.append(f"| {d.get('model', p.name)} | {d.get('slices')} | {d.get('n_tokens')} "
                     f"({d.get('token_source', '')}) | {d['kl_trained']:.4f} | {d['kl_null']:.4f} | {ratio:.2f} | "
                     f"{d.get('mean_pairwise_cosine', float('nan')):.3f} | {ref} |")
    pubtxt = ", ".join(f"{s}: trained {paper(s, 'attnres'):.3f} vs null {paper(s, 'null'):.3f}"
                       for s in paper_scales() if paper(s, "attnres") is not None)
    lines += ["", f"**Reading:** a trained KL well above its matched-norm null means the slices of the single-head "
                  f"query point at different depths. Paper (S=4): {pubtxt}.", ""]
    return lines


def build_report(reports: str | Path, out: str | Path, inputs: Optional[Sequence[str | Path]] = None) -> str:
    """Write the report from ``inputs`` (the files it may read; default: the reports folder's own layout,
    ``Inputs``); returns its text."""
    root, out = Path(reports), Path(out)
    have = Inputs(root, inputs)
    here = out.parent
    rel = lambda p: os.path.relpath(p, here)  # noqa: E731
    lines = ["# MHAR reproduction report", "",
             "Generated by `python -m analysis.report` from the files under "
             f"`{root}`; do not edit by hand. Tables and figures are regenerated by the workflow.", ""]
    lines += [f"<sub>{sidecar.FOOTER[0].upper()}{sidecar.FOOTER[1:]}.</sub>", ""]
    t1 = have.find("table1.csv")
    lines += setup_section(t1) + sources_section({n: have.find(f"{n}.csv") for n in TABLES}) + \
        ["## How to read the verdicts", "", vd.VERDICT_RULE, "", vd.COST_RULE, ""]
    missing = []
    for name, spec in TABLES.items():
        title = spec.title
        csv_p, md_p = have.find(f"{name}.csv"), have.find(f"{name}.md")
        if csv_p is None or md_p is None:
            if not spec.optional:
                missing.append(f"table `{name}` ({title}): `python -m analysis.tables {name} --inputs {spec.usage} "
                               f"--out {root}/{name}`")
            continue
        body = md_p.read_text().strip().splitlines()
        if body and body[0].startswith("## "):
            body = body[1:]
        note = [TABLE_NOTES[name], ""] if name in TABLE_NOTES else []
        lines += [f"## {title}", "", f"**Reading:** {table_reading(name, csv_p)}", ""] + note + body + \
                 ["", f"Files: `{rel(csv_p)}`, `{rel(md_p)}`, `{rel(csv_p.with_suffix('.tex'))}`", ""]
    figs = []
    for name, reading in FIGURES.items():
        png = have.find(f"{name}.png")
        if png is None:
            missing.append(f"figure `{name}`: `python -m analysis.figures {name} --inputs ... "
                           f"--out {root}/figures/{name}`")
            continue
        figs += [f"### {name}", "", f"![{name}]({rel(png)})", "", f"**Reading:** {reading}", ""]
    if figs:
        lines += ["## Figures", ""] + figs
    probes = have.probes(out)
    if probes:
        lines += probe_section(probes)
    else:
        missing.append(f"mechanism probe: `python -m eval.probe --model RUN_DIR/model.pt --out {root}/probe/<name>.json`")
    lines += ["## Missing", ""] + ([f"- {m}" for m in missing] if missing
                                   else ["Nothing: every table and figure is present."])
    text = "\n".join(lines) + "\n"
    atomic_write_text(out, text)  # same-folder temp + fsync + rename
    sidecar.write(out, provenance([str(root)]))
    return text


def _is_probe(p: Path) -> bool:
    try:
        d = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return False
    return isinstance(d, dict) and "kl_trained" in d and "kl_null" in d


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reports", default="reports", help="directory holding tables/figures/probe outputs")
    ap.add_argument("--out", default="reports/REPORT.md")
    ap.add_argument("--inputs", nargs="+", default=None,
                    help="the tables (.csv, .md), figures (.png) and probe JSONs to report (default: those of the "
                         "--reports folder's own layout, not its subfolders of other configs)")
    a = ap.parse_args(argv)
    if not Path(a.reports).is_dir():
        print(f"error: {a.reports}: not a directory", file=sys.stderr)
        return 2
    build_report(a.reports, a.out, a.inputs)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
