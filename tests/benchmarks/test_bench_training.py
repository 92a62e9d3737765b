"""The training benchmark's CPU path: one process per (size, variant), a CSV row per run with ratios and
provenance columns (the GPU numbers themselves come from benchmarks/gpu_session.sh, results/bench/)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_training_cpu_rows(tmp_path, monkeypatch):
    from benchmarks import bench_training
    monkeypatch.chdir(ROOT)  # the per-run processes import `benchmarks` from the repository root
    out = tmp_path / "training.csv"
    bench_training.main(["--sizes", "debug", "--variants", "baseline", "mhar_eager", "--device", "cpu",
                         "--backend", "none", "--steps", "1", "--warmup", "1", "--graph", "0",
                         "--trainer-steps", "6", "--runs-dir", str(tmp_path / "runs"), "--out", str(out)])
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
    # the routing each row ran (the cost table names rows by it)
    assert [r["routing_resolved"] for r in rows] == ["", "", "eager", "eager"] and mhar["pdl"] == "0"
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
                         "--graph", "0", "--trainer-steps", "6", "--trainer-only", "--runs-dir", str(tmp_path / "runs"),
                         "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert [(r["variant"], r["mode"], r["status"]) for r in rows] == [("baseline", "trainer", "ok")]
    assert float(rows[0]["tokens_per_s"]) > 0
    # the trainer ran in --runs-dir (tests running at once no longer share results/cache/bench_runs' run folders)
    assert (tmp_path / "runs" / "debug-baseline" / "summary.json").is_file()


def test_bench_training_repeats_pair_each_mhar_row_with_its_own_baseline(tmp_path, monkeypatch, capsys):
    """--repeats 2: the variants run twice in fresh processes; each MHAR ratio uses the baseline of the same
    repeat, and the summary's mean / 95% interval are scipy's t interval over the repeats' ratios."""
    import json

    import numpy as np
    from scipy import stats

    from benchmarks import bench_training
    monkeypatch.chdir(ROOT)
    out = tmp_path / "training.csv"
    bench_training.main(["--sizes", "debug", "--variants", "baseline", "mhar_eager", "--device", "cpu",
                         "--backend", "none", "--steps", "1", "--warmup", "1", "--graph", "0", "--repeats", "2",
                         "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert [(r["variant"], r["repeat"]) for r in rows] == [("baseline", "0"), ("mhar_eager", "0"),
                                                           ("baseline", "1"), ("mhar_eager", "1")]
    ratios = []
    for rep in ("0", "1"):
        b, m = (next(r for r in rows if r["repeat"] == rep and r["variant"] == v) for v in ("baseline", "mhar_eager"))
        # (thr_ratio is stored to 4 decimals: up to 5e-5 off, more than rel 1e-3 of a small CPU ratio)
        assert float(m["thr_ratio"]) == pytest.approx(float(m["tokens_per_s"]) / float(b["tokens_per_s"]), rel=1e-3,
                                                      abs=1e-4)
        ratios.append(float(m["thr_ratio"]))
    summ = [json.loads(l[8:]) for l in capsys.readouterr().out.splitlines() if l.startswith("SUMMARY ")]
    assert len(summ) == 1 and summ[0]["variant"] == "mhar_eager" and summ[0]["repeats"] == 2
    x = np.array(ratios)
    lo, hi = stats.t.interval(0.95, 1, loc=x.mean(), scale=x.std(ddof=1) / np.sqrt(2))
    assert summ[0]["thr_ratio_mean"] == pytest.approx(x.mean(), abs=1e-4)
    assert summ[0]["thr_ratio_ci95"] == pytest.approx([lo, hi], abs=1e-4)


@pytest.mark.parametrize("module,args", [
    ("bench_training", ["--sizes", "debug", "--variants", "baseline", "--device", "cpu"]),
    ("bench_routing_op", ["--sizes", "100M"]),
    ("bench_inference", ["--sizes", "debug", "--device", "cpu"]),
])
def test_benchmarks_never_overwrite_an_existing_record(tmp_path, capsys, module, args):
    """An existing --out (e.g. the committed results/bench/*.csv) is refused before anything runs: one error
    line, exit 2, the file untouched; --append is the way to add rows."""
    import importlib
    mod = importlib.import_module(f"benchmarks.{module}")
    out = tmp_path / "record.csv"
    out.write_text("size,variant,tokens_per_s\r\n1B,baseline,1.0\r\n")
    before = out.read_bytes()
    with pytest.raises(SystemExit) as e:
        mod.main([*args, "--out", str(out)])
    assert e.value.code == 2 and out.read_bytes() == before
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "already exists" in err[-1] and "--append" in err[-1]


def test_append_keeps_the_record_and_merges_columns(tmp_path):
    from benchmarks.common import existing_rows, write_csv
    out = tmp_path / "record.csv"
    out.write_text("size,variant,tokens_per_s\r\n1B,baseline,1.0\r\n")
    keep = existing_rows(out, append=True)
    write_csv(out, [{"size": "1B", "variant": "mhar", "tokens_per_s": 0.9, "repeat": 0}], keep)
    rows = list(csv.DictReader(out.open(newline="")))
    assert rows == [{"size": "1B", "variant": "baseline", "tokens_per_s": "1.0", "repeat": ""},
                    {"size": "1B", "variant": "mhar", "tokens_per_s": "0.9", "repeat": "0"}]
    assert existing_rows(tmp_path / "new.csv", append=False) == []
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SystemExit):
        existing_rows(bad, append=True)


def test_variant_env_reaches_its_process_and_its_rows(tmp_path, monkeypatch):
    """A variant's kernel settings (VARIANT_ENV) are set in the processes that run it (benchmark and trainer) and
    in no other; each row records its own process's MHAR_ROUTING_* settings (``routing_env``)."""
    from benchmarks import bench_training
    monkeypatch.chdir(ROOT)
    for k in [k for k in __import__("os").environ if k.startswith("MHAR_ROUTING_")]:
        monkeypatch.delenv(k)
    monkeypatch.setitem(bench_training.VARIANT_ENV, "mhar_eager", {"MHAR_ROUTING_AUTOTUNE": "0"})
    out = tmp_path / "training.csv"
    bench_training.main(["--sizes", "debug", "--variants", "baseline", "mhar_eager", "--device", "cpu",
                         "--backend", "none", "--steps", "1", "--warmup", "1", "--graph", "0",
                         "--trainer-steps", "6", "--runs-dir", str(tmp_path / "runs"), "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert [(r["variant"], r["mode"], r["routing_env"]) for r in rows] == [
        ("baseline", "step", ""), ("baseline", "trainer", ""),
        ("mhar_eager", "step", "MHAR_ROUTING_AUTOTUNE=0"), ("mhar_eager", "trainer", "MHAR_ROUTING_AUTOTUNE=0")]


def test_variants_are_the_registry_and_name_their_pdl_setting(monkeypatch):
    """The benchmark's variants are the baseline and ``mhar_<impl>`` for each routing implementation of the
    registry, plus the fused kernels without programmatic dependent launch (``mhar_fused_nopdl``: MHAR_ROUTING_PDL=0
    in its processes); every other variant runs the library's default (the variable unset), whatever the caller's
    setting, so a variant always means the same launches."""
    from benchmarks import bench_training
    from mhar.model.config import ROUTING_IMPLS
    assert list(bench_training.VARIANTS) == ["baseline", *(f"mhar_{i}" for i in ROUTING_IMPLS), "mhar_fused_nopdl"]
    for impl in ROUTING_IMPLS:
        assert bench_training.VARIANTS[f"mhar_{impl}"] == {"variant": "mhar", "routing_impl": impl}
    assert bench_training.VARIANTS["mhar_fused_nopdl"] == bench_training.VARIANTS["mhar_fused"]
    monkeypatch.setenv("MHAR_ROUTING_PDL", "1")
    assert bench_training.variant_env("mhar_fused_nopdl")["MHAR_ROUTING_PDL"] == "0"
    for name in ("baseline", "mhar_fused", "mhar_auto", "mhar_eager"):
        assert "MHAR_ROUTING_PDL" not in bench_training.variant_env(name), name
