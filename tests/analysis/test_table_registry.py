"""The table registry (analysis/tables/registry.py): one record per table, read by the table CLI, the report, the
published sources and the workflow's config check; a table added from outside (tests/toy_table.py) is built,
reported and accepted like the project's own (issue 55 item 2)."""
from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

import fixtures_analysis as fx
from analysis import report
from analysis.tables import registry as reg
from analysis.tables.build import main as tables_main, make_table

ROOT = Path(__file__).resolve().parents[2]
KNOWN = [r["id"] for r in csv.DictReader(open(ROOT / "analysis" / "published_sources.csv", newline=""))]


@pytest.fixture
def toy():
    import tests.toy_table as toy_table

    reg.register_table(toy_table.SPEC)  # (again, if another test removed it)
    yield toy_table
    reg.TABLES.pop(toy_table.SPEC.name, None)


def _runs(tmp_path):
    return [fx.write_run(tmp_path, v, "tiny", s, 3.0 - (0.05 if v == "mhar" else 0), h, steps=40)
            for s in (0, 1) for v, h in (("baseline", None), ("mhar", 4))]


def test_every_project_table_is_a_record_with_a_builder():
    """table1, seeds, heads, downstream, cpt, cost and released: each one record whose builder resolves; the CLI's
    choices are the registry's names."""
    assert list(reg.TABLES)[:7] == ["table1", "seeds", "heads", "downstream", "cpt", "cost", "released"]
    for name, spec in reg.TABLES.items():
        assert callable(reg.builder(name)) and spec.inputs in reg.INPUTS and spec.title and spec.usage
    with pytest.raises(SystemExit):
        tables_main(["no_such_table", "--inputs", "x", "--out", "y"])
    with pytest.raises(ValueError, match="already registered"):
        reg.register_table(reg.TableSpec("table1", "t", "m:f", "bench", "x"))
    with pytest.raises(ValueError, match="input kind"):
        reg.register_table(reg.TableSpec("new_one", "t", "m:f", "no_kind", "x"))


def test_a_toy_table_is_built_reported_and_accepted_by_the_config_check(toy, tmp_path):
    runs = _runs(tmp_path / "runs")
    rep = tmp_path / "reports"
    # built through the one table entry point (the CLI too)
    assert tables_main(["toy_steps", "--inputs", *map(str, runs), "--out", str(rep / "toy_steps")]) == 0
    df = pd.read_csv(rep / "toy_steps.csv")
    assert sorted(df["method"]) == ["MHAR H=4", "baseline"] and set(df["steps"]) == {80}
    assert set(df["published_source"]) == {"arxiv-v2-table1"}  # its record's default source
    assert (rep / "toy_steps.md").is_file() and (rep / "toy_steps.tex").is_file()
    make_table("toy_steps", runs, rep / "web", published={"toy_steps": "arxiv-v2-web"})
    assert set(pd.read_csv(rep / "web.csv")["published_source"]) == {"arxiv-v2-web"}
    # in the report: its own section under its record's title
    text = report.build_report(rep, rep / "REPORT.md")
    assert "## Toy: training steps per run" in text and "`toy_steps.csv`" in text
    (rep / "toy_steps.csv").unlink()
    text = report.build_report(rep, rep / "REPORT.md")
    assert "table `toy_steps` (Toy: training steps per run): `python -m analysis.tables toy_steps" in text
    # the workflow's check of the config's published: block knows it, and fills in its default
    assert reg.check_published({"toy_steps": "arxiv-v2-web"}, KNOWN) is None
    assert reg.default_sources()["toy_steps"] == "arxiv-v2-table1"
    assert "unknown published source 'nope'" in reg.check_published({"toy_steps": "nope"}, KNOWN)


def test_the_config_check_refuses_a_name_no_table_quotes_under():
    assert reg.check_published({"table1": "arxiv-v2-web", "cost": "arxiv-v2-cost"}, KNOWN) is None
    msg = reg.check_published({"tabel1": "arxiv-v2-web"}, KNOWN)
    assert msg.startswith("published.tabel1: no table 'tabel1'") and "table1" in msg and "\n" not in msg
    assert "released" not in msg  # it quotes per arm (released.<arm>.published), not one source
    assert reg.check_published({"toy_steps": "arxiv-v2-web"}, KNOWN).startswith("published.toy_steps: no table")


def test_the_workflow_reads_the_registry():
    """One table rule for every table whose inputs the workflow lists; no table name written in a rule file, the
    schema or the report."""
    smk = (ROOT / "workflow" / "rules" / "tables.smk").read_text()
    assert smk.count("\nrule ") == 1 and 'table_report("{table}")' in smk
    for other in ("cost.smk", "released.smk"):
        assert "table_report(" not in (ROOT / "workflow" / "rules" / other).read_text()
    schema = (ROOT / "config" / "schema.yaml").read_text()
    published = schema[schema.index("\n  published:"):schema.index("\n  stats:")]
    assert not any(f"{n}:" in published for n in reg.TABLES)
    assert not hasattr(report, "TABLES") or report.TABLES is reg.TABLES
