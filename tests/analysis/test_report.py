"""analysis.report: which files a report reads (its own config's outputs only) and its reading lines."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

import fixtures_analysis as fx
from analysis import report
from analysis import verdict as vd
from analysis.tables.build import make_table


def _probe(path: Path, model: str, kl: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": model, "slices": 4, "n_tokens": 10, "kl_trained": kl, "kl_null": 0.05,
                                "mean_pairwise_cosine": 0.2}))
    return path


def _two_configs(tmp_path):
    """reports/ of the default config, with the GPU config's reports in reports/gpu_small/ as committed."""
    rep = tmp_path / "reports"
    runs = fx.make_runs(tmp_path / "cpu", sizes=("tiny",), seeds=(0, 1))
    make_table("table1", runs, rep / "table1")
    own = _probe(rep / "probe" / "tiny" / "mhar.json", "results/runs/mhar/tiny/seed0/4d1773f260/model.pt", 0.3)
    gpu_runs = fx.make_runs(tmp_path / "gpu", sizes=("100M",), seeds=(0, 1))
    make_table("seeds", gpu_runs, rep / "gpu_small" / "seeds")
    _probe(rep / "gpu_small" / "probe" / "small" / "attnres.json",
           "results/runs/124b30514b/attnres/small/seed0/aaaa/model.pt", 0.9)
    return rep, own


def test_report_reads_only_its_own_configs_outputs(tmp_path):
    """`report` for config/config.yaml listed reports/gpu_small/probe/ rows (paths absent from a fresh clone) and
    would take another config's table where its own was missing: it globbed reports/ recursively."""
    rep, own = _two_configs(tmp_path)
    for inputs in (None, [rep / "table1.csv", rep / "table1.md", rep / "table1.tex", own]):  # CLI / workflow
        text = report.build_report(rep, rep / "REPORT.md", inputs)
        assert "124b30514b" not in text and "small/seed0" not in text
        assert "4d1773f260" in text and "| 0.3000 |" in text
        assert "## Seed table" not in text and "table `seeds`" in text[text.index("## Missing"):]
    # the workflow's list is all it reads: a probe JSON in the folder but not among the inputs is not reported
    text = report.build_report(rep, rep / "REPORT.md", [rep / "table1.csv", rep / "table1.md"])
    assert "## Mechanism probe" not in text and "mechanism probe" in text[text.index("## Missing"):]
    assert report.main(["--reports", str(rep), "--out", str(rep / "R.md"), "--inputs", str(own)]) == 0
    assert "4d1773f260" in (rep / "R.md").read_text() and "## Table 1" not in (rep / "R.md").read_text()


def _reading(tmp_path, rows) -> str:
    cols = ["comparison", "delta", "ci_low", "ci_high", "p", "p_holm", "verdict"]
    pd.DataFrame(rows, columns=cols).to_csv(tmp_path / "t.csv", index=False)
    return report.table_reading("downstream", tmp_path / "t.csv")


def test_reading_picks_by_the_deciding_holm_p_and_says_when_nothing_stands_out(tmp_path):
    """The committed CPT reading called 'MHAR - plain CPT: Δ +0.000 [+0.000, +0.000], p=1' the 'strongest' result."""
    text = _reading(tmp_path, [["MHAR - plain CPT: gpqa", 0.0, 0.0, 0.0, 1.0, 1.0, vd.NO_DIFFERENCE],
                               ["MHAR - plain CPT: gsm8k", 0.0, 0.0, 0.0, 1.0, 1.0, vd.NO_DIFFERENCE]])
    assert "strongest" not in text and "no result stands out" in text and "+0.000" not in text
    # raw p below alpha, Holm's (what the verdict used) not: nothing stands out either
    text = _reading(tmp_path, [["a - baseline", -0.02, -0.04, -0.001, 0.03, 0.06, vd.INCONCLUSIVE],
                               ["b - baseline", -0.01, -0.03, 0.01, 0.04, 0.06, vd.INCONCLUSIVE]])
    assert "no result stands out" in text and "2 tested" in text
    # the smallest Holm p wins, not the smallest raw p, and the Holm p is the one quoted
    text = _reading(tmp_path, [["a - baseline", -0.5, -0.9, -0.1, 0.001, 0.04, vd.REPRODUCED],
                               ["b - baseline", -0.2, -0.3, -0.1, 0.0004, 0.03, vd.REPRODUCED],
                               ["c - baseline", 0.0, -0.1, 0.1, 0.9, 0.9, vd.INCONCLUSIVE]])
    assert "stands out (1 of 2 with p (Holm) < 0.05): b - baseline: Δ -0.200 [-0.300, -0.100], p (Holm)=0.03" in text
    # a row without any test (one seed) is never the headline
    text = _reading(tmp_path, [["H=2 - H=1 (tiny)", 0.056, None, None, None, None, vd.INSUFFICIENT]])
    assert "no result stands out (no comparison carries a test)" in text and "+0.056" not in text
