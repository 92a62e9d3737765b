"""Regenerating the report from unchanged inputs rewrites no tracked byte (`git status` stays clean).

What the report rules write - tables (csv/md/tex), figures (png/pdf), probe JSONs, REPORT.md - is generated
twice here with a different clock, git state, package record and data-mirror location in between; the tracked
files must be byte-identical, and the provenance that does change goes to the untracked `*.provenance.json`
beside each output (mhar.runs.sidecar). `snakemake --cores all report` twice is the end-to-end form of this test.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fixtures_analysis as fx
from eval import probe
from analysis import figures, report
from mhar.runs import sidecar
from analysis.tables.build import make_table
from mhar.runs import provenance as mprov

TRACKED = ("*.csv", "*.md", "*.tex", "*.png", "*.pdf", "*.json")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for pat in TRACKED for p in sorted(root.rglob(pat))
            if not p.name.endswith(sidecar.SUFFIX)}


def _generate(work: Path, rep: Path, monkeypatch, when: str, commit: str) -> None:
    monkeypatch.setattr(mprov, "utc_now", lambda: when)
    monkeypatch.setattr(mprov, "git_info", lambda *a, **k: {"commit": commit, "dirty": True, "root": str(work)})
    runs = sorted((work / "runs").rglob("summary.json"))
    make_table("table1", runs, rep / "table1", command="python -m analysis.tables table1 ...")
    figures.make_figure("forest", [rep / "table1.csv"], rep / "figures" / "forest")
    figures.make_figure("loss_curves", runs, rep / "figures" / "loss_curves")
    report.build_report(rep, rep / "REPORT.md")


def test_report_outputs_do_not_change_with_time_git_or_location(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fx.make_runs(tmp_path, sizes=("tiny",), seeds=(0, 1))
    rep = Path("reports")  # relative, as the workflow passes it
    _generate(tmp_path, rep, monkeypatch, "2026-01-01T00:00:00+00:00", "a" * 40)
    first = _snapshot(rep)
    assert {"table1.md", "figures/forest.png", "figures/forest.pdf", "REPORT.md"} <= set(first)
    _generate(tmp_path, rep, monkeypatch, "2027-06-30T12:34:56+00:00", "b" * 40)
    second = _snapshot(rep)
    assert sorted(first) == sorted(second)
    changed = [k for k in first if first[k] != second[k]]
    assert not changed, changed
    for k, text in first.items():
        if k.endswith((".md", ".tex", ".csv")):
            assert "2026-01-01" not in text.decode() and "a" * 40 not in text.decode(), k
    # the provenance that changed is kept, outside git's view
    side = json.loads(sidecar.path_for(rep / "table1").read_text())
    assert side["generated_utc"].startswith("2027-06-30") and side["git"]["commit"] == "b" * 40
    assert json.loads(sidecar.path_for(rep / "REPORT.md").read_text())["git"]["commit"] == "b" * 40
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert f"*{sidecar.SUFFIX}" in ignored and "/results/benchmarks/" in ignored


def test_probe_record_names_the_text_relative_to_the_data_mirror(tmp_path, monkeypatch):
    """`token_source: text:/abs/path/...` made every probe JSON differ when MHAR_DATA_DIR moved."""
    from mhar.data.tokenizer import get_tokenizer

    tok = get_tokenizer("byte")
    sources = []
    for where in ("mirror_a", "elsewhere/mirror_b"):
        root = tmp_path / where / "wikitext-2-raw-v1"
        root.mkdir(parents=True)
        (root / "wiki.valid.raw").write_text("= Valkyria =\n" + "The quick brown fox jumps over the dog . " * 80)
        monkeypatch.setenv("MHAR_DATA_DIR", str(tmp_path / where))
        ids, src = probe.probe_tokens(tok, 256, 2, 32)
        sources.append(src)
    assert sources[0] == sources[1] == "text:$MHAR_DATA_DIR/wikitext-2-raw-v1/wiki.valid.raw"
    assert str(tmp_path) not in sources[0]


@pytest.mark.parametrize("kind", ["table", "figure"])
def test_outputs_name_inputs_as_given(tmp_path, monkeypatch, kind):
    """The tracked record names inputs as the command gave them (relative), never resolved to absolute paths."""
    monkeypatch.chdir(tmp_path)
    runs = [Path(p).relative_to(tmp_path) for p in fx.make_runs(tmp_path, sizes=("tiny",), seeds=(0, 1))]
    if kind == "table":
        make_table("table1", runs, Path("out") / "t")
        text = (tmp_path / "out" / "t.md").read_text()
    else:
        figures.make_figure("loss_curves", runs, Path("out") / "f")
        from PIL import Image

        text = Image.open(tmp_path / "out" / "f.png").info["Description"]
    assert str(tmp_path) not in text and str(runs[0]) in text
    shutil.rmtree(tmp_path / "out")
