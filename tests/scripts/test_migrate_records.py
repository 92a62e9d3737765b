"""scripts/migrate_records.py: records of earlier harness versions, which the analysis readers refuse naming the
script, become the current shape (what mhar.train / eval.run write today), and the tables read them as they read
records written in that shape."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import fixtures_analysis as fx
from analysis.load.common import AnalysisInputError
from analysis.load.runs import identify_eval, load_summary
from analysis.tables.table1 import table1

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("migrate_records", ROOT / "scripts" / "migrate_records.py")
    mod = sys.modules["migrate_records"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mr = _script()


def _flat(summary: dict) -> dict:
    """A summary of the harness before the run block: the flat keys (variant = the run label, config_hash)."""
    d = {k: v for k, v in summary.items() if k not in ("run", "display")}
    return {**d, "variant": summary["run"]["label"], "config_hash": "abc123def0"}


def _results(d: Path) -> Path:
    return d / "lambada_openai" / "results.json"


def _old_results_tree(root: Path):
    """Current-shape runs and evaluations under root/results, each record rewritten in an older shape; returns
    (current records by path, the paths)."""
    res = root / "results"
    paths = []
    for seed in (0, 1):
        paths.append(fx.write_run(res, "baseline", "tiny", seed, 4.0 + 0.01 * seed))
        paths.append(fx.write_run(res, "mhar", "tiny", seed, 3.9 + 0.02 * seed, heads=8, label="mhar_h8"))
    current = {p: p.read_text() for p in paths}
    s0, s1, s2, s3 = (json.loads(p.read_text()) for p in paths)
    paths[0].write_text(json.dumps(_flat(s0)))  # no run block
    paths[1].write_text(json.dumps(_flat(s1)))
    paths[2].write_text(json.dumps({**s2, "run": {k: v for k, v in s2["run"].items() if k != "config"}}))
    paths[3].write_text(json.dumps({k: v for k, v in s3.items() if k != "display"}))  # no display record
    v = np.r_[np.ones(10), np.zeros(10)]
    evals = {}
    for i, p in enumerate(paths[:2]):  # an earlier eval.run: no run block; the model path names the run
        rel = p.parent.relative_to(root) / "model.pt"
        evals[p] = fx.write_eval(res / "eval" / f"e{i}", str(rel), {"lambada_openai": v})
        rec = json.loads(_results(evals[p]).read_text())
        del rec["run"]
        _results(evals[p]).write_text(json.dumps(rec))
    run2 = json.loads(current[paths[2]])["run"]  # a run block with config_hash instead of config
    evals[paths[2]] = fx.write_eval(res / "eval" / "e2", str(paths[2].parent / "model.pt"), {"lambada_openai": v},
                                    run={**{k: x for k, x in run2.items() if k != "config"}, "config_hash": "aaa"})
    evals[paths[3]] = fx.write_eval(res / "eval" / "e3", str(paths[3].parent / "model.pt"), {"lambada_openai": v},
                                    run=json.loads(current[paths[3]])["run"])  # run block, no display
    hf = fx.write_eval(res / "eval" / "hf", "hf:org/model", {"lambada_openai": v})  # no run: cannot be placed
    return res, current, paths, evals, hf


def test_older_records_are_refused_then_converted_to_the_current_shape(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the workflow's working directory: model paths are relative to it
    res, current, paths, evals, hf = _old_results_tree(tmp_path)
    for p in paths:  # every older shape is refused, naming the file and this script
        with pytest.raises(AnalysisInputError, match="scripts/migrate_records.py") as e:
            load_summary(p)
        assert str(p) in str(e.value)
    for d in evals.values():
        with pytest.raises(AnalysisInputError, match="scripts/migrate_records.py"):
            identify_eval(d)
    before = {p: p.read_bytes() for p in res.rglob("*.json")}
    assert mr.main(["--results", str(res), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("would convert") == 8 and f"left as it is: {_results(hf)}" in out
    assert {p: p.read_bytes() for p in res.rglob("*.json")} == before  # a dry run writes nothing

    assert mr.main(["--results", str(res)]) == 0
    assert "8 record(s) converted" in capsys.readouterr().out
    for p in paths:  # the record current mhar.train writes for that run, every older key kept
        want, got = json.loads(current[p]), json.loads(p.read_text())
        assert got["run"] == want["run"] and got["display"] == want["display"]
        assert load_summary(p).ident == load_summary_of(current[p], tmp_path / "ref" / p.parent.name).ident | {
            "where": str(p)}
    assert json.loads(paths[0].read_text())["config_hash"] == "abc123def0"
    for p, d in evals.items():  # an evaluation gets its run's records
        rec = json.loads(_results(d).read_text())
        assert rec["run"] == json.loads(current[p])["run"] and rec["display"] == json.loads(current[p])["display"]
        info = identify_eval(d)
        assert (info["label"], info["seed"], info["pairing"]) == (json.loads(current[p])["run"]["label"],
                                                                  json.loads(current[p])["seed"],
                                                                  json.loads(current[p])["run"]["pairing"])
    migrated = {r["method"]: r for r in table1(paths).rows}  # the table of the converted records ...
    ref = tmp_path / "ref_runs"
    fresh = []
    for p in paths:  # ... equals the table of records written in the current shape
        q = ref / p.parent.relative_to(res)
        q.mkdir(parents=True)
        for f in p.parent.iterdir():
            if f.is_file():
                (q / f.name).write_bytes(f.read_bytes())
        (q / "summary.json").write_text(current[p])
        fresh.append(q / "summary.json")
    expected = {r["method"]: r for r in table1(fresh).rows}
    assert migrated.keys() == expected.keys() == {"baseline", "MHAR H=8"}
    for k in migrated:
        for col in ("loss", "delta", "ci_low", "ci_high", "p", "seeds", "n_pairs", "pairing", "verdict"):
            assert migrated[k].get(col) == expected[k].get(col), (k, col)
    assert mr.main(["--results", str(res)]) == 0  # run again: nothing left to do
    assert "nothing to convert" in capsys.readouterr().out


def load_summary_of(text: str, where: Path):
    """load_summary of a summary.json's text, written to a folder of its own."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "summary.json").write_text(text)
    return load_summary(where / "summary.json")


def test_a_record_that_disagrees_with_its_config_refuses_the_whole_migration(tmp_path, capsys):
    res = tmp_path / "results"
    good = fx.write_run(res, "baseline", "tiny", 0, 4.0)
    bad = fx.write_run(res, "mhar", "tiny", 1, 3.9, heads=8)
    good.write_text(json.dumps(_flat(json.loads(good.read_text()))))
    bad.write_text(json.dumps({**_flat(json.loads(bad.read_text())), "seed": 5}))
    before = {p: p.read_bytes() for p in res.rglob("*.json")}
    assert mr.main(["--results", str(res)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(bad) in err[0] and "seed" in err[0], err
    assert {p: p.read_bytes() for p in res.rglob("*.json")} == before  # nothing written
    (bad.parent / "config.yaml").unlink()
    bad.write_text(json.dumps(json.loads(good.read_text()) | {"seed": 1}))
    assert mr.main(["--results", str(res)]) == 2
    assert "config.yaml" in capsys.readouterr().err
