"""What a table says when a row was compared with nothing, and one name per variant in every table (issue 59
items 4 and 5): the note and the stderr line of an unpaired row (no baseline among the inputs, or runs that
differ beyond the residual), display names in the downstream table as in Table 1, and a task the paper has no
number for."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

try:  # tests/ on sys.path (pytest's default rootdir-less import mode)
    import fixtures_analysis as fx
except ImportError:  # tests imported as a package
    from tests import fixtures_analysis as fx
from analysis.load.runs import load_summary
from analysis.tables.build import main as tables_main
from mhar.runs.pairing import pairing_difference

REPO = Path(__file__).resolve().parents[2]


def _cli(kind: str, inputs, out: Path, capsys) -> list[str]:
    """Run ``python -m analysis.tables KIND`` in-process: exit 0, and the stderr lines it printed."""
    assert tables_main([kind, "--inputs", *map(str, inputs), "--out", str(out), "--resamples", "99"]) == 0
    return capsys.readouterr().err.strip().splitlines()


def _notes(prefix: Path) -> str:
    return prefix.with_name(prefix.name + ".md").read_text()


def test_tables_without_a_baseline_say_so(tmp_path, capsys):
    """Only MHAR runs (the README's Pieces): Table 1 and the seed table name the row that found no baseline, in
    the table's notes and in one stderr line, instead of a silent row of '-'."""
    runs = [fx.write_run(tmp_path, "mhar", "tiny", s, 3.9 + 0.01 * s, 4) for s in (0, 1)]
    for kind in ("table1", "seeds"):
        err = _cli(kind, runs, tmp_path / kind, capsys)
        assert len(err) == 1 and err[0].startswith(f"{kind}: no baseline run among the inputs: MHAR H=4 tiny")
        assert err[0].split(": ", 1)[1] in _notes(tmp_path / kind)
    df = pd.read_csv(tmp_path / "table1.csv")
    assert df["delta"].isna().all()  # nothing paired, nothing invented
    _, evals = _run_with_eval(tmp_path / "e", "mhar", {"lambada_openai": np.ones(20)}, 4)
    err = _cli("downstream", [evals], tmp_path / "d", capsys)
    assert len(err) == 1 and err[0].startswith("downstream: no baseline run among the inputs: MHAR H=4 tiny")
    assert err[0].split(": ", 1)[1] in _notes(tmp_path / "d")


def test_tables_name_the_field_in_which_the_runs_differ(tmp_path, capsys):
    """A baseline that differs beyond model.residual (another size) is not paired: the note names both runs and
    the first differing field, as mhar.runs.pairing.pairing_difference gives it."""
    var = fx.write_run(tmp_path, "mhar", "tiny", 0, 3.9, 4)
    base = fx.write_run(tmp_path, "baseline", "100M", 0, 3.1)
    diff = pairing_difference(load_summary(var).ident, load_summary(base).ident)
    assert diff is not None
    for kind in ("table1", "seeds"):
        err = _cli(kind, [var, base], tmp_path / kind, capsys)
        assert len(err) == 1 and err[0].endswith(f"differ in {diff} (beyond model.residual): not paired")
        assert str(var) in err[0] and str(base) in err[0] and err[0].split(": ", 1)[1] in _notes(tmp_path / kind)


def test_heads_sweep_of_one_head_count_says_why(tmp_path, capsys):
    """A head sweep with one H at a size: nothing to compare with; the nearest other H (another size) is named
    with the field the runs differ in."""
    h4 = fx.write_run(tmp_path, "mhar", "tiny", 0, 3.9, 4)
    h8 = fx.write_run(tmp_path, "mhar", "100M", 0, 3.0, 8)
    err = _cli("heads", [h4, h8], tmp_path / "h", capsys)
    diff = pairing_difference(load_summary(h4).ident, load_summary(h8).ident)
    assert len(err) == 2 and all(e.startswith("heads: runs ") for e in err)
    assert err[0].endswith(f"differ in {diff} (beyond model.residual): not paired") and str(h4) in err[0]
    alone = fx.write_run(tmp_path / "alone", "mhar", "tiny", 0, 3.9, 4)
    err = _cli("heads", [alone], tmp_path / "h1", capsys)
    assert len(err) == 1 and err[0].startswith("heads: no run of another head count among the inputs: MHAR H=4")


def _run_with_eval(root: Path, variant: str, values: dict, heads=None, display=None, **kw) -> tuple[Path, Path]:
    """A run dir as mhar.train leaves it (summary.json with its ``display`` record, ``display`` when given) and its
    eval dir as eval.run writes it (each results.json carries the model's ``run`` block and display record)."""
    summary = fx.write_run(root, variant, "tiny", 0, 3.9, heads, **kw)
    record = json.loads(summary.read_text())
    if display is not None:
        record["display"] = display
        summary.write_text(json.dumps(record))
    return summary, fx.write_run_eval(summary.parent, values)


def test_downstream_names_a_variant_as_table1_does(tmp_path):
    """A user's own variant (module outside mhar, not imported where the table is built): the downstream table
    names it by the display record its training summary carries, as Table 1 does, not by its config label."""
    from mhar.model.residuals import display_record
    import tests.toy_variant  # noqa: F401  (registers toy_gated, as the user's training did)

    rng = np.random.default_rng(0)
    b = (rng.random(120) < 0.4).astype(float)
    base = _run_with_eval(tmp_path, "baseline", {"lambada_openai": b})
    toy = _run_with_eval(tmp_path, "toy_gated", {"lambada_openai": b[::-1].copy()}, 1,
                         display=display_record("toy_gated"), label="toy_gate",
                         overrides=["model.residual.module=tests.toy_variant"])
    # a fresh process: the registry there does not know toy_gated, as in the user's analysis step
    for kind, inputs in (("table1", [base[0], toy[0]]), ("downstream", [base[1], toy[1]])):
        p = subprocess.run([sys.executable, "-m", "analysis.tables", kind, "--inputs", *map(str, inputs),
                            "--out", str(tmp_path / kind), "--resamples", "99"], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr
    t1 = pd.read_csv(tmp_path / "table1.csv")
    ds = pd.read_csv(tmp_path / "downstream.csv")
    assert set(t1["method"]) == {"baseline", "toy gated residual"}
    assert set(ds["method"]) == {"toy gated residual"}


def test_own_task_has_empty_paper_columns_and_one_note(tmp_path):
    """A task the paper has no number for: its paper columns are empty (not '- / - (100M)') and one note says
    the paper has no number for it; a task the paper has keeps its numbers."""
    rng = np.random.default_rng(1)
    vals = {t: (rng.random(100) < 0.5).astype(float) for t in ("lambada_openai", "tiny_numbers")}
    base = _run_with_eval(tmp_path, "baseline", vals)
    mhar = _run_with_eval(tmp_path, "mhar", {t: v[::-1].copy() for t, v in vals.items()}, 4)
    assert tables_main(["downstream", "--inputs", str(base[1]), str(mhar[1]), "--out", str(tmp_path / "d"),
                        "--resamples", "99"]) == 0
    md = _notes(tmp_path / "d")
    rows = {ln.split(" | ")[3].split()[0]: ln.split(" | ") for ln in md.splitlines() if ln.startswith("| tiny ")}
    header = next(ln for ln in md.splitlines() if ln.startswith("| size ")).split(" | ")
    paper = [header.index("paper base / MHAR"), header.index("paper Δ")]
    assert [rows["tiny_numbers"][i].strip() for i in paper] == ["", ""]
    assert all("(100M)" in rows["lambada_openai"][i] for i in paper)  # the paper's number, another scale
    assert md.count("The paper has no number for tiny_numbers") == 1 and "lambada_openai:" not in md
