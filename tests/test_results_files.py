"""The committed raw results are well-formed: every CSV under results/ parses with one value per header
column (a comma inside an unquoted field would shift the columns a reader sees), every benchmark CSV
carries its provenance columns, every record its rows cite has one provenance file, and results/ stays a
small set of records (no scripts, no dated folders)."""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
BENCH = RESULTS / "bench"
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
    # GPU records name the GPU and the torch / Triton builds; a CPU record (no GPU column) its CPU and Python
    cols = ("gpu", "torch", "triton", "command") if "gpu" in rows[0] or "cpu" not in rows[0] \
        else ("cpu", "cores", "python", "command")
    for col in cols:
        assert col in rows[0], f"{path}: no {col!r} column"
        assert all(r[col] for r in rows), f"{path}: empty {col!r} in some row"


def _tracked(folder: str) -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", folder], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_results_holds_records_not_scripts_or_sessions():
    files = _tracked("results")
    assert files and len(files) <= 40, f"{len(files)} tracked files under results/ (at most 40: CSV records, " \
                                       "their provenance, one README)"
    assert not [f for f in files if f.endswith((".sh", ".py"))], "scripts under results/"
    assert not [f for f in files if f.startswith("results/gpu/")], "dated session folders under results/gpu/"
    assert [f for f in files if f.endswith(".md")] == ["results/bench/README.md"]


def _cited_records() -> dict[str, str]:
    """record name -> first CSV row citing it (the `source` column names the session of each row)."""
    cited = {}
    for path in sorted(BENCH.glob("*.csv")):
        with path.open(newline="") as f:
            for i, row in enumerate(csv.DictReader(f), 2):
                m = re.search(r"session (\d{4}-\d{2}-\d{2}\w?)", row.get("source") or "")
                if m:
                    cited.setdefault(m.group(1), f"{path.name}:{i}")
    return cited


def test_every_cited_record_has_one_provenance_file():
    cited = _cited_records()
    assert len(cited) >= 10
    have = {p.stem for p in (BENCH / "provenance").glob("*.json")}
    missing = {r: where for r, where in cited.items() if r not in have}
    assert not missing, f"records cited without results/bench/provenance/<record>.json: {missing}"
    for p in sorted((BENCH / "provenance").glob("*.json")):
        rec = json.loads(p.read_text())
        assert rec["record"] == p.stem
        assert rec["hardware"]["gpu"] and rec["software"]["torch"] and rec["commands"], p
        assert rec["raw_files"].startswith("git ls-tree"), p  # where the raw files of the record are kept
