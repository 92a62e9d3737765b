"""The committed raw results are well-formed: every CSV under results/ parses with one value per header
column (a comma inside an unquoted field would shift the columns a reader sees), and every benchmark CSV
carries its provenance columns."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "results"
CSVS = sorted(RESULTS.rglob("*.csv"))


def test_results_has_csvs():
    assert CSVS, f"no CSV files under {RESULTS}"


@pytest.mark.parametrize("path", CSVS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_csv_rows_match_header(path):
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows, f"{path} is empty"
    header = rows[0]
    assert all(h.strip() for h in header), f"{path}: unnamed header column in {header}"
    assert len(set(header)) == len(header), f"{path}: repeated header names"
    bad = [i + 2 for i, r in enumerate(rows[1:]) if r and len(r) != len(header)]
    assert not bad, f"{path}: rows (line numbers) {bad} do not have {len(header)} fields"


@pytest.mark.parametrize("path", [p for p in CSVS if p.parent.name == "bench" or p.parent.parent.name == "bench"],
                         ids=lambda p: str(p.relative_to(RESULTS)))
def test_bench_csv_provenance(path):
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for col in ("gpu", "torch", "triton", "command"):
        assert col in rows[0], f"{path}: no {col!r} column"
        assert all(r[col] for r in rows), f"{path}: empty {col!r} in some row"
