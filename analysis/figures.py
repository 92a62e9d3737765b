"""Figures (matplotlib, PNG + PDF) generated from result files, never by hand.

    python -m analysis.figures {loss_curves,loss_vs_compute,routing_heatmap,head_sweep,forest,cost} \
        --inputs ... --out PREFIX            # -> PREFIX.png, PREFIX.pdf

Inputs: loss_curves / loss_vs_compute / head_sweep take summary.json files (or run dirs);
routing_heatmap takes probe JSONs (``eval.probe``: the evaluation stage runs the models); forest takes table CSVs
(``analysis.tables``); cost takes the cost table's CSV (or benchmark CSVs, which it turns into that
table first), so figure and table always show the same numbers. Error bars and bands say what
they are and over how many units (n); missing measurements (OOM, not run) are marked, never
drawn as zero. Each image records its command and inputs in its metadata.
"""
from __future__ import annotations

import argparse
import json
import zlib
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from . import verdict as vd  # noqa: E402
from .load.common import AnalysisInputError, read_json, run_cli  # noqa: E402
from .load.metrics import val_curve  # noqa: E402
from mhar.runs.sidecar import provenance  # noqa: E402
from .load.published import load_published, paper_scales  # noqa: E402
from .load.runs import RunSummary, display_of, load_summaries  # noqa: E402
from .tables.rows import group_runs, run_label, variant_label  # noqa: E402
from .tables.cost import ROUTING_ROWS, cost_table  # noqa: E402
from .tables.heads import SWEPT  # noqa: E402
from .tables.pairs import ordered  # noqa: E402
from mhar.runs import sidecar  # noqa: E402
from mhar.model.presets import size_key  # noqa: E402

KINDS = ("loss_curves", "loss_vs_compute", "routing_heatmap", "head_sweep", "forest", "cost")
VERDICT_COLORS = {vd.REPRODUCED: "tab:green", vd.SAME_SIGN: "yellowgreen", vd.NOT_REPRODUCED: "tab:red",
                  vd.OPPOSITE_SIGN: "lightcoral", vd.EFFECT_DIFFERS: "tab:orange", vd.INCONCLUSIVE: "tab:gray",
                  vd.INSUFFICIENT: "silver", vd.MODELS_DIFFER: "tab:purple", vd.NO_DIFFERENCE: "tab:brown"}


def _verdict_kind(v) -> str:
    """The verdict word of a table cell ('effect differs: smaller (..)' -> 'effect differs'); 'no verdict'."""
    v = "" if v is None or (isinstance(v, float) and not np.isfinite(v)) else str(v)
    return next((k for k in VERDICT_COLORS if v.startswith(k)), "no verdict")


def _verdict_color(v) -> str:
    return VERDICT_COLORS.get(_verdict_kind(v), "tab:blue")


_COMMAND: list[str] = []  # set by make_figure: the command recorded in the image metadata


def save(fig, prefix: str | Path, inputs: Sequence[str | Path]) -> list[Path]:
    """Save ``fig`` as PREFIX.png and PREFIX.pdf with provenance in the metadata."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance(inputs, command=_COMMAND[-1:] or None)
    desc = json.dumps(sidecar.tracked(prov))  # the time, git state and versions go to the untracked sidecar
    png, pdf = prefix.with_name(prefix.name + ".png"), prefix.with_name(prefix.name + ".pdf")
    fig.savefig(png, dpi=130, bbox_inches="tight", metadata={"Software": "mhar analysis.figures", "Description": desc})
    # no CreationDate / ModDate (a timestamp): the same inputs give the same bytes; the PNG's Software key is fixed
    fig.savefig(pdf, bbox_inches="tight", metadata={"Creator": "mhar analysis.figures", "Subject": desc[:2000],
                                                    "CreationDate": None, "ModDate": None})
    plt.close(fig)
    sidecar.write(prefix, prov)
    return [png, pdf]


def _by_size(runs: Sequence[RunSummary]) -> dict[str, dict[tuple, dict[int, RunSummary]]]:
    out: dict[str, dict] = {}
    for g, byseed in group_runs(runs).items():
        out.setdefault(g[1], {})[g] = byseed
    return out


def _mean_band(curves: list[dict[str, np.ndarray]], x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max loss across seeds on the common steps; x = mean of the x-axis key."""
    common = set(curves[0]["step"].tolist())
    for c in curves[1:]:
        common &= set(c["step"].tolist())
    steps = np.array(sorted(common))
    if steps.size == 0:
        raise AnalysisInputError("runs of one group share no validation step; cannot average their curves")
    L = np.stack([c["loss"][np.searchsorted(c["step"], steps)] for c in curves])  # (seeds, steps)
    X = np.stack([c[x][np.searchsorted(c["step"], steps)] for c in curves])
    return X.mean(0), L.mean(0), L.min(0), L.max(0)


def _color(label: str) -> str:
    """One colour per method label across panels and figures."""
    order = ["baseline", "hyper-conn", "single-head (AttnRes)", "Block AttnRes", "MHAR-HW", "MHAR-delta"]
    if label.startswith("MHAR H="):
        idx = 6 + int(np.log2(max(1, int(label.split("=")[1]))))
    else:
        idx = order.index(label) if label in order else len(order) + zlib.crc32(label.encode()) % 3
    return f"C{idx % 10}" if idx < 10 else plt.get_cmap("tab20")(idx % 20)


def _grid(n: int, w: float = 5.0, h: float = 3.6):
    fig, axes = plt.subplots(1, n, figsize=(w * n, h), squeeze=False)
    return fig, axes[0]


def _sci_label(v: float, _pos=None) -> str:
    """``2 x 10^11`` (mathtext) for a log axis tick; ``10^12`` at a decade."""
    m, e = f"{v:.0e}".split("e")
    return f"$10^{{{int(e)}}}$" if m == "1" else f"${m}\\times10^{{{int(e)}}}$"


def _compute_axis(ax, values: np.ndarray) -> None:
    """A compute axis whose tick labels never collide: log where the data span a decade or more (labelled
    ticks at 1, 2, 5 x 10^k over up to two decades, at the decades beyond), linear with a x 10^k offset below."""
    v = values[np.isfinite(values) & (values > 0)]
    span = float(np.log10(v.max() / v.min())) if v.size > 1 else 0.0
    if span < 1.0:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=5))
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
        return
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0) if span <= 2 else (1.0,)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_sci_label))  # every major tick, as m x 10^k
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _n_seeds_label(name: str, n: int) -> str:
    return f"{name} (mean of n={n} seeds" + (", band min..max)" if n > 1 else ")")


def _curves_panel(ax, groups: dict, x: str) -> np.ndarray:
    """One line per row of the size (table order, ``analysis.tables.pairs.ordered``): mean over seeds, band
    min..max; returns the x values drawn."""
    drawn, unmeasured = [], []
    for g in ordered(groups):
        curves = [val_curve(r) for r in groups[g].values()]
        xs, m, lo, hi = _mean_band(curves, x)
        lab = run_label(next(iter(groups[g].values())), g[3])
        if not np.isfinite(xs).any():  # an older record without this axis: said, not drawn
            unmeasured.append(lab)
            continue
        line, = ax.plot(xs, m, color=_color(lab), label=_n_seeds_label(lab, len(curves)))
        if len(curves) > 1:
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        drawn.append(xs)
    ax.set_ylabel("val loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if unmeasured:
        ax.text(0.02, 0.02, f"no {x} recorded: " + ", ".join(unmeasured), transform=ax.transAxes, fontsize=7,
                color="tab:red")
    return np.concatenate(drawn) if drawn else np.array([])


def loss_curves(summaries: Sequence[str | Path], out: str | Path, x: str = "step") -> list[Path]:
    """Validation loss per variant (mean over seeds, band = min..max across seeds), one panel per size."""
    runs = load_summaries(summaries)
    sizes = _by_size(runs)
    fig, axes = _grid(len(sizes))
    for ax, size in zip(axes, sorted(sizes, key=size_key)):
        _curves_panel(ax, sizes[size], x)
        ax.set_title(f"{size}: validation loss")
        ax.set_xlabel({"step": "step", "flops": "FLOPs"}.get(x, x))
    return save(fig, out, summaries)


def loss_vs_compute(summaries: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Validation loss against training FLOPs (the trainer's count per token x tokens: the same for every rerun),
    mean over seeds; one panel per size. Not against wall-clock: a training run's clock depends on the machine and
    its load (two reruns of one run differ), so a tracked figure drawn from it would change on every rerun; what
    the routing costs in time is the cost table's measured throughput."""
    runs = load_summaries(summaries)
    sizes = _by_size(runs)
    fig, axes = _grid(len(sizes), w=5.5, h=3.8)
    for ax, size in zip(axes, sorted(sizes, key=size_key)):
        xs = _curves_panel(ax, sizes[size], "flops")
        if xs.size:
            _compute_axis(ax, xs)
        ax.set_xlabel("training FLOPs")
        ax.set_title(f"{size}: loss vs training compute")
    fig.tight_layout()
    return save(fig, out, summaries)


class ProbeFigureInput:
    """What the heatmap draws of one probe JSON (``eval.probe``): the row name (the variant's display name, as
    the tables name it), its table order, the size and ``{site: (H, N) mean routing weights}``."""

    def __init__(self, path: Path, d: dict):
        self.routing = {k: np.asarray(v) for k, v in d["routing_mean"].items()}
        variant = str(d.get("variant") or path.stem)
        heads = d.get("routing_heads")
        # a probe JSON without its display record (eval.probe before it recorded one): its variant name
        display = display_of(d) or {"display": variant, "order": 100, "shows_heads": False}
        self.label = variant_label(display, heads if isinstance(heads, int) else None)
        self.size = d.get("size") if isinstance(d.get("size"), str) else None
        self.order = (*size_key(self.size or ""), display.get("order", 100), heads or 0, self.label)
        self.title = f"{self.label} ({self.size})" if self.size else self.label


def _routing_input(path: Path) -> ProbeFigureInput:
    """The heatmap's reading of a probe JSON (``eval.probe``)."""
    if path.suffix == ".json":
        d = read_json(path)
        if not isinstance(d, dict) or "routing_mean" not in d:
            raise AnalysisInputError(f"{path}: no 'routing_mean' (write it with `python -m eval.probe`)")
        return ProbeFigureInput(path, d)
    raise AnalysisInputError(f"{path}: routing_heatmap reads probe JSONs (routing_mean); write one with "
                             f"`python -m eval.probe --model {path} --out PROBE.json` (the evaluation stage)")


def _site_order(name: str) -> tuple:
    if name == "final":
        return (10 ** 6, 0)
    layer, kind = name[1:].split(".")
    return (int(layer), 0 if kind == "attn" else 1)


def routing_deviation(weights: np.ndarray, reference: str = "head_mean") -> np.ndarray:
    """Total-variation distance of each head's mean depth distribution from a reference.

    Args:
        weights: (H, N) mean routing weights of one site (rows sum to 1).
        reference: "head_mean" (the average over heads) or "uniform" (1/N).
    Returns:
        (H,) values in [0, 1].
    """
    w = np.asarray(weights, float)
    if w.ndim != 2:
        raise ValueError(f"weights must be (H, N), got shape {w.shape}")
    if reference == "head_mean":
        ref = w.mean(0, keepdims=True)
    elif reference == "uniform":
        ref = np.full((1, w.shape[1]), 1.0 / w.shape[1])
    else:
        raise ValueError(f"reference must be 'head_mean' or 'uniform', got {reference!r}")
    return 0.5 * np.abs(w - ref).sum(-1)


def routing_heatmap(inputs: Sequence[str | Path], out: str | Path,
                    references: Sequence[str] = ("head_mean", "uniform")) -> list[Path]:
    """Per-head routing deviation, site x head: total variation of each head's mean depth distribution
    from the head-average and from uniform; one panel per model and reference, models in table order, titled by
    the variant's display name. A panel that is identically 0 is left out and named below the panels (one
    routing head equals its head-mean by construction)."""
    items = sorted((_routing_input(Path(p)) for p in inputs), key=lambda it: it.order)
    panels, left_out = [], []
    for it in items:
        sites = sorted(it.routing, key=_site_order)
        for ref in references:
            M = np.stack([routing_deviation(it.routing[s], ref) for s in sites])  # (sites, H)
            if float(np.abs(M).max()) == 0.0:
                why = "one routing head" if ref == "head_mean" and M.shape[1] == 1 else "identically 0"
                left_out.append(f"{it.title} vs {ref.replace('_', '-')} ({why})")
                continue
            panels.append((it, ref, sites, M))
    if not panels:
        raise AnalysisInputError("routing_heatmap: every panel is identically 0 (no routing to draw): "
                                 + "; ".join(left_out))
    n_sites = max(len(p[2]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 1.6 + 0.24 * n_sites), squeeze=False,
                             layout="constrained")
    for ax, (it, ref, sites, M) in zip(axes[0], panels):
        im = ax.imshow(M, aspect="auto", cmap="viridis", vmin=0, vmax=max(float(M.max()), 1e-3))
        ax.set_yticks(range(len(sites)), sites, fontsize=6)
        ax.set_xticks(range(M.shape[1]))
        ax.set_xlabel("routing head")
        ax.set_title(f"{it.title}\nvs {ref.replace('_', '-')}", fontsize=8)
        fig.colorbar(im, ax=ax, label="TV distance")
    if left_out:
        fig.text(0.5, 0.0, "left out: " + "; ".join(left_out), ha="center", va="top", fontsize=7)
    return save(fig, out, inputs)


def head_sweep(summaries: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Tail-mean loss against routing heads H (H=1 = AttnRes) as the paired difference to the smallest
    H swept (mean ± sd over seeds), one line per size, with the paper's 1B sweep: look for the U-shape."""
    runs = [r for r in load_summaries(summaries) if r.variant in SWEPT]
    if not runs:
        raise AnalysisInputError("head_sweep needs mhar/attnres summaries")
    fig, axes = _grid(1, w=6.0)
    ax = axes[0]
    for size, groups in sorted(_by_size(runs).items()):
        byh = {(g[2] or 1): byseed for g, byseed in groups.items()}
        ref = byh[min(byh)]
        hs = sorted(byh)
        m, sd, ns = [], [], []
        for h in hs:
            seeds = sorted(set(byh[h]) & set(ref))
            d = np.array([byh[h][s].tail_mean_val_loss - ref[s].tail_mean_val_loss for s in seeds])
            m.append(d.mean() if d.size else np.nan)
            sd.append(d.std(ddof=1) if d.size > 1 else np.nan)  # no bar from one seed (not a zero bar)
            ns.append(d.size)
        n_txt = f"n={min(ns)}" if min(ns) == max(ns) else f"n={min(ns)}..{max(ns)}"
        ax.errorbar(hs, m, yerr=sd, marker="o", capsize=3,
                    label=f"ours {size} vs H={min(byh)}: mean ± sd over {n_txt} paired seeds")
    pub = load_published()
    sub = pub[pub["table"] == "heads"].sort_values("heads")
    v = sub["value"].astype(float).to_numpy()
    ax.plot(sub["heads"].astype(float), v - v[0], "k--s", alpha=0.6, label="paper 1B (vs H=1)")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("routing heads H")
    ax.set_ylabel("Δ tail-mean val loss vs smallest H (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("head-count sweep")
    return save(fig, out, summaries)


def _n_label(r) -> str:
    """How many units a CI rests on, e.g. 'n=3 seeds' / 'n=200 items'."""
    for col, unit in (("n_pairs", "seeds"), ("n_seeds", "seeds")):
        v = r.get(col)
        if v is not None and np.isfinite(float(v)) and (col == "n_pairs" or float(v) > 1):
            return f"n={int(v)} {unit}"
    v, unit = r.get("n"), r.get("unit")
    unit = unit if isinstance(unit, str) and unit else "items"
    return f"n={int(v)} {unit}" if v is not None and np.isfinite(float(v)) else "n=?"


def _same_metric(r) -> bool:
    """Whether the row's published delta is in the row's own metric (analysis.lm_metrics: bits per byte rows carry
    the paper's word-perplexity delta for its sign only)."""
    pm, m = r.get("published_metric"), r.get("metric")
    return not (isinstance(pm, str) and isinstance(m, str) and pm != m.split(",")[0])


def _delta_unit(name: str, df) -> str:
    if name.startswith("table1") or name.startswith("seeds") or name.startswith("heads"):
        return "Δ tail-mean val loss (nats; < 0 = better)"
    if "metric" in df.columns and df["metric"].nunique() == 1:
        m = str(df["metric"].iloc[0]).split(",")[0]
        unit = ("perplexity" if "perplexity" in m else "bits; < 0 = better" if m == "bits_per_byte"
                else "fraction" if m in ("acc", "acc_norm", "exact_match") else m)
        return f"Δ {m} ({unit})"
    return "paired Δ (variant - reference)"


def forest(table_csvs: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Paired deltas with 95% CIs (one panel per table CSV); x = published delta, colour = verdict."""
    import pandas as pd  # lazy: pandas (a slow import), only for this table's data

    panels = []
    for p in table_csvs:
        df = pd.read_csv(p)
        for col in ("comparison", "delta", "ci_low", "ci_high"):
            if col not in df.columns:
                raise AnalysisInputError(f"{p}: not an analysis.tables CSV (missing column {col!r})")
        df = df[df["comparison"].notna() & df["delta"].notna()]
        if df.empty:
            continue
        if "metric" in df.columns and df["metric"].nunique() > 1:  # one x-axis per unit
            for metric, sub in df.groupby("metric", sort=False):
                panels.append((f"{Path(p).stem} ({metric})", sub))
        else:
            panels.append((Path(p).stem, df))
    if not panels:
        raise AnalysisInputError("forest: no comparison rows with a delta in the given tables")
    heights = [max(1.6, 0.35 * len(df) + 1.0) for _, df in panels]
    # constrained layout keeps titles, axis labels and the figure legend from overlapping one another
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights) + 0.8), squeeze=False, layout="constrained",
                             gridspec_kw={"height_ratios": heights})
    seen: dict[str, str] = {}
    for ax, (name, df) in zip(axes[:, 0], panels):
        y = np.arange(len(df))[::-1]
        for yi, (_, r) in zip(y, df.iterrows()):
            c = _verdict_color(r.get("verdict"))
            seen.setdefault(_verdict_kind(r.get("verdict")), c)
            if np.isfinite(r["ci_low"]) and np.isfinite(r["ci_high"]):
                ax.plot([r["ci_low"], r["ci_high"]], [yi, yi], color=c, lw=2)
            ax.plot(r["delta"], yi, "o", color=c)
            if "published_delta" in df.columns and np.isfinite(r.get("published_delta", np.nan)) \
                    and _same_metric(r):  # a word-perplexity delta has no place on a bits-per-byte axis
                ax.plot(r["published_delta"], yi, "x", color="k", ms=7)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(y, [f"{c} ({_n_label(r)})" for c, (_, r) in zip(df["comparison"], df.iterrows())], fontsize=7)
        ax.set_title(f"{name}: paired delta, bar = 95% CI (x = paper)", fontsize=9)
        ax.set_xlabel(_delta_unit(name, df))
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=6))
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))  # large deltas: x 1e5 offset, short labels
        ax.grid(axis="x", alpha=0.3)
    # the legend names only the verdicts drawn (in analysis.verdict's reading order), below every panel
    order = list(VERDICT_COLORS) + ["no verdict"]
    handles = [plt.Line2D([], [], color=c, marker="o", lw=2, label=v)
               for v, c in sorted(seen.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))]
    handles.append(plt.Line2D([], [], color="k", marker="x", lw=0, label="paper"))
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncol=min(4, len(handles)))
    return save(fig, out, table_csvs)


def _cost_rows(inputs: Sequence[str | Path]):
    """The cost table's rows: read from its CSV, or built by analysis.tables from benchmark CSVs (one code path)."""
    import pandas as pd  # lazy: pandas (a slow import), only for this table's data

    if len(inputs) == 1:
        head = pd.read_csv(inputs[0], nrows=0).columns
        if {"provider", "ratio", "verdict", "published_ratio"} <= set(head):
            return pd.read_csv(inputs[0])
    return pd.DataFrame(cost_table(inputs).rows)


def cost(inputs: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Throughput ratio vs baseline (± 2 SE over repeats) and peak memory, bars per size x routing
    implementation in the table's order (``ROUTING_ROWS``; withdrawn kernels are not in the table); each bar
    says its n (the table's per-size n); x = the paper's H100 number; OOM / unmeasured cells are labelled, not
    drawn as zero."""
    df = _cost_rows(inputs)
    sizes = sorted(df["size"].astype(str).unique(), key=lambda s: (s not in paper_scales(),
                   list(paper_scales()).index(s) if s in paper_scales() else 0, s))
    order = {p: i for i, p in enumerate(ROUTING_ROWS)}
    provs = sorted(set(df["provider"]), key=lambda p: (order.get(p, len(order)), p))
    width = 0.8 / max(1, len(provs))
    panel_w = min(8.0, 1.2 + len(sizes) * (0.32 * len(provs) + 0.3))
    # constrained layout keeps the legend below the panels, clear of the axis labels
    fig, axes = plt.subplots(1, 2, figsize=(2 * panel_w, 4.2), squeeze=False, layout="constrained")
    axes = axes[0]
    for ax, col, pcol, lab in ((axes[0], "ratio", "published_ratio", "throughput / baseline (ratio)"),
                               (axes[1], "peak_mem_gb", "published_mem_gb", "peak memory (GB)")):
        for j, prov in enumerate(provs):
            xs = np.arange(len(sizes)) + (j - (len(provs) - 1) / 2) * width
            cells = [df[(df["size"].astype(str) == s) & (df["provider"] == prov)] for s in sizes]
            val = np.array([float(c[col].iloc[0]) if len(c) and pd_ok(c[col].iloc[0]) else np.nan for c in cells])
            err = None
            if col == "ratio" and "ratio_se" in df.columns:
                err = np.array([2 * float(c["ratio_se"].iloc[0]) if len(c) and pd_ok(c["ratio_se"].iloc[0]) else np.nan
                                for c in cells])
            ok = np.isfinite(val)
            ax.bar(xs[ok], val[ok], width * 0.92, label=prov, color=f"C{j}")
            if err is not None and np.isfinite(err[ok]).any():  # no bar from a single measurement
                good = ok & np.isfinite(err)
                ax.errorbar(xs[good], val[good], yerr=err[good], fmt="none", ecolor="k", capsize=2, lw=1)
            for x, c, v in zip(xs, cells, val):
                # one label at the foot of each slot: the bar's n (the table's n of that size), or why it is empty
                if not np.isfinite(v):  # failed (OOM) or never measured: say so, draw nothing
                    status = str(c["status"].iloc[0]) if len(c) and "status" in c.columns else ""
                    text, color = (vd.OOM if vd.OOM in status.upper() else vd.NOT_MEASURED), "tab:red"
                elif ax is axes[0] and len(c) and "n_ok" in c.columns and pd_ok(c["n_ok"].iloc[0]):
                    text, color = f"n={int(c['n_ok'].iloc[0])}", "white"
                else:
                    text = None
                if text:
                    ax.text(x, 0.02, text, rotation=90, ha="center", va="bottom", fontsize=6, color=color,
                            transform=ax.get_xaxis_transform())
                pv = c[pcol].iloc[0] if len(c) and pcol in c.columns else None
                if pd_ok(pv):
                    ax.plot(x, float(pv), "kx", ms=7)
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_xlabel("model size")
        ax.set_ylabel(lab)
        ax.grid(axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{j}", label=p) for j, p in enumerate(provs)]
    handles.append(plt.Line2D([], [], color="k", marker="x", lw=0, label="paper (H100)"))
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncol=min(len(handles), 4),
               title="n = runs per bar; error bar = ± 2 SE over repeats (n > 1)", title_fontsize=7)
    axes[0].set_title("throughput")
    axes[1].set_title("memory")
    return save(fig, out, inputs)


def pd_ok(v) -> bool:
    try:
        return v is not None and np.isfinite(float(v))
    except (TypeError, ValueError):
        return False


BUILDERS: dict[str, Callable[..., list[Path]]] = {
    "loss_curves": loss_curves, "loss_vs_compute": loss_vs_compute, "routing_heatmap": routing_heatmap,
    "head_sweep": head_sweep, "forest": forest, "cost": cost}


def make_figure(kind: str, inputs: Sequence[str | Path], out: str | Path, command: Optional[str] = None) -> list[Path]:
    """Draw figure ``kind`` from ``inputs`` into OUT.png and OUT.pdf."""
    if kind not in BUILDERS:
        raise ValueError(f"unknown figure {kind!r}; choose one of {', '.join(KINDS)}")
    if not inputs:
        raise AnalysisInputError(f"{kind}: no inputs given")
    _COMMAND[:] = [command or f"python -m analysis.figures {kind} --inputs {' '.join(map(str, inputs))} --out {out}"]
    try:
        return BUILDERS[kind](list(inputs), out)
    finally:
        _COMMAND.clear()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.figures", description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--inputs", "--runs", "--summaries", "--tables", "--bench", dest="inputs", nargs="+",
                    required=True)
    ap.add_argument("--out", required=True, help="output prefix; writes PREFIX.png and PREFIX.pdf")
    a = ap.parse_args(argv)
    return run_cli("analysis.figures", lambda cmd: make_figure(a.kind, a.inputs, a.out, command=cmd), argv)


if __name__ == "__main__":
    sys.exit(main())
