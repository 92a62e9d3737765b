"""Result tables (CSV + Markdown + LaTeX), each with the published value beside ours and a verdict.

    python -m eval.tables {table1,downstream,cpt,heads,seeds,cost} --inputs FILES... --out PREFIX

writes PREFIX.csv (raw numbers), PREFIX.md and PREFIX.tex (formatted, with notes and provenance).
Inputs: table1/heads/seeds take summary.json files (or run dirs); downstream takes eval dirs of the
baseline and the variants (which run each dir belongs to is read from results.json / the path);
cpt takes three eval dirs base, plain, mhar (or one JSON/YAML manifest {base, plain, mhar, scale});
cost takes benchmark CSVs. A row is one residual config (variant, heads and every other residual knob; knobs
that differ from their defaults are shown in the row name) at one size, and pools only runs that differ by
seed; rows are paired by seed. Which run a file belongs to is read from its records (the ``run`` block, else
the flat keys / config.yaml of older records), never from its path. Two runs are paired only when their
resolved configs differ in the residual section alone (``mhar.runs.config.PAIRING_VARIES``): same size, same
train and data seeds, same data order and schedule; CPT arms may also differ in their start checkpoint.
Anything else exits 2 with one ``error:`` line naming both runs and the first field that differs.

Every table CSV carries the common columns ``comparison, delta, ci_low, ci_high, p, p_holm,
published_delta, judged, verdict`` (empty where not applicable) so forest plots and the report can
read any of them. Tests, multiplicity and the verdict rule live in ``eval.verdict``.
"""
from __future__ import annotations

import argparse
import csv
import io as io_text
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from mhar.runs.atomic import atomic_write_text

from . import lm_metrics, sidecar
from . import results_io as io
from . import stats as st
from . import verdict as vd

KINDS = ("table1", "downstream", "cpt", "heads", "seeds", "cost")
COMMON = ["comparison", "delta", "ci_low", "ci_high", "p", "p_holm", "published_delta", "judged", "verdict"]
# the metric the paper reports for each task (lm-eval names); lower_is_better for perplexities
PRIMARY_METRIC = {"wikitext": "word_perplexity", "lambada_openai": "acc", "lambada": "acc", "hellaswag": "acc",
                  "gsm8k": "exact_match", "gpqa_main_zeroshot": "acc", "mmlu": "acc",
                  "minerva_math": "exact_match", "humaneval": "pass@1", "mbpp": "pass@1"}
RULE_POINTER = ("Verdicts: eval/verdict.py VERDICT_RULE (quoted once at the top of REPORT.md); p = the test named "
                "in the notes, p (Holm) = adjusted across this table's rows.")


@dataclass
class Column:
    header: str
    fmt: Callable[[dict], str]


@dataclass
class Table:
    """A generated table: raw rows for CSV, display columns for Markdown/LaTeX, notes, provenance."""

    name: str
    title: str
    rows: list[dict]
    columns: list[Column]
    notes: list[str] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)

    def csv_fields(self) -> list[str]:
        keys: list[str] = []
        for r in self.rows:
            for k in r:
                if k not in keys:
                    keys.append(k)
        return COMMON + [k for k in keys if k not in COMMON]


# --- formatting helpers ---------------------------------------------------------------------------
def _ok(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and not math.isfinite(x))


def f_num(x: Any, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if _ok(x) else "-"


def f_sd(m: Any, s: Any, nd: int = 3) -> str:
    if not _ok(m):
        return "-"
    return f"{m:.{nd}f} ± {s:.{nd}f}" if _ok(s) else f"{m:.{nd}f}"


def f_ci(d: Any, lo: Any, hi: Any, nd: int = 3) -> str:
    if not _ok(d):
        return "-"
    s = f"{d:+.{nd}f}"
    return f"{s} [{lo:+.{nd}f}, {hi:+.{nd}f}]" if _ok(lo) and _ok(hi) else s


def f_p(p: Any) -> str:
    if not _ok(p):
        return "-"
    return "<0.001" if p < 1e-3 else f"{p:.3f}"


def _with_scale(text: str, r: dict) -> str:
    """Mark a published number taken from another scale, e.g. '3.031 (100M)'."""
    if text == "-" or r.get("same_scale", True) or not r.get("published_scale"):
        return text
    return f"{text} ({r['published_scale']})"


def _paired_cols(res: Optional[st.PairedResult]) -> dict:
    if res is None:
        return {"delta": None, "ci_low": None, "ci_high": None, "p": None}
    return {"delta": res.estimate, "ci_low": res.ci_low, "ci_high": res.ci_high, "p": res.p_value}


# --- writers ------------------------------------------------------------------------------------------
def to_markdown(t: Table) -> str:
    lines = [f"## {t.title}", ""]
    hdr = [c.header for c in t.columns]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "|".join("---" for _ in hdr) + "|")
    for r in t.rows:
        lines.append("| " + " | ".join(c.fmt(r).replace("|", "/") for c in t.columns) + " |")
    if not t.rows:
        lines.append("| " + " | ".join("-" for _ in hdr) + " |")
    lines.append("")
    for n in t.notes:
        lines.append(f"- {n}")
    prov = t.provenance
    if prov:
        cmd = prov.get("command", "")
        if len(cmd) > 240:
            cmd = cmd[:200] + f" ... ({len(prov.get('inputs', []))} inputs)"
        lines += ["", f"<sub>Generated by `{cmd}` from {len(prov.get('inputs', []))} input file(s); "
                      f"{sidecar.FOOTER}. Do not edit by hand.</sub>", "",
                  "<details><summary>inputs</summary>", ""] + [f"- `{p}`" for p in prov.get("inputs", [])] + \
                 ["", "</details>"]
    return "\n".join(lines) + "\n"


_TEX_ESC = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def tex_escape(s: str) -> str:
    s = "".join(_TEX_ESC.get(ch, ch) for ch in s)
    return s.replace("±", r"$\pm$").replace("Δ", r"$\Delta$").replace("<0.001", r"$<$0.001")


def to_latex(t: Table) -> str:
    n = len(t.columns)
    cmd = " ".join(str(t.provenance.get("command", "")).split())[:300]
    out = [f"% generated by eval.tables ({cmd}); do not edit by hand",
           r"\begin{table}[t]", r"\centering", r"\small", f"\\caption{{{tex_escape(t.title)}}}",
           f"\\label{{tab:{t.name}}}", f"\\begin{{tabular}}{{{'l' * n}}}", r"\toprule",
           " & ".join(tex_escape(c.header) for c in t.columns) + r" \\", r"\midrule"]
    for r in t.rows:
        out.append(" & ".join(tex_escape(c.fmt(r)) for c in t.columns) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}"]
    if t.notes:
        out.append(r"\par\footnotesize " + " ".join(tex_escape(x) for x in t.notes))
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def write_table(t: Table, prefix: str | Path) -> list[Path]:
    """Write PREFIX.csv, PREFIX.md, PREFIX.tex; returns the three paths."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = [prefix.with_name(prefix.name + ext) for ext in (".csv", ".md", ".tex")]
    fields = t.csv_fields()
    buf = io_text.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in t.rows:
        w.writerow({k: ("" if not _ok(r.get(k)) else r.get(k)) for k in fields})
    for path, text in zip(paths, (buf.getvalue(), to_markdown(t), to_latex(t))):
        atomic_write_text(path, text)  # same-folder temp + fsync + rename: a kill never leaves half a table
    sidecar.write(prefix, t.provenance)
    return paths


# --- from-scratch tables (summary.json) ---------------------------------------------------------------
def _published_loss(pub, size: str, variant: str, heads: Optional[int]) -> tuple[Optional[float], Optional[float], bool]:
    """(published loss of this variant, published delta vs baseline, same scale) from Table 1.

    MHAR with an H the paper did not run uses the paper's headline H=8 row (noted in the table)."""
    scale, same = io.paper_scale(size)
    base = io.published_value(pub, "table1", scale, "baseline", "tail_mean_val_loss")
    if variant == "baseline":
        return base, None, same
    h = heads
    if variant == "mhar" and heads not in (8, 16):
        h = 8
    v = io.published_value(pub, "table1", scale, variant, "tail_mean_val_loss",
                           heads=h if variant in ("mhar", "attnres") else None)
    return v, (v - base if v is not None and base is not None else None), same


def _judge(rows: list[dict], results: list[Optional[st.PairedResult]], judge: Optional[list[bool]] = None) -> None:
    """Holm across the family (the rows that carry a test), then the verdict of each judged row."""
    judge = judge or [res is not None for res in results]
    adj = vd.holm([res.p_value if (res is not None and j) else None for res, j in zip(results, judge)])
    for row, res, j, pa in zip(rows, results, judge, adj):
        if not j:
            continue
        row["p_holm"] = pa if math.isfinite(pa) else None
        one = bool(row.get("single_seed"))  # one trained model per arm: the verdict is about these two models
        row["judged"] = vd.judged_on(bool(row.get("same_scale")), one)
        row["verdict"] = vd.decide(res, row.get("published_delta"), bool(row.get("same_scale")),
                                   pa if math.isfinite(pa) else None, single_seed=one)


def _describe(r: io.RunSummary) -> str:
    return io.describe_run(r.ident, r.run_dir)


def check_pair(a: dict, wa: Any, b: dict, wb: Any, ignore: Sequence[str] = ()) -> None:
    """Runs ``a`` and ``b`` (run_identity dicts, at ``wa`` / ``wb``) may be paired, else one AnalysisInputError
    naming both and the first field that differs."""
    diff = io.pairing_difference(a, b, ignore)
    if diff is not None:
        raise io.AnalysisInputError(
            f"cannot pair {io.describe_run(a, wa)} with {io.describe_run(b, wb)}: their resolved configs differ in "
            f"{diff}, not only in the residual section; paired runs share everything else (size, seeds, data "
            "order, schedule): train both from one config")


def pair_groups(var: dict[int, io.RunSummary], ref: dict[int, io.RunSummary]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(seeds, variant values, reference values) of two run groups that may be paired: the same seeds, and per
    seed resolved configs that differ in the residual section alone. Anything else is an AnalysisInputError
    naming both runs and the first field that differs."""
    v0, r0 = next(iter(var.values())), next(iter(ref.values()))
    if set(var) != set(ref):
        raise io.AnalysisInputError(
            f"cannot pair {v0.name} {v0.size} (seeds {sorted(var)}, e.g. {v0.run_dir}) with {r0.name} {r0.size} "
            f"(seeds {sorted(ref)}, e.g. {r0.run_dir}): seed sets differ; pass the same seeds for both")
    seeds = sorted(var)
    for s in seeds:
        check_pair(var[s].ident, var[s].run_dir, ref[s].ident, ref[s].run_dir)
    return (seeds, np.array([var[s].tail_mean_val_loss for s in seeds]),
            np.array([ref[s].tail_mean_val_loss for s in seeds]))


def reference_group(groups: dict[tuple, dict], key: tuple, want: Callable[[tuple], bool],
                    ident: Callable[[Any], dict] = lambda r: r.ident) -> Optional[tuple]:
    """The row that row ``key`` is compared with: among the rows ``want`` accepts (e.g. the baseline of the same
    size), the one whose runs pair with ``key``'s. None when there is no candidate; the only candidate even when
    it does not pair (pairing then names the field that differs); an error when several pair."""
    cands = [g for g in groups if g != key and want(g)]
    if len(cands) <= 1:
        return cands[0] if cands else None
    var = groups[key]
    s0 = min(var)
    ok = [g for g in cands if s0 in groups[g] and io.pairing_difference(ident(var[s0]), ident(groups[g][s0])) is None]
    if len(ok) == 1:
        return ok[0]
    if not ok:
        return cands[0]
    names = ", ".join(io.variant_label(g[0], g[2], g[3]) for g in ok)
    v = ident(var[s0])
    raise io.AnalysisInputError(f"{io.variant_label(key[0], key[2], key[3])} {key[1]} ({v['where']}) pairs with "
                                f"{len(ok)} reference rows ({names}); pass the runs of one of them")


_ORDER = {v: i for i, v in enumerate(("baseline", "hyper", "attnres", "block_attnres", "mhar", "mhar_hw", "mhar_delta"))}
_SIZE_ORDER = {s: i for i, s in enumerate(("debug", "tiny", "small", "100M", "350M", "1B", "8B"))}


def _group_key(g: tuple) -> tuple:
    v, s, h, knobs = g
    return (_SIZE_ORDER.get(s, 99), s, _ORDER.get(v, 99), v, h or 0, str(knobs))


def _is_baseline_of(size: str) -> Callable[[tuple], bool]:
    return lambda g: g[0] == "baseline" and g[1] == size


def _seeds_text(seeds: Sequence[int]) -> str:
    return " ".join(map(str, seeds))


P_COLS = [lambda: Column("p", lambda r: f_p(r.get("p"))), lambda: Column("p (Holm)", lambda r: f_p(r.get("p_holm")))]
JUDGE_COLS = [lambda: Column("judged", lambda r: r.get("judged") or "-"),
              lambda: Column("verdict", lambda r: r.get("verdict") or "-")]


def table1(summaries: Sequence[str | Path], published=None) -> Table:
    """Tail-mean validation loss, variant x size: mean ± sd over seeds, paired delta vs baseline (seeds = unit)."""
    pub = io.load_published() if published is None else published
    runs = io.load_summaries(summaries)
    groups = io.group_runs(runs)
    rows, results = [], []
    shown = io.shown_knobs(groups)
    for g in sorted(groups, key=_group_key):
        variant, size, heads, _ = g
        knobs = shown[g]
        byseed = groups[g]
        losses = np.array([r.tail_mean_val_loss for r in byseed.values()])
        first = byseed[min(byseed)]
        row = {"size": size, "variant": variant, "heads": heads, "method": io.variant_label(variant, heads, knobs, first.name),
               "residual": io.knobs_text(knobs), "seeds": _seeds_text(sorted(byseed)), "n_seeds": len(byseed),
               "loss_mean": float(losses.mean()), "loss_sd": float(losses.std(ddof=1)) if losses.size > 1 else None,
               "pairing": ",".join(sorted({r.pairing for r in byseed.values()})),
               "run_label": ",".join(sorted({r.name for r in byseed.values()})),
               "params": first.params, "tokens": first.tokens, "steps": first.steps, "tail_k": first.tail_k,
               **{k: first.setup.get(k) for k in ("corpus", "tokenizer", "seq_len", "hardware")}}
        pub_loss, pub_delta, same = _published_loss(pub, size, variant, heads)
        row.update(published_loss=pub_loss, published_delta=pub_delta, same_scale=same,
                   published_scale=io.paper_scale(size)[0],
                   comparison=f"{row['method']} - baseline ({size})")
        ref = reference_group(groups, g, _is_baseline_of(size)) if variant != "baseline" else None
        res = None
        if ref is not None:
            seeds, a, b = pair_groups(byseed, groups[ref])
            res = vd.seed_evidence(a, b)
            row.update(seeds=_seeds_text(seeds), n_pairs=len(seeds), test=res.method,
                       mde80=st.mde_paired(len(seeds), float(np.std(a - b, ddof=1)) if len(seeds) > 1 else math.nan))
        row.update(_paired_cols(res))
        if variant == "baseline":
            row["comparison"] = ""
        rows.append(row)
        results.append(res)
    _judge(rows, results)
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: r["seeds"]),
            Column("tail-mean val loss", lambda r: f_sd(r["loss_mean"], r["loss_sd"])),
            Column("Δ vs baseline [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            *(c() for c in P_COLS),
            Column("paper loss", lambda r: _with_scale(f_num(r["published_loss"]), r)),
            Column("paper Δ", lambda r: _with_scale(f_ci(r["published_delta"], None, None), r)),
            *(c() for c in JUDGE_COLS)]
    notes = ["Δ = variant - baseline on the same seeds (seed = data order, so runs are paired; 'seeds' lists the "
             "seeds actually paired). Unit: the seed; test: paired t over seeds (t interval); one seed gives no CI.",
             "Paper: Table 1 (anneal corpus, 20K steps); MHAR with H not in {8, 16} is compared with the paper's "
             "H=8 row.", vd.SCALE_NOTE, RULE_POINTER]
    return Table("table1", "Table 1: tail-mean validation loss (ours vs paper)", rows, cols, notes,
                 io.provenance(summaries))


def seeds_table(summaries: Sequence[str | Path], published=None) -> Table:
    """Per-seed paired deltas vs baseline (descriptive), against the paper's seed table. The test and the
    verdict of these very deltas are Table 1's (same runs, same test): not repeated, so not counted twice."""
    pub = io.load_published() if published is None else published
    groups = io.group_runs(io.load_summaries(summaries))
    rows = []
    shown = io.shown_knobs(groups)
    for g in sorted(groups, key=_group_key):
        variant, size, heads, _ = g
        knobs = shown[g]
        ref = reference_group(groups, g, _is_baseline_of(size)) if variant != "baseline" else None
        if ref is None:
            continue
        seeds, a, b = pair_groups(groups[g], groups[ref])
        d = a - b
        scale, same = io.paper_scale(size)
        pd_ = io.published_value(pub, "seeds", scale, variant, "delta_vs_baseline")
        psd = None
        if pd_ is not None:
            sel = pub[(pub["table"] == "seeds") & (pub["scale"] == scale) & (pub["method"] == variant)]
            psd = float(sel["sd"].iloc[0]) if not sel.empty and np.isfinite(sel["sd"].iloc[0]) else None
        label = io.variant_label(variant, heads, knobs, next(iter(groups[g].values())).name)
        rows.append({"size": size, "variant": variant, "heads": heads, "method": label, "residual": io.knobs_text(knobs),
                     "run_label": ",".join(sorted({r.name for r in groups[g].values()})),
                     "seeds": _seeds_text(seeds),
                     "n_pairs": len(seeds), "per_seed_delta": " ".join(f"{x:+.4f}" for x in d),
                     "delta": float(d.mean()), "delta_sd": float(d.std(ddof=1)) if d.size > 1 else None,
                     "pairing_corr": float(np.corrcoef(a, b)[0, 1]) if d.size > 2 and a.std() > 0 and b.std() > 0 else None,
                     "mde80": st.mde_paired(len(seeds), float(d.std(ddof=1))) if d.size > 1 else None,
                     "published_delta": pd_, "published_sd": psd, "same_scale": same, "published_scale": scale,
                     "comparison": f"{label} - baseline ({size}, seeds)"})
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: r["seeds"]), Column("per-seed Δ", lambda r: r["per_seed_delta"]),
            Column("mean Δ ± sd", lambda r: f_sd(r["delta"], r["delta_sd"])),
            Column("MDE (80%)", lambda r: f_num(r.get("mde80"))),
            Column("paper Δ ± sd", lambda r: _with_scale(f_sd(r["published_delta"], r["published_sd"]), r))]
    notes = ["Paired by seed (data order). sd = per-seed sd of the paired differences; MDE = smallest |Δ| a "
             "two-sided paired t-test with these seeds detects with 80% power at alpha 0.05.",
             "Descriptive: the test and verdict of these deltas are in Table 1 (same runs, same paired t), so each "
             "result is counted once.",
             "Paper: seed table of the FineWeb-Edu replication (3 seeds)."]
    return Table("seeds", "Seed table: per-seed paired deltas vs baseline", rows, cols, notes,
                 io.provenance(summaries))


def heads_table(summaries: Sequence[str | Path], published=None) -> Table:
    """Routing head-count sweep: loss vs H (H=1 = AttnRes), paired delta vs the smallest H (seeds = unit)."""
    pub = io.load_published() if published is None else published
    groups = io.group_runs(io.load_summaries(summaries))
    by_size: dict[tuple, dict[int, dict]] = {}  # one sweep per size and residual knobs (besides H)
    shown = io.shown_knobs([g for g in groups if g[0] in ("mhar", "attnres")], by_variant=False)
    for (variant, size, heads, _), runs in groups.items():
        if variant in ("mhar", "attnres"):
            h, knobs = (1 if variant == "attnres" else heads), shown[(variant, size, heads, _)]
            if h in by_size.setdefault((size, knobs), {}):
                raise io.AnalysisInputError(f"size {size}: both attnres and mhar H=1 runs given; pass one of them")
            by_size[(size, knobs)][h] = runs
    rows, results = [], []
    for size, knobs in sorted(by_size, key=lambda sk: (_SIZE_ORDER.get(sk[0], 99), sk[0], str(sk[1]))):
        hs = by_size[(size, knobs)]
        ref_h = min(hs)
        scale, same = io.paper_scale(size)
        ptab = "heads" if scale == "1B" or not same else "table1"
        pscale = "1B" if ptab == "heads" else scale
        pub_of = lambda h: io.published_value(pub, ptab, pscale, "attnres" if (h == 1 and ptab == "table1") else "mhar",  # noqa: E731
                                              "tail_mean_val_loss", heads=h)
        means = {h: float(np.mean([r.tail_mean_val_loss for r in runs.values()])) for h, runs in hs.items()}
        best = min(means, key=means.get)
        for h in sorted(hs):
            losses = np.array([r.tail_mean_val_loss for r in hs[h].values()])
            res, seeds = None, sorted(hs[h])
            if h != ref_h:
                seeds, a, b = pair_groups(hs[h], hs[ref_h])
                res = vd.seed_evidence(a, b)
            pl, pref = pub_of(h), pub_of(ref_h)
            pdelta = pl - pref if (pl is not None and pref is not None and h != ref_h) else None
            rows.append({"size": size, "heads": h, "residual": io.knobs_text(knobs), "seeds": _seeds_text(seeds),
                         "n_seeds": len(losses),
                         "loss_mean": float(losses.mean()),
                         "loss_sd": float(losses.std(ddof=1)) if losses.size > 1 else None,
                         "best": h == best, "interior_best": best not in (min(hs), max(hs)),
                         "published_loss": pl, "published_table": f"{ptab}:{pscale}", "published_scale": pscale,
                         "published_delta": pdelta, "same_scale": same, "test": res.method if res else None,
                         "comparison": "" if h == ref_h else f"H={h} - H={ref_h} ({size}"
                                       + (f", {io.knobs_text(knobs)})" if knobs else ")"), **_paired_cols(res)})
            results.append(res)
    _judge(rows, results)
    cols = [Column("size", lambda r: r["size"]),
            Column("H", lambda r: str(r["heads"]) + (f" ({r['residual']})" if r["residual"] else "")
                   + (" *" if r["best"] else "")),
            Column("seeds", lambda r: r["seeds"]),
            Column("tail-mean val loss", lambda r: f_sd(r["loss_mean"], r["loss_sd"])),
            Column("Δ vs smallest H [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            *(c() for c in P_COLS), Column("paper loss", lambda r: _with_scale(f_num(r["published_loss"]), r)),
            Column("paper Δ", lambda r: _with_scale(f_ci(r["published_delta"], None, None), r)),
            *(c() for c in JUDGE_COLS)]
    notes = ["* = lowest mean loss; the paper's U-shape means the best H is interior (neither the smallest nor "
             "the largest H swept).", "Unit: the seed (paired t over seeds vs the smallest H).",
             "H=1 is single-head AttnRes. Paper: 1B head sweep (8 KV heads) for 1B and "
             "non-paper sizes, Table 1 (H=1/8/16) for 100M/350M.", vd.SCALE_NOTE, RULE_POINTER]
    return Table("heads", "Routing head-count sweep", rows, cols, notes, io.provenance(summaries))


# --- question-level comparisons ---------------------------------------------------------------------
def primary_metric(task: io.EvalTask) -> str:
    names = task.metric_names()
    want = PRIMARY_METRIC.get(task.task)
    for n in names:
        if want is not None and n.split(",")[0] == want:
            return n
    for key in ("acc", "exact_match", "pass@1", "word_perplexity", "perplexity"):
        for n in names:
            if n.split(",")[0] == key:
                return n
    if not names:
        raise io.AnalysisInputError(f"{task.path}: no metrics recorded")
    return names[0]


@dataclass
class Comparison:
    """a - b on the same documents of one task; ``result`` is the deciding evidence (eval.verdict)."""

    value_a: float
    value_b: float
    result: st.PairedResult
    mde80: Optional[float]
    kind: str  # "perplexity" | "binary" | "score"
    mcnemar: Optional[st.McNemarResult] = None
    cluster: Optional[st.PairedResult] = None


def compare_task(a: io.EvalTask, b: io.EvalTask, metric: str, *, n_resamples: int = 4999, seed: int = 0) -> Comparison:
    """One model per arm: the question-level (or document-level) evidence of eval.verdict."""
    ids = io.align(a, b)
    xa, wa = io.metric_arrays(a, metric, ids)
    xb, wb = io.metric_arrays(b, metric, ids)
    if wa is not None:
        if wb is None:
            raise io.AnalysisInputError(f"{a.path} vs {b.path}: metric {metric!r} stored differently")
        res = vd.perplexity_evidence(xa, xb, wa, wb, n_resamples=n_resamples, seed=seed, metric=metric)
        z = 2.8016  # z_{0.975} + z_{0.80}
        return Comparison(lm_metrics.corpus_value(metric, xa, wa), lm_metrics.corpus_value(metric, xb, wb), res,
                          z * res.se, "perplexity")
    groups = [a.docs[k].get("group") for k in ids]
    clusters = groups if all(g is not None for g in groups) else None
    res = vd.question_evidence(xa, xb, clusters, n_resamples=n_resamples, seed=seed)
    binary = bool(np.isin(xa, (0, 1)).all() and np.isin(xb, (0, 1)).all())
    d = xa - xb
    mde = st.mde_paired(d.size, float(np.std(d, ddof=1))) if d.size > 1 else None
    cl = res if res.method.startswith("cluster") else None
    mc = st.mcnemar_exact(*st.discordant_counts(xa, xb)) if binary else None
    return Comparison(float(xa.mean()), float(xb.mean()), res, mde, "binary" if binary else "score", mc, cl)


def _eval_groups(eval_dirs: Sequence[str | Path]) -> dict[tuple, dict[int, tuple[Path, dict]]]:
    """{(variant, size, heads, knobs): {seed: (eval dir, identity)}} from the records of each eval dir; the runs
    of one group (a row) differ only by seed."""
    out: dict[tuple, dict[int, tuple[Path, dict]]] = {}
    for d in eval_dirs:
        d = Path(d)
        info = io.identify_eval(d)
        g = out.setdefault((info["variant"], info["size"], info["heads"], info["knobs"]), {})
        if info["seed"] in g:
            raise io.AnalysisInputError(f"{d} and {g[info['seed']][0]}: two evaluations of {info['label']} "
                                        f"{info['size']} seed {info['seed']}; pass each run's eval dir once")
        g[info["seed"]] = (d, info)
    for g in out.values():
        io.check_row([(info, d) for _, (d, info) in sorted(g.items())])
    return out


def _pair_evals(var: dict[int, tuple[Path, dict]], ref: dict[int, tuple[Path, dict]]) -> list[int]:
    (vd0, vi0), (rd0, ri0) = next(iter(var.values())), next(iter(ref.values()))
    if set(var) != set(ref):
        raise io.AnalysisInputError(
            f"cannot pair {vi0['label']} {vi0['size']} (seeds {sorted(var)}, e.g. {vd0}) with {ri0['label']} "
            f"{ri0['size']} (seeds {sorted(ref)}, e.g. {rd0}): seed sets differ; evaluate the same seeds for both")
    for s in sorted(var):
        (dv, iv), (dr, ir) = var[s], ref[s]
        check_pair(iv, dv, ir, dr)
    return sorted(var)


def downstream_table(eval_dirs: Sequence[str | Path], published=None, n_resamples: int = 4999) -> Table:
    """Zero-shot downstream metrics: each variant vs the baseline of the same size on the same seeds, per task.

    One seed: questions (or documents) are the unit, and the verdict can only say whether these two models
    differ (eval.verdict VERDICT_RULE); several seeds: the seed is the unit."""
    pub = io.load_published() if published is None else published
    groups = _eval_groups(eval_dirs)
    rows, results, missing = [], [], []
    shown = io.shown_knobs(groups)
    for key in sorted(groups, key=_group_key):
        variant, size, heads, _ = key
        knobs = shown[key]
        if variant == "baseline":
            continue
        var = groups[key]
        rkey = reference_group(groups, key, _is_baseline_of(size), ident=lambda m: m[1])
        if rkey is None:
            missing.append(f"{next(iter(var.values()))[0]} (no baseline eval for size {size})")
            continue
        ref = groups[rkey]
        seeds = _pair_evals(var, ref)
        label = io.variant_label(variant, heads, knobs, next(iter(var.values()))[1]["label"])
        scale, same = io.paper_scale(size)
        tasks = set.intersection(*(set(io.eval_tasks(d)) for s in seeds for d in (var[s][0], ref[s][0])))
        for task in sorted(tasks):
            per_seed = []
            for s in seeds:
                ta, tb = io.load_eval_task(var[s][0], task), io.load_eval_task(ref[s][0], task)
                metric = lm_metrics.for_tokenizer(primary_metric(ta), ta.metric_names(), var[s][1])
                per_seed.append(compare_task(ta, tb, metric, n_resamples=n_resamples))
            c0 = per_seed[0]
            if len(seeds) == 1:
                res, mde = c0.result, c0.mde80
            else:
                va, vb = [c.value_a for c in per_seed], [c.value_b for c in per_seed]
                res = vd.seed_level_evidence(va, vb)
                sd = float(np.std(np.subtract(va, vb), ddof=1))
                mde = st.mde_paired(len(seeds), sd)
            mname = lm_metrics.published_metric(metric)
            pv = io.published_value(pub, "downstream", scale, "mhar", mname, task=task) if variant == "mhar" else None
            pb = io.published_value(pub, "downstream", scale, "baseline", mname, task=task)
            pdelta = pv - pb if pv is not None and pb is not None else None
            one = len(seeds) == 1
            rows.append({"size": size, "seeds": _seeds_text(seeds), "n_seeds": len(seeds), "single_seed": one,
                         "variant": variant, "heads": heads, "method": label, "residual": io.knobs_text(knobs),
                         "task": task, "metric": metric,
                         "n": c0.result.n if one else len(seeds), "n_questions": len(io.align(ta, tb)),
                         "ours_variant": float(np.mean([c.value_a for c in per_seed])),
                         "ours_baseline": float(np.mean([c.value_b for c in per_seed])),
                         "published_variant": pv, "published_baseline": pb, "published_delta": pdelta,
                         "published_metric": mname,
                         "same_scale": same, "published_scale": scale, "mde80": mde, "test": res.method,
                         "unit": "seeds" if not one else "documents" if c0.kind == "perplexity" else "questions",
                         "discordant_variant_better": c0.mcnemar.b if (one and c0.mcnemar) else None,
                         "discordant_baseline_better": c0.mcnemar.c if (one and c0.mcnemar) else None,
                         "mcnemar_p": c0.mcnemar.p_value if (one and c0.mcnemar) else None,
                         "cluster_se": c0.cluster.se if (one and c0.cluster) else None,
                         "comparison": f"{label} - baseline: {task} ({size}, seeds {_seeds_text(seeds)})",
                         **_paired_cols(res)})
            results.append(res)
    _judge(rows, results)
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: r["seeds"]), Column("task / metric", lambda r: f"{r['task']} {r['metric']}"),
            Column("n", lambda r: f"{r['n']} {r['unit']}"),
            Column("baseline", lambda r: f_num(r["ours_baseline"])),
            Column("variant", lambda r: f_num(r["ours_variant"])),
            Column("Δ [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            Column("test", lambda r: r["test"]), *(c() for c in P_COLS),
            Column("MDE (80%)", lambda r: f_num(r["mde80"])),
            Column("paper base / MHAR", lambda r: _with_scale(
                f"{f_num(r['published_baseline'])} / {f_num(r['published_variant'])}"
                + lm_metrics.unit_note(r["metric"], r["published_metric"]), r)),
            Column("paper Δ", lambda r: _with_scale(f_ci(r["published_delta"], None, None)
                                                    + lm_metrics.unit_note(r["metric"], r["published_metric"]), r)),
            *(c() for c in JUDGE_COLS)]
    notes = [lm_metrics.NOTE,
             "Paired by document (same doc_id and prompt) and by seed. One seed: 0/1 scores use the exact McNemar p "
             "with a percentile-bootstrap CI, or the cluster-robust t (CR1, clusters - 1 df) when questions share a "
             "context (HellaSwag); perplexity uses the document bootstrap with per-document swap p. Several seeds: "
             "paired t over seeds of the per-seed metric. The column 'test' names the test whose p is printed. "
             "Accuracies are fractions (the paper's percentages / 100).",
             "One training seed per arm: the question-level test shows only whether these two trained models "
             f"differ ('{vd.MODELS_DIFFER}' / '{vd.NO_DIFFERENCE}'), never that the method reproduces; "
             "that takes 2 or more seeds per arm (the seed is then the unit).",
             "Paper: Table 2 (zero-shot, 200 examples); its MHAR rows are compared with our MHAR runs of any H.",
             vd.SCALE_NOTE, RULE_POINTER] + [f"skipped: {m}" for m in missing]
    return Table("downstream", "Downstream zero-shot evaluation (paired vs baseline)", rows, cols, notes,
                 io.provenance([str(d) for d in eval_dirs]))


def _cpt_inputs(inputs: Sequence[str | Path]) -> tuple[Path, Path, Path, Optional[str], Optional[dict]]:
    """(base, plain, mhar eval dirs, scale, batch check) from three dirs or a manifest."""
    if len(inputs) == 3:
        return Path(inputs[0]), Path(inputs[1]), Path(inputs[2]), None, None
    if len(inputs) == 1 and Path(inputs[0]).is_file():
        m = io.read_yaml(inputs[0]) or {}  # safe: a python tag is refused, never executed
        for k in ("base", "plain", "mhar"):
            if not isinstance(m, dict) or k not in m:
                raise io.AnalysisInputError(f"{inputs[0]}: CPT manifest needs keys base, plain, mhar (eval dirs)")
        root = Path(inputs[0]).parent
        rel = lambda p: Path(p) if Path(p).is_absolute() else root / p  # noqa: E731
        return rel(m["base"]), rel(m["plain"]), rel(m["mhar"]), m.get("scale"), m.get("batch_check")
    raise io.AnalysisInputError("cpt takes three eval dirs (base plain mhar) or one manifest file")


def batch_check_passed(batch_check: Optional[dict]) -> Optional[bool]:
    """True / False from a CPT batch check record ({identical: bool, ...}); None when there is none."""
    if batch_check is None:
        return None
    return isinstance(batch_check, dict) and batch_check.get("identical") is True


def cpt_table(inputs: Sequence[str | Path], published=None, n_resamples: int = 4999) -> Table:
    """Continued pretraining: CPT gain, total gain, and MHAR gain (difference-in-differences) per task."""
    pub = io.load_published() if published is None else published
    base_d, plain_d, mhar_d, scale, batch_check = _cpt_inputs(inputs)
    from .cpt import check_arms

    unchecked = check_arms(plain_d, mhar_d)  # data order / schedule differ: refused, with or without a manifest
    same = scale == "8B"
    checked = batch_check_passed(batch_check)
    tasks = sorted(set(io.eval_tasks(base_d)) & set(io.eval_tasks(plain_d)) & set(io.eval_tasks(mhar_d)))
    rows, results = [], []
    for task in tasks:
        tb, tp, tm = (io.load_eval_task(d, task) for d in (base_d, plain_d, mhar_d))
        metric = primary_metric(tm)
        with_mhar = set(io.align(tb, tm))
        ids = [k for k in io.align(tb, tp) if k in with_mhar]
        for t in (tb, tp, tm):
            t.docs = {k: t.docs[k] for k in ids}
        cpt = compare_task(tp, tb, metric, n_resamples=n_resamples)
        total = compare_task(tm, tb, metric, n_resamples=n_resamples)
        gain = compare_task(tm, tp, metric, n_resamples=n_resamples)
        mname = metric.split(",")[0]
        pb, pp, pm = (io.published_value(pub, "cpt", "8B", m, mname, task=task) for m in ("base", "plain", "mhar"))
        pdelta = pm - pp if pm is not None and pp is not None else None
        row = {"task": task, "metric": metric, "n": gain.result.n, "base": cpt.value_b, "plain": cpt.value_a,
               "mhar": gain.value_a, "published_base": pb, "published_plain": pp, "published_mhar": pm,
               "published_delta": pdelta, "same_scale": same, "mde80": gain.mde80,
               "comparison": f"MHAR - plain CPT: {task}", **_paired_cols(gain.result), "test": gain.result.method,
               "single_seed": True,  # one run per arm: the verdict is about these two models
               "batch_check": {None: "absent", True: "identical", False: "FAILED"}[checked]}
        for name, c in (("cpt_gain", cpt), ("total_gain", total)):
            row.update({name: c.result.estimate, f"{name}_ci_low": c.result.ci_low,
                        f"{name}_ci_high": c.result.ci_high, f"{name}_p": c.result.p_value})
        if gain.mcnemar:
            row.update(discordant_mhar_better=gain.mcnemar.b, discordant_plain_better=gain.mcnemar.c)
        if checked is False:
            row["verdict"] = f"{vd.NOT_JUDGED}: CPT batch check failed"
        rows.append(row)
        results.append(gain.result)
    _judge(rows, results, [checked is not False] * len(rows))
    cols = [Column("task / metric", lambda r: f"{r['task']} {r['metric']}"), Column("n", lambda r: str(r["n"])),
            Column("base / plain / MHAR", lambda r: f"{f_num(r['base'])} / {f_num(r['plain'])} / {f_num(r['mhar'])}"),
            Column("CPT gain (plain-base)", lambda r: f_ci(r["cpt_gain"], r["cpt_gain_ci_low"], r["cpt_gain_ci_high"])
                   + f", p {f_p(r['cpt_gain_p'])}"),
            Column("total (MHAR-base)", lambda r: f_ci(r["total_gain"], r["total_gain_ci_low"], r["total_gain_ci_high"])
                   + f", p {f_p(r['total_gain_p'])}"),
            Column("MHAR gain (MHAR-plain)", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            *(c() for c in P_COLS),
            Column("discordant", lambda r: f"{r['discordant_mhar_better']} vs {r['discordant_plain_better']}"
                   if _ok(r.get("discordant_mhar_better")) else "-"),
            Column("paper base / plain / MHAR", lambda r: f"{f_num(r['published_base'])} / "
                   f"{f_num(r['published_plain'])} / {f_num(r['published_mhar'])}"),
            Column("paper MHAR gain", lambda r: f_ci(r["published_delta"], None, None)),
            *(c() for c in JUDGE_COLS)]
    notes = ["The MHAR contribution is only MHAR - plain CPT (the difference-in-differences: total gain minus the "
             "CPT gain); the gain over base is mostly the continued pretraining itself and is never credited to MHAR.",
             "All three arms are paired on the same questions (one model per arm, so the question is the unit); 0/1 "
             "scores: exact McNemar p with a bootstrap CI (discordant = MHAR right & plain wrong vs the reverse). "
             "One run per arm shows whether these two models differ, not that the method does: verdicts are "
             f"'{vd.MODELS_DIFFER}' / '{vd.NO_DIFFERENCE}' (eval/verdict.py VERDICT_RULE). "
             "Holm runs over the MHAR-gain rows only; the CPT and total gains are context, not verdicts.",
             f"Paper: Table 3 (Marin-8B, ~10B tokens). Scale of this run: {scale or 'unspecified'}; "
             + ("same as the paper." if same else "differs from the paper's 8B, so only signs are judged."),
             RULE_POINTER]
    if checked is False:
        notes.append("The two CPT arms did NOT see identical batches (batch check failed): no verdict is given.")
    if unchecked:
        notes.append(unchecked[0].upper() + unchecked[1:] + ".")
    if batch_check is not None:
        notes.append("Batch identity of the two CPT arms (manifest batch_check): "
                     + json.dumps(batch_check, sort_keys=True, default=str)[:300])
    return Table("cpt", "Continued pretraining: CPT gain vs MHAR gain", rows, cols, notes,
                 io.provenance([str(p) for p in inputs]))


# --- cost ---------------------------------------------------------------------------------------------
def _mean_se(x) -> tuple[Optional[float], Optional[float], int]:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return None, None, 0
    return float(x.mean()), (float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None), int(x.size)


def cost_table(bench_csvs: Sequence[str | Path], published=None) -> Table:
    """Throughput (ratio to baseline) and peak memory per routing implementation and size."""
    pub = io.load_published() if published is None else published
    df = io.load_bench(bench_csvs)
    inf = _table_inference_rows(io.load_inference(bench_csvs))
    inf_base = {size: sub for size, sub in inf[inf["provider"] == "baseline"].groupby("size")}
    prov_order = {p: i for i, p in enumerate(("baseline", "eager", "compile", "fused"))}
    base_tps = {size: _mean_se(sub.loc[sub["provider"] == "baseline", "tokens_per_s"])
                for size, sub in df.groupby("size")}
    rows = []
    for (size, provider), sub in sorted(df.groupby(["size", "provider"]),
                                        key=lambda kv: (_SIZE_ORDER.get(kv[0][0], 99), kv[0][0],
                                                        prov_order.get(kv[0][1], 99), kv[0][1])):
        tps_m, tps_se, n_ok = _mean_se(sub["tokens_per_s"])
        r, r_se, _ = _mean_se(sub["ratio"])
        bm, bse, _ = base_tps.get(size, (None, None, 0))
        ok = sub["ratio"].notna()
        paired = provider != "baseline" and bool(ok.any()) and bool(sub.loc[ok, "paired"].all())
        # paired: every ratio pairs a run with its own baseline, so r and r_se are the mean and SE over runs
        if not paired and r is not None and tps_m and bm and (tps_se is not None or bse is not None):
            # delta method: spread of the variant and of the baseline repeats
            r_se = r * math.sqrt(((tps_se or 0.0) / tps_m) ** 2 + ((bse or 0.0) / bm) ** 2)
        mem = sub["peak_mem_gb"].astype(float)
        scale, same = io.paper_scale(size)
        pr = io.published_value(pub, "cost", scale, provider, "throughput_ratio") if same else None
        pm = io.published_value(pub, "cost", scale, provider, "peak_mem_gb") if same else None
        bad = sorted(set(sub["status"].astype(str)) - {"ok", "nan"})
        status = ",".join(bad) or "ok"
        oom = n_ok == 0 and any(b.upper() == vd.OOM for b in bad)
        v = "" if provider == "baseline" else vd.cost_verdict(r, pr, same, se=r_se, status=vd.OOM if oom else "ok")
        rows.append({"size": size, "provider": provider, "n": len(sub), "n_ok": n_ok, "status": status,
                     "tokens_per_s": tps_m, "tokens_per_s_sd": float(sub["tokens_per_s"].astype(float).std(ddof=1))
                     if n_ok > 1 else None,
                     "ratio": r, "ratio_se": r_se,
                     "pairing": "" if provider == "baseline" else ("same run" if paired else "mean baseline"),
                     "peak_mem_gb": float(mem.mean()) if mem.notna().any() else None,
                     "published_ratio": pr, "published_mem_gb": pm, "same_scale": same,
                     "comparison": "" if provider == "baseline" else f"{provider} / baseline throughput ({size})",
                     "delta": (r - 1.0) if (r is not None and provider != "baseline") else None,
                     "published_delta": (pr - 1.0) if (pr is not None and provider != "baseline") else None,
                     "verdict": v, "sources": ";".join(sorted(set(sub["source"])))})
        rows[-1].update(_inference_cols(inf, inf_base, size, provider))
    cols = [Column("size", lambda r: r["size"]), Column("routing", lambda r: r["provider"]),
            Column("n", lambda r: str(r["n_ok"])),
            Column("tokens/s", lambda r: f_sd(r["tokens_per_s"], r["tokens_per_s_sd"], 0)
                   if _ok(r["tokens_per_s"]) else r["status"]),
            Column("ratio ± SE", lambda r: f_sd(r["ratio"], r["ratio_se"], 3) if _ok(r["ratio"]) else
                   (vd.OOM if vd.OOM in r["status"].upper() else "-")),
            Column("ratio vs", lambda r: r["pairing"] or "-"),
            Column("peak GB", lambda r: f_num(r["peak_mem_gb"], 1)),
            Column("paper ratio", lambda r: f_num(r["published_ratio"], 2)),
            Column("paper GB", lambda r: f_num(r["published_mem_gb"], 1)),
            Column("verdict", lambda r: r["verdict"] or "-")]
    scored = bool(len(inf)) and bool(inf["score_tok_s"].notna().any())
    if scored:
        cols[-1:-1] = [Column("score tok/s (ratio)", lambda r: f"{f_num(r['score_tok_s'], 0)} "
                              f"({f_num(r['score_ratio'], 2)})" if _ok(r.get("score_tok_s")) else "-")]
    if len(inf):
        cols[-1:-1] = [Column("prefill tok/s (ratio)", lambda r: f"{f_num(r['prefill_tok_s'], 0)} "
                              f"({f_num(r['prefill_ratio'], 2)})" if _ok(r.get("prefill_tok_s")) else "-"),
                       Column("decode ms/token (ratio)", lambda r: f"{f_num(r['decode_ms'], 1)} "
                              f"({f_num(r['decode_ratio'], 2)})" if _ok(r.get("decode_ms")) else "-"),
                       Column("inference peak GB", lambda r: f_num(r.get("infer_peak_gb"), 2))]
    notes = ["ratio vs 'same run': each record's ratio pairs the routing implementation with the baseline "
             "measured in the same run (benchmarks/bench_training.py); the table gives the mean over runs and its "
             "SE over runs (n runs). ratio vs 'mean baseline': tokens/s of the routing implementation / mean "
             "tokens/s of the baseline at the same size, SE from the repeats of both (delta method). Memory as the "
             "benchmark reports it (torch peak allocated).",
             "Paper: cost table (single H100); eager 1B was OOM (>80 GB).",
             "Verdicts: eval/verdict.py COST_RULE (quoted once at the top of REPORT.md): two-sided tolerance 0.10 "
             "plus 2 SE of the repeats."] + \
        (["Inference (benchmarks/bench_inference.py at batch 8; not in the paper, no verdict): "
          + ("scoring tok/s (the lm-eval adapter's path, mhar.model.inference.Scorer) and its ratio to the baseline, "
             if scored else "") +
          "prefill tok/s and its ratio to the baseline, decode ms per generated token (Transformer.generate, "
          "whole batch) and its ratio to the baseline (> 1 = slower), inference peak memory."]
         if len(inf) else []) + \
        _hf_notes(inf) + \
        [f"skipped: {s}" for s in df.attrs.get("skipped", [])]
    return Table("cost", "Cost: throughput and memory by routing implementation", rows, cols, notes,
                 io.provenance(bench_csvs))


def _table_inference_rows(inf):
    """The inference rows the cost table shows: batch 8 (the table's shape; records without a batch column
    count as 8), and per size only the newest record format (rows with the scoring column) when it exists, so
    figures of two versions of the benchmark are never averaged."""
    if not len(inf):
        return inf
    inf = inf[inf["batch"].fillna(8) == 8]
    keep = []
    for _, sub in inf.groupby("size"):
        keep.append(sub[sub["score_tok_s"].notna()] if sub["score_tok_s"].notna().any() else sub)
    import pandas as pd
    return pd.concat(keep, ignore_index=True) if keep else inf


def _hf_notes(inf) -> list[str]:
    """One note per size with transformers' Qwen3 measured beside the baseline (same run, same shapes)."""
    out = []
    for size, sub in inf.groupby("size"):
        hf, base = sub[sub["provider"] == "hf"], sub[sub["provider"] == "baseline"]
        if not len(hf) or not len(base):
            continue
        sc = (f"scoring {f_num(base['score_tok_s'].mean(), 0)} vs {f_num(hf['score_tok_s'].mean(), 0)} tok/s, "
              if base["score_tok_s"].notna().any() else "")
        out.append(f"{size}: baseline vs transformers' Qwen3ForCausalLM (SDPA, eager generate) at the same shapes: "
                   f"{sc}decode {f_num(base['decode_ms_per_token'].mean(), 2)} vs "
                   f"{f_num(hf['decode_ms_per_token'].mean(), 2)} ms/token, peak "
                   f"{f_num(base['peak_mem_gb'].mean(), 2)} vs {f_num(hf['peak_mem_gb'].mean(), 2)} GB.")
    return out


def _inference_cols(inf, inf_base: dict, size: str, provider: str) -> dict:
    """Mean inference figures of (size, provider) and their ratios to the baseline's, or {} when not measured."""
    sub = inf[(inf["size"] == size) & (inf["provider"] == provider)]
    if not len(sub):
        return {}
    score = float(sub["score_tok_s"].mean()) if sub["score_tok_s"].notna().any() else None
    out = {"prefill_tok_s": float(sub["prefill_tok_s"].mean()), "decode_ms": float(sub["decode_ms_per_token"].mean()),
           "infer_peak_gb": float(sub["peak_mem_gb"].mean()) if sub["peak_mem_gb"].notna().any() else None,
           "score_tok_s": score, "prefill_ratio": None, "decode_ratio": None, "score_ratio": None}
    base = inf_base.get(size)
    if base is not None:
        out["prefill_ratio"] = out["prefill_tok_s"] / float(base["prefill_tok_s"].mean())
        out["decode_ratio"] = out["decode_ms"] / float(base["decode_ms_per_token"].mean())
        if score is not None and base["score_tok_s"].notna().any():
            out["score_ratio"] = score / float(base["score_tok_s"].mean())
    return out


# --- entry points ---------------------------------------------------------------------------------------
def make_table(kind: str, inputs: Sequence[str | Path], out: str | Path, n_resamples: int = 4999,
               command: Optional[str] = None) -> list[Path]:
    """Build table ``kind`` from ``inputs`` and write OUT.csv/.md/.tex (``command`` is recorded as provenance;
    by default the equivalent CLI command)."""
    if not inputs:
        raise io.AnalysisInputError(f"{kind}: no inputs given")
    builders: dict[str, Callable[[], Table]] = {
        "table1": lambda: table1(inputs), "seeds": lambda: seeds_table(inputs), "heads": lambda: heads_table(inputs),
        "downstream": lambda: downstream_table(inputs, n_resamples=n_resamples),
        "cpt": lambda: cpt_table(inputs, n_resamples=n_resamples), "cost": lambda: cost_table(inputs)}
    if kind not in builders:
        raise ValueError(f"unknown table {kind!r}; choose one of {', '.join(KINDS)}")
    t = builders[kind]()
    t.provenance["command"] = command or f"python -m eval.tables {kind} --inputs {' '.join(map(str, inputs))} --out {out}"
    return write_table(t, out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.tables", description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--inputs", "--summaries", "--runs", "--evals", "--bench", dest="inputs", nargs="+", required=True,
                    help="summary.json files / run dirs (table1, heads, seeds), eval dirs (downstream), "
                         "base plain mhar eval dirs or a manifest (cpt), bench CSVs (cost)")
    ap.add_argument("--out", required=True, help="output prefix; writes PREFIX.csv, PREFIX.md, PREFIX.tex")
    ap.add_argument("--resamples", type=int, default=4999, help="bootstrap / permutation resamples")
    a = ap.parse_args(argv)
    return io.run_cli("eval.tables", lambda cmd: make_table(a.kind, a.inputs, a.out, a.resamples, command=cmd), argv)


if __name__ == "__main__":
    sys.exit(main())
