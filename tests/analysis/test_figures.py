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
from analysis.load.runs import group_runs, load_summaries, load_summary
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
    _, rm = figures._routing_input(tmp_path / "probe.json")
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
    assert all("n=" in t.get_text() for t in ax.get_legend().get_texts())
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
