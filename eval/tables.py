"""Result tables (CSV + Markdown + LaTeX), each with the published value beside ours and a verdict.

    python -m eval.tables {table1,downstream,cpt,heads,seeds,cost} --inputs FILES... --out PREFIX

writes PREFIX.csv (raw numbers), PREFIX.md and PREFIX.tex (formatted, with notes and provenance).
Inputs: table1/heads/seeds take summary.json files (or run dirs); downstream takes eval dirs of the
baseline and the variants (which run each dir belongs to is read from results.json / the path);
cpt takes three eval dirs base, plain, mhar (or one JSON/YAML manifest {base, plain, mhar, scale});
cost takes benchmark CSVs. Runs are grouped by (variant, size, residual heads) and paired by seed.

Every table CSV carries the common columns ``comparison, delta, ci_low, ci_high, p,
published_delta, verdict`` (empty where not applicable) so forest plots and the report can read
any of them. The verdict rule is ``eval.stats.VERDICT_RULE``.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import results_io as io
from . import stats as st

KINDS = ("table1", "downstream", "cpt", "heads", "seeds", "cost")
COMMON = ["comparison", "delta", "ci_low", "ci_high", "p", "published_delta", "verdict"]
# the metric the paper reports for each task (lm-eval names); lower_is_better for perplexities
PRIMARY_METRIC = {"wikitext": "word_perplexity", "lambada_openai": "acc", "lambada": "acc", "hellaswag": "acc",
                  "gsm8k": "exact_match", "gpqa_main_zeroshot": "acc", "mmlu": "acc",
                  "minerva_math": "exact_match", "humaneval": "pass@1", "mbpp": "pass@1"}
COST_TOLERANCE = 0.10
COST_RULE = (f"Cost verdict: throughput ratio vs baseline on our GPU; 'reproduced' if ours >= published - "
             f"{COST_TOLERANCE:.2f}, 'not reproduced' if lower; sizes the paper did not run are inconclusive. "
             "Hardware differs from the paper's single H100, so ratios, not tokens/s, are compared.")
SCALE_NOTE = ("Sizes the paper did not run (e.g. CPU 'tiny') are compared with the paper's 100M numbers by the "
              "sign of the paired delta only; absolute values are not comparable across scales.")


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
        git = prov.get("git", {})
        cmd = prov.get("command", "")
        if len(cmd) > 240:
            cmd = cmd[:200] + f" ... ({len(prov.get('inputs', []))} inputs)"
        lines += ["", f"<sub>Generated by `{cmd}` at {prov.get('generated_utc', '')} "
                      f"from {len(prov.get('inputs', []))} input file(s); git {git.get('commit') or 'unknown'}"
                      f"{' (dirty)' if git.get('dirty') else ''}. Do not edit by hand.</sub>", "",
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
    with open(paths[0], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in t.rows:
            w.writerow({k: ("" if not _ok(r.get(k)) else r.get(k)) for k in fields})
    paths[1].write_text(to_markdown(t))
    paths[2].write_text(to_latex(t))
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


def _seed_pairs(a: dict[int, io.RunSummary], b: dict[int, io.RunSummary]) -> tuple[list[int], np.ndarray, np.ndarray]:
    seeds = sorted(set(a) & set(b))
    return (seeds, np.array([a[s].tail_mean_val_loss for s in seeds]),
            np.array([b[s].tail_mean_val_loss for s in seeds]))


_ORDER = {v: i for i, v in enumerate(("baseline", "hyper", "attnres", "block_attnres", "mhar", "mhar_hw", "mhar_delta"))}
_SIZE_ORDER = {s: i for i, s in enumerate(("debug", "tiny", "small", "100M", "350M", "1B", "8B"))}


def _group_key(g: tuple) -> tuple:
    v, s, h = g
    return (_SIZE_ORDER.get(s, 99), s, _ORDER.get(v, 99), v, h or 0)


def table1(summaries: Sequence[str | Path], published=None) -> Table:
    """Tail-mean validation loss, variant x size: mean ± sd over seeds, paired delta vs baseline."""
    pub = io.load_published() if published is None else published
    runs = io.load_summaries(summaries)
    groups = io.group_runs(runs)
    rows = []
    for g in sorted(groups, key=_group_key):
        variant, size, heads = g
        byseed = groups[g]
        losses = np.array([r.tail_mean_val_loss for r in byseed.values()])
        row = {"size": size, "variant": variant, "heads": heads, "method": io.variant_label(variant, heads),
               "n_seeds": len(byseed), "loss_mean": float(losses.mean()),
               "loss_sd": float(losses.std(ddof=1)) if losses.size > 1 else None,
               "config_hash": ",".join(sorted({r.config_hash for r in byseed.values()})),
               "run_label": ",".join(sorted({r.name for r in byseed.values()}))}
        pub_loss, pub_delta, same = _published_loss(pub, size, variant, heads)
        row.update(published_loss=pub_loss, published_delta=pub_delta, same_scale=same,
                   published_scale=io.paper_scale(size)[0],
                   comparison=f"{row['method']} - baseline ({size})")
        base = groups.get(("baseline", size, None))
        res = None
        if variant != "baseline" and base:
            seeds, a, b = _seed_pairs(byseed, base)
            if seeds:
                res = st.paired_t(a, b)
                row["n_pairs"] = len(seeds)
                row["mde80"] = st.mde_paired(len(seeds), float(np.std(a - b, ddof=1)) if len(seeds) > 1 else math.nan)
        row.update(_paired_cols(res))
        row["verdict"] = "" if variant == "baseline" else st.verdict(res, pub_delta, same)
        if variant == "baseline":
            row["comparison"] = ""
        rows.append(row)
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: str(r["n_seeds"])),
            Column("tail-mean val loss", lambda r: f_sd(r["loss_mean"], r["loss_sd"])),
            Column("Δ vs baseline [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            Column("paired p", lambda r: f_p(r["p"])),
            Column("paper loss", lambda r: _with_scale(f_num(r["published_loss"]), r)),
            Column("paper Δ", lambda r: _with_scale(f_ci(r["published_delta"], None, None), r)),
            Column("verdict", lambda r: r["verdict"] or "-")]
    notes = ["Δ = variant - baseline on the same seeds (seed = data order, so runs are paired); paired t-test "
             "over seeds (n=1 gives no CI).", "Paper: Table 1 (anneal corpus, 20K steps); MHAR with H not in "
             "{8, 16} is compared with the paper's H=8 row.", SCALE_NOTE, st.VERDICT_RULE]
    return Table("table1", "Table 1: tail-mean validation loss (ours vs paper)", rows, cols, notes,
                 io.provenance(summaries))


def seeds_table(summaries: Sequence[str | Path], published=None) -> Table:
    """Per-seed paired deltas vs baseline, mean ± per-seed sd, against the paper's seed table."""
    pub = io.load_published() if published is None else published
    groups = io.group_runs(io.load_summaries(summaries))
    rows = []
    for g in sorted(groups, key=_group_key):
        variant, size, heads = g
        base = groups.get(("baseline", size, None))
        if variant == "baseline" or not base:
            continue
        seeds, a, b = _seed_pairs(groups[g], base)
        if not seeds:
            continue
        d = a - b
        res = st.paired_t(a, b)
        scale, same = io.paper_scale(size)
        pd_ = io.published_value(pub, "seeds", scale, variant, "delta_vs_baseline")
        psd = None
        if pd_ is not None:
            sel = pub[(pub["table"] == "seeds") & (pub["scale"] == scale) & (pub["method"] == variant)]
            psd = float(sel["sd"].iloc[0]) if not sel.empty and np.isfinite(sel["sd"].iloc[0]) else None
        label = io.variant_label(variant, heads)
        rows.append({"size": size, "variant": variant, "heads": heads, "method": label,
                     "run_label": ",".join(sorted({r.name for r in groups[g].values()})),
                     "seeds": " ".join(map(str, seeds)),
                     "n_pairs": len(seeds), "per_seed_delta": " ".join(f"{x:+.4f}" for x in d),
                     "delta_sd": float(d.std(ddof=1)) if d.size > 1 else None,
                     "pairing_corr": float(np.corrcoef(a, b)[0, 1]) if d.size > 2 and a.std() > 0 and b.std() > 0 else None,
                     "mde80": st.mde_paired(len(seeds), float(d.std(ddof=1))) if d.size > 1 else None,
                     "published_delta": pd_, "published_sd": psd, "same_scale": same, "published_scale": scale,
                     "comparison": f"{label} - baseline ({size}, seeds)", **_paired_cols(res),
                     "verdict": st.verdict(res, pd_, same)})
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seeds", lambda r: r["seeds"]), Column("per-seed Δ", lambda r: r["per_seed_delta"]),
            Column("mean Δ ± sd", lambda r: f_sd(r["delta"], r["delta_sd"])),
            Column("95% CI", lambda r: f"[{f_num(r['ci_low'])}, {f_num(r['ci_high'])}]"),
            Column("p", lambda r: f_p(r["p"])), Column("MDE (80%)", lambda r: f_num(r.get("mde80"))),
            Column("paper Δ ± sd", lambda r: _with_scale(f_sd(r["published_delta"], r["published_sd"]), r)),
            Column("verdict", lambda r: r["verdict"])]
    notes = ["Paired by seed (data order). sd = per-seed sd of the paired differences; MDE = smallest |Δ| a "
             "two-sided paired t-test with these seeds detects with 80% power at alpha 0.05.",
             "Paper: seed table of the FineWeb-Edu replication (3 seeds).", SCALE_NOTE, st.VERDICT_RULE]
    return Table("seeds", "Seed table: paired deltas vs baseline", rows, cols, notes, io.provenance(summaries))


def heads_table(summaries: Sequence[str | Path], published=None) -> Table:
    """Routing head-count sweep: loss vs H (H=1 = AttnRes), paired delta vs H=1."""
    pub = io.load_published() if published is None else published
    groups = io.group_runs(io.load_summaries(summaries))
    by_size: dict[str, dict[int, dict]] = {}
    for (variant, size, heads), runs in groups.items():
        if variant in ("mhar", "attnres"):
            h = 1 if variant == "attnres" else heads
            if h in by_size.setdefault(size, {}):
                raise io.AnalysisInputError(f"size {size}: both attnres and mhar H=1 runs given; pass one of them")
            by_size[size][h] = runs
    rows = []
    for size in sorted(by_size, key=lambda s: _SIZE_ORDER.get(s, 99)):
        hs = by_size[size]
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
            res = None
            if h != ref_h:
                seeds, a, b = _seed_pairs(hs[h], hs[ref_h])
                res = st.paired_t(a, b) if seeds else None
            pl, pref = pub_of(h), pub_of(ref_h)
            pdelta = pl - pref if (pl is not None and pref is not None and h != ref_h) else None
            rows.append({"size": size, "heads": h, "n_seeds": len(losses), "loss_mean": float(losses.mean()),
                         "loss_sd": float(losses.std(ddof=1)) if losses.size > 1 else None,
                         "best": h == best, "interior_best": best not in (min(hs), max(hs)),
                         "published_loss": pl, "published_table": f"{ptab}:{pscale}", "published_scale": pscale,
                         "published_delta": pdelta, "same_scale": same,
                         "comparison": "" if h == ref_h else f"H={h} - H={ref_h} ({size})", **_paired_cols(res),
                         "verdict": "" if h == ref_h else st.verdict(res, pdelta, same)})
    cols = [Column("size", lambda r: r["size"]), Column("H", lambda r: str(r["heads"]) + (" *" if r["best"] else "")),
            Column("seeds", lambda r: str(r["n_seeds"])),
            Column("tail-mean val loss", lambda r: f_sd(r["loss_mean"], r["loss_sd"])),
            Column("Δ vs smallest H [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            Column("p", lambda r: f_p(r["p"])), Column("paper loss", lambda r: _with_scale(f_num(r["published_loss"]), r)),
            Column("paper Δ", lambda r: _with_scale(f_ci(r["published_delta"], None, None), r)),
            Column("verdict", lambda r: r["verdict"] or "-")]
    notes = ["* = lowest mean loss; the paper's U-shape means the best H is interior (neither the smallest nor "
             "the largest H swept).", "H=1 is single-head AttnRes. Paper: 1B head sweep (8 KV heads) for 1B and "
             "non-paper sizes, Table 1 (H=1/8/16) for 100M/350M.", SCALE_NOTE, st.VERDICT_RULE]
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
    """a - b on the same documents of one task."""

    value_a: float
    value_b: float
    result: st.PairedResult
    mde80: Optional[float]
    kind: str  # "perplexity" | "binary" | "score"
    mcnemar: Optional[st.McNemarResult] = None
    cluster: Optional[st.PairedResult] = None


def compare_task(a: io.EvalTask, b: io.EvalTask, metric: str, *, n_resamples: int = 4999, seed: int = 0) -> Comparison:
    ids = io.align(a, b)
    xa, wa = io.metric_arrays(a, metric, ids)
    xb, wb = io.metric_arrays(b, metric, ids)
    if wa is not None:
        if wb is None:
            raise io.AnalysisInputError(f"{a.path} vs {b.path}: metric {metric!r} stored differently")
        res = st.bootstrap_perplexity(xa, xb, wa, wb, n_resamples=n_resamples, seed=seed)
        z = 2.8016  # z_{0.975} + z_{0.80}
        return Comparison(st.perplexity(xa, wa), st.perplexity(xb, wb), res, z * res.se, "perplexity")
    res = st.paired_delta(xa, xb, n_resamples=n_resamples, seed=seed)
    binary = "McNemar" in res.method
    d = xa - xb
    mde = st.mde_paired(d.size, float(np.std(d, ddof=1))) if d.size > 1 else None
    groups = [a.docs[k].get("group") for k in ids]
    cl = None
    if all(g is not None for g in groups) and len(set(groups)) >= 2:
        cl = st.cluster_se(d, np.array([str(g) for g in groups]))
    mc = st.mcnemar_exact(*st.discordant_counts(xa, xb)) if binary else None
    return Comparison(float(xa.mean()), float(xb.mean()), res, mde, "binary" if binary else "score", mc, cl)


def downstream_table(eval_dirs: Sequence[str | Path], published=None, n_resamples: int = 4999) -> Table:
    """Zero-shot downstream metrics: each variant vs the baseline of the same size and seed, per task."""
    pub = io.load_published() if published is None else published
    infos = [(Path(d), io.identify_eval(d)) for d in eval_dirs]
    bases = {(i["size"], i["seed"]): d for d, i in infos if i["variant"] == "baseline"}
    rows = []
    missing = []
    for d, info in sorted(infos, key=lambda x: (_SIZE_ORDER.get(x[1]["size"], 99), _ORDER.get(x[1]["variant"], 99),
                                                 x[1]["heads"] or 0, x[1]["seed"])):
        if info["variant"] == "baseline":
            continue
        bdir = bases.get((info["size"], info["seed"]))
        if bdir is None:
            missing.append(f"{d} (no baseline eval for size {info['size']} seed {info['seed']})")
            continue
        label = io.variant_label(info["variant"], info["heads"])
        scale, same = io.paper_scale(info["size"])
        for task in sorted(set(io.eval_tasks(d)) & set(io.eval_tasks(bdir))):
            ta, tb = io.load_eval_task(d, task), io.load_eval_task(bdir, task)
            metric = primary_metric(ta)
            c = compare_task(ta, tb, metric, n_resamples=n_resamples)
            mname = metric.split(",")[0]
            pv = io.published_value(pub, "downstream", scale, "mhar", mname, task=task) \
                if info["variant"] == "mhar" else None
            pb = io.published_value(pub, "downstream", scale, "baseline", mname, task=task)
            pdelta = pv - pb if pv is not None and pb is not None else None
            rows.append({"size": info["size"], "seed": info["seed"], "variant": info["variant"],
                         "heads": info["heads"], "method": label, "task": task, "metric": metric,
                         "n": c.result.n, "ours_variant": c.value_a, "ours_baseline": c.value_b,
                         "published_variant": pv, "published_baseline": pb, "published_delta": pdelta,
                         "same_scale": same, "published_scale": scale, "mde80": c.mde80, "test": c.result.method,
                         "discordant_variant_better": c.mcnemar.b if c.mcnemar else None,
                         "discordant_baseline_better": c.mcnemar.c if c.mcnemar else None,
                         "cluster_se": c.cluster.se if c.cluster else None,
                         "cluster_p": c.cluster.p_value if c.cluster else None,
                         "comparison": f"{label} - baseline: {task} ({info['size']}, seed {info['seed']})",
                         **_paired_cols(c.result), "verdict": st.verdict(c.result, pdelta, same)})
    cols = [Column("size", lambda r: r["size"]), Column("method", lambda r: r["method"]),
            Column("seed", lambda r: str(r["seed"])), Column("task / metric", lambda r: f"{r['task']} {r['metric']}"),
            Column("n", lambda r: str(r["n"])), Column("baseline", lambda r: f_num(r["ours_baseline"])),
            Column("variant", lambda r: f_num(r["ours_variant"])),
            Column("Δ [95% CI]", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            Column("p", lambda r: f_p(r["p"])), Column("MDE (80%)", lambda r: f_num(r["mde80"])),
            Column("paper base / MHAR", lambda r: _with_scale(
                f"{f_num(r['published_baseline'])} / {f_num(r['published_variant'])}", r)),
            Column("paper Δ", lambda r: _with_scale(f_ci(r["published_delta"], None, None), r)),
            Column("verdict", lambda r: r["verdict"])]
    notes = ["Paired by document (same doc_id and prompt). Accuracy: bootstrap CI of the difference, exact "
             "McNemar p; perplexity: bootstrap over documents, per-document swap permutation p. Accuracies are "
             "fractions (the paper's percentages / 100).",
             "Paper: Table 2 (zero-shot, 200 examples); its MHAR rows are compared with our MHAR runs of any H.",
             SCALE_NOTE, st.VERDICT_RULE] + [f"skipped: {m}" for m in missing]
    return Table("downstream", "Downstream zero-shot evaluation (paired vs baseline)", rows, cols, notes,
                 io.provenance([str(d) for d in eval_dirs]))


def _cpt_inputs(inputs: Sequence[str | Path]) -> tuple[Path, Path, Path, Optional[str], Optional[dict]]:
    """(base, plain, mhar eval dirs, scale, batch check) from three dirs or a manifest."""
    if len(inputs) == 3:
        return Path(inputs[0]), Path(inputs[1]), Path(inputs[2]), None, None
    if len(inputs) == 1 and Path(inputs[0]).is_file():
        import yaml

        m = yaml.safe_load(Path(inputs[0]).read_text()) or {}
        for k in ("base", "plain", "mhar"):
            if k not in m:
                raise io.AnalysisInputError(f"{inputs[0]}: CPT manifest needs keys base, plain, mhar (eval dirs)")
        root = Path(inputs[0]).parent
        rel = lambda p: Path(p) if Path(p).is_absolute() else root / p  # noqa: E731
        return rel(m["base"]), rel(m["plain"]), rel(m["mhar"]), m.get("scale"), m.get("batch_check")
    raise io.AnalysisInputError("cpt takes three eval dirs (base plain mhar) or one manifest file")


def cpt_table(inputs: Sequence[str | Path], published=None, n_resamples: int = 4999) -> Table:
    """Continued pretraining: CPT gain, total gain, and MHAR gain (difference-in-differences) per task."""
    pub = io.load_published() if published is None else published
    base_d, plain_d, mhar_d, scale, batch_check = _cpt_inputs(inputs)
    same = scale == "8B"
    tasks = sorted(set(io.eval_tasks(base_d)) & set(io.eval_tasks(plain_d)) & set(io.eval_tasks(mhar_d)))
    rows = []
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
               "verdict": st.verdict(gain.result, pdelta, same)}
        for name, c in (("cpt_gain", cpt), ("total_gain", total)):
            row.update({name: c.result.estimate, f"{name}_ci_low": c.result.ci_low,
                        f"{name}_ci_high": c.result.ci_high, f"{name}_p": c.result.p_value})
        if gain.mcnemar:
            row.update(discordant_mhar_better=gain.mcnemar.b, discordant_plain_better=gain.mcnemar.c)
        rows.append(row)
    cols = [Column("task / metric", lambda r: f"{r['task']} {r['metric']}"), Column("n", lambda r: str(r["n"])),
            Column("base / plain / MHAR", lambda r: f"{f_num(r['base'])} / {f_num(r['plain'])} / {f_num(r['mhar'])}"),
            Column("CPT gain (plain-base)", lambda r: f_ci(r["cpt_gain"], r["cpt_gain_ci_low"], r["cpt_gain_ci_high"])
                   + f", p {f_p(r['cpt_gain_p'])}"),
            Column("total (MHAR-base)", lambda r: f_ci(r["total_gain"], r["total_gain_ci_low"], r["total_gain_ci_high"])
                   + f", p {f_p(r['total_gain_p'])}"),
            Column("MHAR gain (MHAR-plain)", lambda r: f_ci(r["delta"], r["ci_low"], r["ci_high"])),
            Column("p", lambda r: f_p(r["p"])),
            Column("discordant", lambda r: f"{r['discordant_mhar_better']} vs {r['discordant_plain_better']}"
                   if _ok(r.get("discordant_mhar_better")) else "-"),
            Column("paper base / plain / MHAR", lambda r: f"{f_num(r['published_base'])} / "
                   f"{f_num(r['published_plain'])} / {f_num(r['published_mhar'])}"),
            Column("paper MHAR gain", lambda r: f_ci(r["published_delta"], None, None)),
            Column("verdict", lambda r: r["verdict"])]
    notes = ["The MHAR contribution is only MHAR - plain CPT (the difference-in-differences: total gain minus the "
             "CPT gain); the gain over base is mostly the continued pretraining itself and is never credited to MHAR.",
             "All three arms are paired on the same questions; 0/1 scores: bootstrap CI + exact McNemar p "
             "(discordant = MHAR right & plain wrong vs the reverse).",
             f"Paper: Table 3 (Marin-8B, ~10B tokens). Scale of this run: {scale or 'unspecified'}; "
             + ("same as the paper." if same else "differs from the paper's 8B, so only signs are judged."),
             st.VERDICT_RULE]
    if batch_check is not None:
        notes.append("Batch identity of the two CPT arms (manifest batch_check): "
                     + json.dumps(batch_check, sort_keys=True, default=str)[:300])
    return Table("cpt", "Continued pretraining: CPT gain vs MHAR gain", rows, cols, notes,
                 io.provenance([str(p) for p in inputs]))


# --- cost ---------------------------------------------------------------------------------------------
def cost_table(bench_csvs: Sequence[str | Path], published=None) -> Table:
    """Throughput (ratio to baseline) and peak memory per routing implementation and size."""
    pub = io.load_published() if published is None else published
    df = io.load_bench(bench_csvs)
    prov_order = {p: i for i, p in enumerate(("baseline", "eager", "compile", "fused"))}
    rows = []
    for (size, provider), sub in sorted(df.groupby(["size", "provider"]),
                                        key=lambda kv: (_SIZE_ORDER.get(kv[0][0], 99), kv[0][0],
                                                        prov_order.get(kv[0][1], 99), kv[0][1])):
        tps = sub["tokens_per_s"].astype(float)
        ratio = sub["ratio"].astype(float)
        mem = sub["peak_mem_gb"].astype(float)
        scale, same = io.paper_scale(size)
        pr = io.published_value(pub, "cost", scale, provider, "throughput_ratio") if same else None
        pm = io.published_value(pub, "cost", scale, provider, "peak_mem_gb") if same else None
        r = float(ratio.mean()) if ratio.notna().any() else None
        if provider == "baseline":
            v = ""
        elif not same:
            v = st.INCONCLUSIVE
        elif pr is None:
            v = st.NO_REFERENCE
        else:
            v = st.REPRODUCED if (r is not None and r >= pr - COST_TOLERANCE) else st.NOT_REPRODUCED
        bad = sorted(set(sub["status"]) - {"ok", "nan"})
        rows.append({"size": size, "provider": provider, "n": len(sub), "status": ",".join(bad) or "ok",
                     "tokens_per_s": float(tps.mean()) if tps.notna().any() else None,
                     "tokens_per_s_sd": float(tps.std(ddof=1)) if tps.notna().sum() > 1 else None,
                     "ratio": r, "peak_mem_gb": float(mem.mean()) if mem.notna().any() else None,
                     "published_ratio": pr, "published_mem_gb": pm,
                     "comparison": "" if provider == "baseline" else f"{provider} / baseline throughput ({size})",
                     "delta": (r - 1.0) if (r is not None and provider != "baseline") else None,
                     "published_delta": (pr - 1.0) if (pr is not None and provider != "baseline") else None,
                     "verdict": v, "sources": ";".join(sorted(set(sub["source"])))})
    cols = [Column("size", lambda r: r["size"]), Column("routing", lambda r: r["provider"]),
            Column("tokens/s", lambda r: f_sd(r["tokens_per_s"], r["tokens_per_s_sd"], 0)
                   if _ok(r["tokens_per_s"]) else r["status"]),
            Column("ratio", lambda r: f_num(r["ratio"], 2)), Column("peak GB", lambda r: f_num(r["peak_mem_gb"], 1)),
            Column("paper ratio", lambda r: f_num(r["published_ratio"], 2)),
            Column("paper GB", lambda r: f_num(r["published_mem_gb"], 1)),
            Column("verdict", lambda r: r["verdict"] or "-")]
    notes = ["ratio = tokens/s of the routing implementation / tokens/s of the baseline at the same size; "
             "memory as the benchmark reports it (torch peak allocated).",
             "Paper: cost table (single H100); eager 1B was OOM (>80 GB).", COST_RULE] + \
        [f"skipped: {s}" for s in df.attrs.get("skipped", [])]
    return Table("cost", "Cost: throughput and memory by routing implementation", rows, cols, notes,
                 io.provenance(bench_csvs))


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
