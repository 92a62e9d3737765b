"""analysis/throughput.py: the per-size test of a throughput target over paired runs, and the paired comparison of two
variants, against scipy / statsmodels (CPU, tiny CSVs)."""
from __future__ import annotations

import csv
import math

import pytest

from analysis import throughput as tv
from analysis import verdict as vd

COLS = ["size", "variant", "mode", "thr_ratio", "status", "source"]


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS, lineterminator="\r\n")
        w.writeheader()
        for r in rows:
            w.writerow(dict(zip(COLS, r)))
    return path


def _record(tmp_path):
    v = "mhar_x"
    return _write(tmp_path / "t.csv", [
        # 100M: clearly above 0.90, two runs share call 4
        ("100M", v, "step", "0.930", "ok", "session s1 call 1 (one run)"),
        ("100M", v, "step", "0.934", "ok", "session s1 call 2"),
        ("100M", v, "step", "0.931", "ok", "session s2 call 4 (two repeats)"),
        ("100M", v, "step", "0.929", "ok", "session s2 call 4 (two repeats)"),
        ("100M", "baseline", "step", "", "ok", "session s1 call 1"),  # the baseline row: no ratio
        ("100M", v, "trainer", "0.5", "ok", "session s1 call 1"),  # another mode: ignored
        ("100M", v, "step", "0.1", "timeout after 300s", "session s1 call 3"),  # not ok: ignored
        # 1B: clearly below
        ("1B", v, "step", "0.850", "ok", "session s1 call 1"),
        ("1B", v, "step", "0.853", "ok", "session s1 call 2"),
        ("1B", v, "step", "0.851", "ok", "session s2 call 1"),
        # 350M: one run only
        ("350M", v, "step", "0.990", "ok", "session s1 call 1"),
        ("350M", "mhar_other", "step", "0.2", "ok", "session s1 call 1"),  # another variant: ignored
    ])


def test_units_run_and_call(tmp_path):
    path = _record(tmp_path)
    runs = tv.load_units(path, "mhar_x", "run")
    assert sorted(runs) == ["100M", "1B", "350M"]
    assert [x for _, x in runs["100M"]] == [0.930, 0.934, 0.931, 0.929]
    calls = tv.load_units(path, "mhar_x", "call")
    assert [x for _, x in calls["100M"]] == pytest.approx([0.930, 0.934, 0.930])  # call 4's two runs averaged
    assert [label for label, _ in calls["100M"]] == ["session s1 call 1", "session s1 call 2", "session s2 call 4"]
    assert len(calls["1B"]) == 3  # distinct calls stay apart (same call number, other session)


def test_verdicts_by_hand(tmp_path):
    """The t statistic, its one-sided p (Student t survival function), the interval and Holm's step-down
    adjustment computed by hand; met / below / not demonstrated."""
    from scipy.stats import t as student

    rows = tv.verdicts(tv.load_units(_record(tmp_path), "mhar_x", "run"), 0.90)
    assert [r["size"] for r in rows] == ["100M", "350M", "1B"]
    ps = {}
    for r, x in ((rows[0], [0.930, 0.934, 0.931, 0.929]), (rows[2], [0.850, 0.853, 0.851])):
        n = len(x)
        m = sum(x) / n
        sd = math.sqrt(sum((v - m) ** 2 for v in x) / (n - 1))
        tstat = (m - 0.90) / (sd / math.sqrt(n))
        ps[r["size"]] = student.sf(tstat, n - 1)
        half = student.ppf(0.975, n - 1) * sd / math.sqrt(n)
        assert r["mean"] == pytest.approx(m) and r["sd"] == pytest.approx(sd)
        assert r["p"] == pytest.approx(ps[r["size"]], rel=1e-9)
        assert r["ci95"] == pytest.approx([m - half, m + half])
    # Holm over the two tested sizes (350M has one run: not tested): smaller p times 2, larger times 1, monotone
    small, large = sorted(ps.values())
    assert rows[0]["p_holm"] == pytest.approx(min(1.0, 2 * small))
    assert rows[2]["p_holm"] == pytest.approx(min(1.0, max(2 * small, large)))
    assert rows[1]["p"] is None and rows[1]["p_holm"] is None
    assert [r["verdict"] for r in rows] == ["met", "not demonstrated", "below"]


def test_call_unit_can_change_the_verdict(tmp_path):
    """Runs that agree only within one call: significant with runs as units, not with calls as units."""
    v = "mhar_x"
    path = _write(tmp_path / "c.csv", [
        ("100M", v, "step", "0.901", "ok", "session a call 1"),
        ("100M", v, "step", "0.912", "ok", "session b call 1"),
        ("100M", v, "step", "0.912", "ok", "session b call 1"),
        ("100M", v, "step", "0.912", "ok", "session b call 1"),
        ("100M", v, "step", "0.912", "ok", "session b call 1"),
    ])
    assert tv.verdicts(tv.load_units(path, v, "run"), 0.90)[0]["verdict"] == "met"
    by_call = tv.verdicts(tv.load_units(path, v, "call"), 0.90)[0]
    assert by_call["n"] == 2 and by_call["verdict"] == "not demonstrated"


def test_modes_pick_step_trainer_or_both(tmp_path):
    """--mode: the trainer rows (``python -m mhar.train``) alone, or with the step rows; with calls as units a
    call's step and trainer rows are averaged into one unit."""
    path = _record(tmp_path)
    assert [x for _, x in tv.load_units(path, "mhar_x", "run", "trainer")["100M"]] == [0.5]
    assert set(tv.load_units(path, "mhar_x", "run", "trainer")) == {"100M"}
    both = tv.load_units(path, "mhar_x", "run", "both")
    assert [x for _, x in both["100M"]] == [0.930, 0.934, 0.931, 0.929, 0.5]
    calls = tv.load_units(path, "mhar_x", "call", "both")
    assert [x for _, x in calls["100M"]] == pytest.approx([(0.930 + 0.5) / 2, 0.934, 0.930])
    with pytest.raises(ValueError, match="mode 'x'"):
        tv.load_units(path, "mhar_x", "run", "x")


def test_cli_table_and_errors(tmp_path, capsys):
    path = _record(tmp_path)
    assert tv.main([str(path), "--variant", "mhar_x"]) == 0
    out = capsys.readouterr().out
    assert "| 100M | 4 |" in out and "| met |" in out and "Overall: not met at every size." in out
    assert tv.main([str(tmp_path / "missing.csv")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert tv.main([str(path), "--variant", "nope"]) == 2
    assert "check --variant" in capsys.readouterr().err
    assert tv.main([str(path), "--variant", "mhar_x", "--mode", "trainer"]) == 0
    out = capsys.readouterr().out
    assert "rows: trainer" in out and "| 100M | 1 | 0.5000 |" in out and "| 1B | 0 | - |" in out
    assert "| not measured |" in out
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert tv.main([str(bad)]) == 2
    assert "not a training-throughput record" in capsys.readouterr().err
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00size")
    assert tv.main([str(binary)]) == 2
    assert "cannot read it as CSV" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tv.main([str(path), "--alpha", "2"])


def test_sizes_without_runs_are_not_measured(tmp_path):
    """A size the target is asked for but the record lacks is listed as "not measured" (n 0), takes no part in
    Holm's adjustment, and the target is then not met overall."""
    path = _write(tmp_path / "t.csv", [("1B", "v", "step", r, "ok", f"session s call {i}")
                                       for i, r in enumerate(("0.95", "0.96", "0.97"))])
    rows = tv.verdicts(tv.load_units(path, "v"), 0.90, sizes=("100M", "350M", "1B"))
    assert [(r["size"], r["n"], r["verdict"]) for r in rows] == [("100M", 0, "not measured"),
                                                                  ("350M", 0, "not measured"), ("1B", 3, "met")]
    alone = tv.verdicts(tv.load_units(path, "v"), 0.90)
    assert rows[2]["p_holm"] == pytest.approx(alone[0]["p_holm"]) == pytest.approx(alone[0]["p"])
    assert "Overall: not met at every size." in tv.markdown(rows, 0.90, "v", "run")


def _paired_record(tmp_path):
    B, A = "mhar_b", "mhar_a"
    rows = [
        ("1B", "baseline", "step", "", "ok", "session s1 call 1"),
        ("1B", B, "step", "0.890", "ok", "session s1 call 1"),
        ("1B", A, "step", "0.896", "ok", "session s1 call 1"),
        # two repeats in one call: each pairs with its own repeat
        ("1B", "baseline", "step", "", "ok", "session s1 call 2 (two repeats)"),
        ("1B", B, "step", "0.900", "ok", "session s1 call 2 (two repeats)"),
        ("1B", A, "step", "0.905", "ok", "session s1 call 2 (two repeats)"),
        ("1B", "baseline", "step", "", "ok", "session s1 call 2 (two repeats)"),
        ("1B", B, "step", "0.880", "ok", "session s1 call 2 (two repeats)"),
        ("1B", A, "step", "0.889", "ok", "session s1 call 2 (two repeats)"),
        # unpaired: A alone in its run; B timed out
        ("1B", "baseline", "step", "", "ok", "session s2 call 1"),
        ("1B", A, "step", "0.999", "ok", "session s2 call 1"),
        ("1B", B, "step", "", "timeout after 170s", "session s2 call 1"),
        ("350M", "baseline", "step", "", "ok", "session s2 call 2"),
        ("350M", A, "step", "0.870", "ok", "session s2 call 2"),
        ("350M", B, "step", "0.872", "ok", "session s2 call 2"),
        ("350M", "baseline", "step", "", "ok", "session s2 call 3"),
        ("350M", B, "step", "0.860", "ok", "session s2 call 3"),
        ("350M", A, "step", "0.861", "ok", "session s2 call 3"),
        ("350M", A, "trainer", "0.5", "ok", "session s2 call 3"),  # another mode: ignored
    ]
    return _write(tmp_path / "p.csv", rows), A, B


def test_pairs_are_runs_that_measured_both(tmp_path):
    path, A, B = _paired_record(tmp_path)
    pairs = tv.load_pairs(path, A, B)
    assert pairs["1B"] == [("session s1 call 1 run 1", 0.896, 0.890), ("session s1 call 2 run 1", 0.905, 0.900),
                           ("session s1 call 2 run 2", 0.889, 0.880)]
    assert [(a, b) for _, a, b in pairs["350M"]] == [(0.870, 0.872), (0.861, 0.860)]  # (A, B) whatever the row order


def test_compare_by_hand(tmp_path):
    """The paired t statistic of the differences, its one-sided p (Student t survival function, equal to scipy's
    ttest_rel), Holm over the two sizes by hand, and the pooled row over all five pairs."""
    from scipy.stats import t as student

    path, A, B = _paired_record(tmp_path)
    rows = {r["size"]: r for r in tv.compare(tv.load_pairs(path, A, B))}

    def one_sided(d):
        n = len(d)
        m = sum(d) / n
        sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
        return m, sd, float(student.sf(m / (sd / math.sqrt(n)), n - 1))

    d1b = [0.896 - 0.890, 0.905 - 0.900, 0.889 - 0.880]
    d350 = [0.870 - 0.872, 0.861 - 0.860]
    m, sd, p1b = one_sided(d1b)
    assert rows["1B"]["mean"] == pytest.approx(m) and rows["1B"]["sd"] == pytest.approx(sd)
    assert rows["1B"]["p"] == pytest.approx(p1b)
    _, _, p350 = one_sided(d350)
    assert rows["350M"]["p"] == pytest.approx(p350)
    lo, hi = sorted((p1b, p350))
    holm = {p1b: None, p350: None}
    holm[lo] = min(1.0, 2 * lo)
    holm[hi] = max(holm[lo], min(1.0, hi))
    assert rows["1B"]["p_holm"] == pytest.approx(holm[p1b]) and rows["350M"]["p_holm"] == pytest.approx(holm[p350])
    assert rows["1B"]["verdict"] == ("faster" if holm[p1b] < 0.05 else "not demonstrated")
    assert rows["350M"]["verdict"] == "not demonstrated"
    _, _, pall = one_sided(d1b + d350)
    assert rows["all"]["n"] == 5 and rows["all"]["p"] == pytest.approx(pall) == pytest.approx(rows["all"]["p_holm"])


def test_compare_slower_and_cli(tmp_path, capsys):
    path, A, B = _paired_record(tmp_path)
    rows = tv.compare(tv.load_pairs(path, B, A))  # the other way round: B is slower at 1B
    one_b = next(r for r in rows if r["size"] == "1B")
    assert one_b["verdict"] == "slower" and one_b["ci95"][1] < 0
    assert tv.main([str(path), "--variant", A, "--against", B]) == 0
    out = capsys.readouterr().out
    assert "`mhar_a` - `mhar_b`" in out and "| 1B | 3 | +0.0060, +0.0050, +0.0090 |" in out and "| all | 5 |" in out
    assert tv.main([str(path), "--variant", A, "--against", "nope"]) == 2
    assert "no run holds both" in capsys.readouterr().err
    assert tv.main([str(tmp_path / "missing.csv"), "--variant", A, "--against", B]) == 2
    assert "no such training-throughput record" in capsys.readouterr().err


def test_the_repository_record_reads():
    """The committed record parses and gives one row per size it holds for the paper routing."""
    from pathlib import Path
    rec = Path(__file__).resolve().parents[2] / "results" / "bench" / "training.csv"
    units = tv.load_units(rec, "mhar_fused_v7_sg8", "run")
    assert {"100M", "350M", "1B"} <= set(units)
    rows = tv.verdicts(units, 0.90)
    assert all(r["n"] >= 2 and r["verdict"] in (vd.TARGET_MET, vd.BELOW_TARGET, vd.NOT_DEMONSTRATED) for r in rows)


def test_older_records_are_read_under_the_current_names(tmp_path):
    """A record written before the routing names were unified: its mhar_fused_v7_sg8_pdl rows measured what
    routing_impl fused runs now (read as mhar_fused); its mhar_fused rows measured withdrawn kernels (read as
    mhar_fused_v6, not as today's mhar_fused). Rows written since carry routing_resolved and keep their names."""
    cols = ["size", "variant", "mode", "thr_ratio", "status", "source", "routing_resolved"]
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows([("1B", "mhar_fused_v7_sg8_pdl", "step", "0.90", "ok", "session a call 1", ""),
                     ("1B", "mhar_fused", "step", "0.85", "ok", "session a call 1", ""),
                     ("1B", "mhar_fused", "step", "0.91", "ok", "session b call 1", "fused")])
    assert [x for _, x in tv.load_units(path, "mhar_fused")["1B"]] == [0.90, 0.91]
    assert [x for _, x in tv.load_units(path, "mhar_fused_v6")["1B"]] == [0.85]
