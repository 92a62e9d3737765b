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

from .load.common import AnalysisInputError, read_json, run_cli  # noqa: E402
from .load.metrics import val_curve  # noqa: E402
from mhar.runs.sidecar import provenance  # noqa: E402
from .load.published import load_published, paper_scales  # noqa: E402
from .load.runs import RunSummary, group_runs, load_summaries, run_label  # noqa: E402
from .tables.cost import cost_table  # noqa: E402
from .tables.heads import SWEPT  # noqa: E402
from mhar.runs import sidecar  # noqa: E402

KINDS = ("loss_curves", "loss_vs_compute", "routing_heatmap", "head_sweep", "forest", "cost")
VERDICT_COLORS = {"reproduced": "tab:green", "same sign as paper": "yellowgreen", "not reproduced": "tab:red",
                  "opposite sign to paper": "lightcoral", "effect differs": "tab:orange",
                  "inconclusive at this power": "tab:gray", "insufficient evidence": "silver",
                  "models differ (single seed)": "tab:purple", "no detectable difference (single seed)": "tab:brown"}


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
    # no CreationDate: the same inputs give the same bytes
    fig.savefig(pdf, bbox_inches="tight", metadata={"Creator": "mhar analysis.figures", "Subject": desc[:2000],
                                                    "CreationDate": None})
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


def loss_curves(summaries: Sequence[str | Path], out: str | Path, x: str = "step") -> list[Path]:
    """Validation loss per variant (mean over seeds, band = min..max across seeds), one panel per size."""
    runs = load_summaries(summaries)
    sizes = _by_size(runs)
    fig, axes = _grid(len(sizes))
    for ax, size in zip(axes, sorted(sizes)):
        for g in sorted(sizes[size], key=lambda g: (g[0], g[2] or 0)):
            byseed = sizes[size][g]
            curves = [val_curve(r) for r in byseed.values()]
            xs, m, lo, hi = _mean_band(curves, x)
            lab = run_label(next(iter(byseed.values())), g[3])
            line, = ax.plot(xs, m, color=_color(lab), label=f"{lab} (mean of n={len(curves)} seeds"
                                                              + (", band min..max)" if len(curves) > 1 else ")"))
            if len(curves) > 1:
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(f"{size}: validation loss")
        ax.set_xlabel({"step": "step", "wall_s": "wall-clock (s)", "flops": "FLOPs"}.get(x, x))
        ax.set_ylabel("val loss (nats)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, out, summaries)


def loss_vs_compute(summaries: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Validation loss against wall-clock (left) and FLOPs (right), mean over seeds; one row per size."""
    runs = load_summaries(summaries)
    sizes = _by_size(runs)
    fig, axes = plt.subplots(len(sizes), 2, figsize=(10, 3.6 * len(sizes)), squeeze=False)
    for row, size in zip(axes, sorted(sizes)):
        groups = sizes[size]
        for ax, key, lab in ((row[0], "wall_s", "wall-clock (s)"), (row[1], "flops", "training FLOPs")):
            unmeasured = []
            for g in sorted(groups, key=lambda g: (g[0], g[2] or 0)):
                curves = [val_curve(r) for r in groups[g].values()]
                xs, m, lo, hi = _mean_band(curves, key)
                name = run_label(next(iter(groups[g].values())), g[3])
                if not np.isfinite(xs).any():
                    unmeasured.append(name)
                    continue
                ax.plot(xs, m, color=_color(name), label=f"{name} (n={len(curves)} seeds"
                                                          + (", band min..max)" if len(curves) > 1 else ")"))
                if len(curves) > 1:
                    ax.fill_between(xs, lo, hi, color=_color(name), alpha=0.2, linewidth=0)
            ax.set_xlabel(lab)
            ax.set_ylabel("val loss (nats)")
            ax.set_xscale("log")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            ax.set_title(f"{size}: loss vs {'wall-clock' if key == 'wall_s' else 'compute'}")
            if unmeasured:
                ax.text(0.02, 0.02, "not measured: " + ", ".join(unmeasured), transform=ax.transAxes, fontsize=7,
                        color="tab:red")
    fig.tight_layout()
    return save(fig, out, summaries)


def _routing_input(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """(title, {site: (H, N) mean routing weights}) from a probe JSON (``eval.probe``)."""
    if path.suffix == ".json":
        d = read_json(path)
        if not isinstance(d, dict) or "routing_mean" not in d:
            raise AnalysisInputError(f"{path}: no 'routing_mean' (write it with `python -m eval.probe`)")
        return d.get("model") or path.stem, {k: np.asarray(v) for k, v in d["routing_mean"].items()}
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
    from the head-average (left) and from uniform (right); one row of panels per model."""
    items = [_routing_input(Path(p)) for p in inputs]
    fig, axes = plt.subplots(len(items), len(references), figsize=(4.8 * len(references), 6.0 * len(items)),
                             squeeze=False)
    for row, (title, rm) in zip(axes, items):
        sites = sorted(rm, key=_site_order)
        short = "/".join(Path(title).parts[-4:]) if "/" in title else title  # e.g. mhar/tiny/seed0/model.pt
        for ax, ref in zip(row, references):
            M = np.stack([routing_deviation(rm[s], ref) for s in sites])  # (sites, H)
            im = ax.imshow(M, aspect="auto", cmap="viridis", vmin=0, vmax=max(float(M.max()), 1e-3))
            ax.set_yticks(range(len(sites)), sites, fontsize=6)
            ax.set_xticks(range(M.shape[1]))
            ax.set_xlabel("routing head")
            ax.set_title(f"{short}\nvs {ref.replace('_', '-')}", fontsize=8)
            fig.colorbar(im, ax=ax, label="TV distance")
    fig.tight_layout()
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
    import pandas as pd

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
    import pandas as pd

    if len(inputs) == 1:
        head = pd.read_csv(inputs[0], nrows=0).columns
        if {"provider", "ratio", "verdict", "published_ratio"} <= set(head):
            return pd.read_csv(inputs[0])
    return pd.DataFrame(cost_table(inputs).rows)


def cost(inputs: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Throughput ratio vs baseline (± 2 SE over repeats) and peak memory, bars per size x routing
    implementation; x = the paper's H100 number; OOM / unmeasured cells are labelled, not drawn as zero."""
    df = _cost_rows(inputs)
    sizes = sorted(df["size"].astype(str).unique(), key=lambda s: (s not in paper_scales(),
                   list(paper_scales()).index(s) if s in paper_scales() else 0, s))
    known = ("baseline", "eager", "compile", "fused")
    provs = [p for p in known if p in set(df["provider"])] + sorted(set(df["provider"]) - set(known))
    fig, axes = _grid(2, w=5.5)
    width = 0.8 / max(1, len(provs))
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
            n = [int(c["n_ok"].iloc[0]) if len(c) and "n_ok" in c.columns and pd_ok(c["n_ok"].iloc[0]) else 0
                 for c in cells]
            ax.bar(xs[ok], val[ok], width, label=f"{prov} (n={max(n) if n else 0} runs)" if ax is axes[0] else prov,
                   color=f"C{j}")
            if err is not None and np.isfinite(err[ok]).any():  # no bar from a single measurement
                good = ok & np.isfinite(err)
                ax.errorbar(xs[good], val[good], yerr=err[good], fmt="none", ecolor="k", capsize=2, lw=1)
            for x, c, v in zip(xs, cells, val):
                if not np.isfinite(v):  # failed (OOM) or never measured: say so, draw nothing
                    status = str(c["status"].iloc[0]) if len(c) and "status" in c.columns else ""
                    ax.text(x, 0.02, "OOM" if "OOM" in status.upper() else "not measured", rotation=90,
                            ha="center", va="bottom", fontsize=7, color="tab:red", transform=ax.get_xaxis_transform())
                pv = c[pcol].iloc[0] if len(c) and pcol in c.columns else None
                if pd_ok(pv):
                    ax.plot(x, float(pv), "kx", ms=7)
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_xlabel("model size")
        ax.set_ylabel(lab)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, title="x = paper (H100); error bar = ± 2 SE over repeats (n > 1)",
                   title_fontsize=7, loc="upper center", bbox_to_anchor=(1.1, -0.15), ncol=len(provs))
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
