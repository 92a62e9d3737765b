"""analysis.figures: every figure kind is produced from result files as a non-empty PNG + PDF with
provenance; the averaging behind the curves is checked against numpy."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.image import imread
from PIL import Image

try:  # tests/ on sys.path (pytest's default rootdir-less import mode)
    import fixtures_analysis as fx
except ImportError:  # tests imported as a package
    from tests import fixtures_analysis as fx
from analysis import figures
from analysis.load.common import AnalysisInputError
from analysis.load.metrics import val_curve
from analysis.load.runs import load_summaries, load_summary
from analysis.tables.rows import group_runs
from analysis.tables.build import make_table
from analysis import verdict as vd


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fig")
    runs = fx.make_runs(root, sizes=("tiny",), seeds=(0, 1))
    make_table("table1", runs, root / "rep" / "table1")
    dirs, _ = fx.make_downstream(root / "ds", n=60)
    make_table("downstream", dirs, root / "rep" / "downstream", n_resamples=199)
    bench = fx.write_bench(root / "bench.csv")
    rng = np.random.default_rng(0)
    routing = {s: rng.dirichlet(np.ones(n), size=4).tolist()
               for s, n in (("L0.attn", 1), ("L0.mlp", 2), ("L1.attn", 3), ("L1.mlp", 4), ("final", 5))}
    probe_json = root / "probe.json"
    probe_json.write_text(json.dumps({"model": "m", "routing_mean": routing, "kl_trained": 0.1, "kl_null": 0.1}))
    return {"root": root, "runs": runs, "bench": bench, "probe": probe_json,
            "tables": [root / "rep" / "table1.csv", root / "rep" / "downstream.csv"]}


def _check_image(prefix):
    png, pdf = prefix.with_name(prefix.name + ".png"), prefix.with_name(prefix.name + ".pdf")
    img = imread(png)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.02  # something was drawn, not a blank canvas
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 2000
    desc = json.loads(Image.open(png).info["Description"])
    assert desc["command"].startswith("python -m analysis.figures") and desc["inputs"]


@pytest.mark.parametrize("kind", ["loss_curves", "loss_vs_compute", "head_sweep"])
def test_run_figures(data, kind):
    out = data["root"] / "figs" / kind
    assert figures.main([kind, "--inputs", *map(str, data["runs"]), "--out", str(out)]) == 0
    _check_image(out)


def test_forest_cost_and_heatmap(data):
    out = data["root"] / "figs"
    figures.make_figure("forest", data["tables"], out / "forest")
    _check_image(out / "forest")
    figures.make_figure("cost", [data["bench"]], out / "cost")
    _check_image(out / "cost")
    figures.make_figure("routing_heatmap", [data["probe"]], out / "heat")
    _check_image(out / "heat")


def _overlaps(boxes) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


def test_forest_is_legible(tmp_path, monkeypatch):
    """The committed forest.png had overlapping x tick labels (word-perplexity deltas of -350000), the x label
    under the legend and 9 legend entries for 2 verdicts drawn. Rendered: no two tick labels of an axis
    overlap, no axis label or title touches the legend, and the legend names only the verdicts drawn."""
    rows = [{"comparison": f"v{i} - baseline: wikitext (tiny, seeds 0)", "metric": "word_perplexity",
             "delta": -216087.788 + 3e4 * i, "ci_low": -360217.778, "ci_high": -116700.584 + 1e4 * i,
             "published_delta": -5.5, "verdict": vd.MODELS_DIFFER, "n": 50, "unit": "documents"} for i in range(2)]
    rows += [{"comparison": f"v{i} - baseline (tiny)", "metric": "acc", "delta": 0.01 * i, "ci_low": -0.02,
              "ci_high": 0.03, "published_delta": -0.02, "verdict": vd.SAME_SIGN if i else vd.INCONCLUSIVE,
              "n": 3, "unit": "seeds"} for i in range(3)]
    pd.DataFrame(rows).to_csv(tmp_path / "downstream.csv", index=False)
    figs = _capture(monkeypatch)
    figures.make_figure("forest", [tmp_path / "downstream.csv"], tmp_path / "forest")
    fig = figs[0]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legend = fig.legends[0]
    assert {t.get_text() for t in legend.get_texts()} == {vd.MODELS_DIFFER, vd.SAME_SIGN, vd.INCONCLUSIVE, "paper"}
    lbox = legend.get_window_extent(r)
    for ax in fig.axes:
        ticks = [t.get_window_extent(r) for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert len(ticks) >= 2 and not _overlaps(ticks), [t.get_text() for t in ax.get_xticklabels()]
        for text in (ax.xaxis.label, ax.title, *ax.get_xticklabels()):
            if text.get_text():
                assert not text.get_window_extent(r).overlaps(lbox), text.get_text()
    labels = [ax.xaxis.label.get_window_extent(r) for ax in fig.axes]
    titles = [ax.title.get_window_extent(r) for ax in fig.axes]
    assert not _overlaps(labels + titles)


def test_routing_heatmap_from_a_models_probe(tmp_path):
    """The evaluation stage probes the model (eval.probe); the figure (analysis stage) reads the probe JSON."""
    from eval.probe import run_probe
    from mhar.runs.checkpoint import save_model
    from mhar.model.config import model_config
    from mhar.model.transformer import build_model

    torch.manual_seed(0)
    m = build_model(model_config("debug", residual={"variant": "mhar", "heads": 4}))
    with torch.no_grad():
        m.residual.queries.normal_(0, 0.5)
    path = save_model(tmp_path / "model.pt", m, "byte")
    with pytest.raises(AnalysisInputError, match="python -m eval.probe"):  # a model is the evaluation stage's input
        figures._routing_input(path)
    run_probe(path, tmp_path / "probe.json", batch=2, seq_len=32, null_draws=1)
    figures.make_figure("routing_heatmap", [tmp_path / "probe.json"], tmp_path / "heat")
    _check_image(tmp_path / "heat")
    # what is plotted: per site, each head's mean depth distribution over the sources seen so far
    probe = figures._routing_input(tmp_path / "probe.json")
    assert probe.title == "MHAR H=4"  # the display record the probe writes (no run folder here: no size)
    rm = probe.routing
    sites = sorted(rm, key=figures._site_order)
    assert sites == [f"L{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}" for i in range(4)] + ["final"]
    for n, site in enumerate(sites):
        assert rm[site].shape == (4, n + 1)
        np.testing.assert_allclose(rm[site].sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(rm["L0.attn"], 1.0)  # the first sublayer can only read the embedding
    assert np.abs(rm["final"] - rm["final"].mean(0)).max() > 1e-3  # random queries: heads differ


def test_mean_band_matches_numpy(data):
    runs = load_summaries(data["runs"])
    grp = group_runs(runs)[("mhar", "tiny", 4, ())]
    curves = [val_curve(r) for r in grp.values()]
    xs, m, lo, hi = figures._mean_band(curves, "flops")
    L = np.stack([c["loss"] for c in curves])
    np.testing.assert_allclose(m, L.mean(0))
    np.testing.assert_allclose(lo, L.min(0))
    np.testing.assert_allclose(hi, L.max(0))
    np.testing.assert_allclose(xs, curves[0]["flops"])
    assert curves[0]["loss"][-3:].mean() == pytest.approx(grp[0].tail_mean_val_loss)


def test_val_curve_falls_back_to_summary(data, tmp_path):
    p = fx.write_run(tmp_path, "baseline", "tiny", 0, 3.5)
    (p.parent / "metrics.jsonl").unlink()
    c = val_curve(load_summary(p))
    s = json.loads(p.read_text())
    np.testing.assert_allclose(c["loss"], [v for _, v in s["val_losses"]])
    assert c["flops"][-1] == pytest.approx(s["flops"])  # compute axes interpolated from the run totals


def test_bad_figure_inputs(data, tmp_path, capsys):
    not_a_table = tmp_path / "x.csv"
    not_a_table.write_text("a,b\n1,2\n")
    assert figures.main(["forest", "--inputs", str(not_a_table), "--out", str(tmp_path / "f")]) == 2
    assert "not an analysis.tables CSV" in capsys.readouterr().err
    with pytest.raises(AnalysisInputError, match="routing_mean"):
        bad = tmp_path / "p.json"
        bad.write_text("{}")
        figures.make_figure("routing_heatmap", [bad], tmp_path / "h")


def _capture(monkeypatch):
    figs = []
    monkeypatch.setattr(figures, "save", lambda fig, out, inputs: figs.append(fig) or [])
    return figs


def test_cost_figure_draws_the_cost_table_and_marks_oom(tmp_path, monkeypatch):
    """The committed cost.png once showed 0.49/0.26/0.25 beside a table saying 0.83/0.73/0.69: the figure
    now draws the table's own rows (from its CSV), and an OOM cell is labelled, not a zero bar."""
    bench = fx.write_bench_training(tmp_path / "training.csv")
    make_table("cost", [bench], tmp_path / "cost")
    figs = _capture(monkeypatch)
    figures.make_figure("cost", [tmp_path / "cost.csv"], tmp_path / "fig")
    ax = figs[0].axes[0]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    table = pd.read_csv(tmp_path / "cost.csv")
    assert heights == sorted(round(x, 6) for x in table["ratio"].dropna())  # eager OOM: no bar at all
    assert any(t.get_text() == "OOM" for t in ax.texts)
    assert "ratio" in ax.get_ylabel() and "GB" in figs[0].axes[1].get_ylabel()
    assert sorted(t.get_text() for t in ax.texts if t.get_text().startswith("n=")) == \
        sorted(f"n={n}" for n in table["n_ok"] if n > 0)  # each bar's n is the table's
    figures.make_figure("cost", [bench], tmp_path / "fig2")  # from bench CSVs: the same table, built first
    assert sorted(round(p.get_height(), 6) for p in figs[1].axes[0].patches) == heights


def test_forest_and_head_sweep_say_n_and_units(data, monkeypatch):
    figs = _capture(monkeypatch)
    figures.make_figure("forest", data["tables"], data["root"] / "f")
    labels = [t.get_text() for ax in figs[0].axes for t in ax.get_yticklabels()]
    assert labels and all("n=" in x for x in labels)
    assert any("seeds" in x for x in labels) and any("questions" in x for x in labels)
    assert any("documents" in x for x in labels)  # wikitext perplexity: the document is the unit
    assert "nats" in figs[0].axes[0].get_xlabel()
    figures.make_figure("head_sweep", data["runs"], data["root"] / "h")
    leg = [t.get_text() for t in figs[1].axes[0].get_legend().get_texts()]
    assert any("n=2 paired seeds" in x for x in leg) and "nats" in figs[1].axes[0].get_ylabel()


# --- layout for reading (issue 59): display names, no empty panel, today's kernels, legible ticks, one order ----
def _texts(fig):
    """Every drawn text of the figure with its window extent (axes texts, ticks, labels, titles, legends)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        ticks = [t for minor in (False, True)  # the labels drawn (in view), minor ones too (log axes label those)
                 for t in [*(x for x in ax.get_xticklabels(minor=minor) if x0 <= x.get_position()[0] <= x1),
                           *(y for y in ax.get_yticklabels(minor=minor) if y0 <= y.get_position()[1] <= y1)]]
        items = [*ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label, *ticks]
        if ax.get_legend() is not None:
            items += [*ax.get_legend().get_texts(), ax.get_legend().get_title()]
        out += [t for t in items if t.get_visible() and t.get_text()]
    for leg in fig.legends:
        out += [t for t in (*leg.get_texts(), leg.get_title()) if t.get_text()]
    out += [t for t in fig.texts if t.get_text()]
    return [(t.get_text(), t.get_window_extent(r)) for t in out]


def _no_text_overlaps(fig):
    texts = _texts(fig)
    bad = [(a[0], b[0]) for i, a in enumerate(texts) for b in texts[i + 1:] if a[1].overlaps(b[1])]
    assert not bad, bad


def _legend_labels(fig) -> list[str]:
    legs = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [t.get_text() for leg in legs for t in leg.get_texts()]


def _bench_three_sizes(path):
    """Training records at three sizes: today's paths (compile unmeasured at 1B, eager OOM at 1B) and withdrawn
    kernel experiments (fused_sg8, fused_v7_sg8) as the committed results/bench/training.csv holds them."""
    rows = ["size,variant,heads,tokens_per_s,peak_mem_gib,status,thr_ratio,routing_resolved"]
    for size, base in (("100M", 4e5), ("350M", 1e5), ("1B", 4e4)):
        for rep in range(3 if size == "1B" else 2):
            rows.append(f"{size},baseline,0,{base * (1 + 0.01 * rep)},10.0,ok,,")
            rows.append(f"{size},mhar_fused,8,{base * 0.9},10.5,ok,{0.9 + 0.001 * rep},fused")
            rows.append(f"{size},mhar_fused_sg8,8,{base * 0.88},10.4,ok,0.88,")
            rows.append(f"{size},mhar_fused_v7_sg8,8,{base * 0.89},10.4,ok,0.89,")
        if size != "1B":
            rows.append(f"{size},mhar_compile,8,{base * 0.4},20.0,ok,,compile")
            rows.append(f"{size},mhar_eager,8,{base * 0.3},30.0,ok,,eager")
        else:
            rows.append(f"{size},mhar_eager,8,,,OOM,,eager")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cost_table_and_figure_show_todays_routing_paths_legibly(tmp_path, monkeypatch):
    """The committed cost.png: a 2318x519 canvas, overlapping rotated 'not measured' labels, a legend of ten
    withdrawn kernels and one n per implementation that disagreed with the table's per-size n."""
    from analysis.tables.cost import ROUTING_ROWS
    from mhar.model.choices import ROUTING_IMPLS

    assert set(ROUTING_IMPLS) <= set(ROUTING_ROWS)
    make_table("cost", [_bench_three_sizes(tmp_path / "training.csv")], tmp_path / "cost")
    table = pd.read_csv(tmp_path / "cost.csv")
    assert set(table["provider"]) == {"baseline", "eager", "compile", "fused"}  # withdrawn kernels left out
    md = (tmp_path / "cost.md").read_text()
    assert "fused_sg8 (7 records), fused_v7_sg8 (7 records)" in md and "| fused_sg8 |" not in md
    figs = _capture(monkeypatch)
    figures.make_figure("cost", [tmp_path / "cost.csv"], tmp_path / "fig")
    fig = figs[0]
    w, h = fig.get_size_inches()
    assert w / h < 3.2, (w, h)
    labels = _legend_labels(fig)
    assert labels == ["baseline", "eager", "compile", "fused", "paper (H100)"]  # the table's order
    _no_text_overlaps(fig)
    ax = fig.axes[0]
    marks = sorted(t.get_text() for t in ax.texts)
    # each bar says its own n, the table's n of that size; empty slots say why
    want = sorted([f"n={int(n)}" for n in table["n_ok"] if n > 0] + ["OOM", "not measured"])
    assert marks == want, (marks, want)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    panels = [a.get_window_extent(r) for a in fig.axes]
    assert all(not leg.get_window_extent(r).overlaps(p) for leg in fig.legends for p in panels)


def _probe_json(path, variant, heads, display, order, routing):
    path.write_text(json.dumps({"model": f"results/runs/{variant}/tiny/seed0/4d1773f260/model.pt",
                                "variant": variant, "routing_heads": heads, "size": "tiny",
                                "display": {"display": display, "order": order, "shows_heads": variant == "mhar"},
                                "routing_mean": routing, "kl_trained": 0.1, "kl_null": 0.1}))
    return path


def test_routing_heatmap_titles_by_display_name_in_table_order_without_empty_panels(tmp_path, monkeypatch):
    """The committed heatmap titled its panels by hash paths (tiny/seed0/4d1773f260/model.pt) and gave AttnRes
    (one head) a 'vs head-mean' panel that is identically 0."""
    rng = np.random.default_rng(1)
    sites = (("L0.attn", 1), ("L0.mlp", 2), ("L1.attn", 3), ("L1.mlp", 4), ("final", 5))
    mhar = _probe_json(tmp_path / "mhar.json", "mhar", 4, "MHAR", 4,
                       {s: rng.dirichlet(np.ones(n), size=4).tolist() for s, n in sites})
    attn = _probe_json(tmp_path / "attnres.json", "attnres", 1, "single-head (AttnRes)", 2,
                       {s: rng.dirichlet(np.ones(n), size=1).tolist() for s, n in sites})
    figs = _capture(monkeypatch)
    figures.make_figure("routing_heatmap", [mhar, attn], tmp_path / "heat")
    fig = figs[0]
    heat = [ax for ax in fig.axes if ax.images]
    titles = [ax.get_title() for ax in heat]
    assert titles == ["single-head (AttnRes) (tiny)\nvs uniform", "MHAR H=4 (tiny)\nvs head-mean",
                      "MHAR H=4 (tiny)\nvs uniform"]
    assert not any("model.pt" in t or "seed0" in t for t in titles)
    for ax in heat:
        assert np.asarray(ax.images[0].get_array()).max() > 0  # no identically-zero panel
    assert any("single-head (AttnRes) (tiny) vs head-mean (one routing head)" in t.get_text() for t in fig.texts)
    _no_text_overlaps(fig)


def _span_runs(root, steps, every):
    return [fx.write_run(root, v, "tiny", s, 3.0 + 0.01 * (v == "baseline") + 0.001 * s, heads=h, label=lab,
                         steps=steps, every=every)
            for v, h, lab in (("mhar", 4, "mhar"), ("hyper", None, "hyper"), ("baseline", None, "baseline"),
                              ("attnres", 1, "attnres"))
            for s in (0, 1)]


@pytest.mark.parametrize("steps,every", [(200, 20), (300, 10), (100, 20), (3000, 10)])
def test_loss_figures_have_legible_ticks_and_the_table_order(tmp_path, monkeypatch, steps, every):
    """loss_vs_compute's log axis labelled minor ticks that collided (2x10^1 3x10^1 4x10^1 ...); its legend and
    loss_curves' were in alphabetical order, not the table's."""
    runs = _span_runs(tmp_path, steps, every)
    figs = _capture(monkeypatch)
    figures.make_figure("loss_vs_compute", runs, tmp_path / "lvc")
    figures.make_figure("loss_curves", runs, tmp_path / "lc")
    make_table("table1", runs, tmp_path / "t1")
    order = pd.read_csv(tmp_path / "t1.csv")["method"].tolist()
    assert order == ["baseline", "hyper-conn", "single-head (AttnRes)", "MHAR H=4"]
    for fig in figs:
        assert [x.split(" (mean of")[0] for x in _legend_labels(fig)] == order
        _no_text_overlaps(fig)
        fig.canvas.draw()
        for ax in fig.axes:
            ticks = [t for t in ax.get_xticklabels() if t.get_text()]
            lo, hi = ax.get_xlim()
            assert len([t for t in ticks if lo <= t.get_position()[0] <= hi]) >= 2, [t.get_text() for t in ticks]
    assert "wall" not in figs[0].axes[0].get_xlabel() and len(figs[0].axes) == 1
