"""The training benchmark's CPU path: one process per (size, variant), a CSV row per run with ratios and
provenance columns (the GPU numbers themselves come from benchmarks/gpu_session.sh, results/bench/)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_training_cpu_rows(tmp_path, monkeypatch):
    from benchmarks import bench_training
    monkeypatch.chdir(ROOT)  # the per-run processes import `benchmarks` from the repository root
    out = tmp_path / "training.csv"
    bench_training.main(["--sizes", "debug", "--variants", "baseline", "mhar_eager", "--device", "cpu",
                         "--backend", "none", "--steps", "1", "--warmup", "1", "--graph", "0",
                         "--trainer-steps", "6", "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert [(r["variant"], r["mode"]) for r in rows] == [("baseline", "step"), ("baseline", "trainer"),
                                                         ("mhar_eager", "step"), ("mhar_eager", "trainer")]
    assert all(r["status"] == "ok" and float(r["tokens_per_s"]) > 0 for r in rows)
    # the trainer rows come from real `python -m mhar.train` runs of the same model
    assert rows[0]["params"] == rows[1]["params"] and rows[2]["params"] == rows[3]["params"]
    assert rows[1]["step_plan"].startswith("compile=none cuda_graph=False")
    t_base, t_mhar = rows[1], rows[3]
    assert float(t_mhar["thr_ratio"]) == pytest.approx(float(t_mhar["tokens_per_s"]) / float(t_base["tokens_per_s"]),
                                                      rel=1e-3)
    base, mhar = rows[0], rows[2]
    assert float(mhar["thr_ratio"]) == pytest.approx(float(mhar["tokens_per_s"]) / float(base["tokens_per_s"]),
                                                    rel=1e-3)
    assert int(mhar["params"]) > int(base["params"])  # routing adds parameters
    assert mhar["cuda_graph"] == "0" and mhar["torch"]
    # the recorded command reproduces these rows, even when main() is called from another process
    assert mhar["command"].startswith("PYTHONPATH=. python -m benchmarks.bench_training --sizes debug")


def test_bench_training_rejects_unknown_variant(capsys):
    from benchmarks import bench_training
    with pytest.raises(SystemExit):
        bench_training.main(["--variants", "mhar_turbo", "--device", "cpu"])
    assert "invalid choice" in capsys.readouterr().err


def test_bench_training_trainer_only_rows(tmp_path, monkeypatch):
    """--trainer-only: the trainer rows alone (a row missing from an earlier GPU call, without re-timing the step)."""
    from benchmarks import bench_training
    monkeypatch.chdir(ROOT)
    out = tmp_path / "trainer.csv"
    bench_training.main(["--sizes", "debug", "--variants", "baseline", "--device", "cpu", "--backend", "none",
                         "--graph", "0", "--trainer-steps", "6", "--trainer-only", "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert [(r["variant"], r["mode"], r["status"]) for r in rows] == [("baseline", "trainer", "ok")]
    assert float(rows[0]["tokens_per_s"]) > 0
