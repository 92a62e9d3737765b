"""What a new user meets first: `python -m mhar --help`, and one clear line where a command is pointed at the
wrong folder (the run's parent, an interrupted run, runs trained with --out elsewhere)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fixtures_analysis as fx
import mhar.runs.layout as R
from mhar.__main__ import COMMANDS

REPO = Path(__file__).resolve().parents[1]


def test_help_describes_each_command_not_its_entry_point():
    r = subprocess.run([sys.executable, "-m", "mhar", "--help"], capture_output=True, text=True, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 0
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.startswith("  ")}
    assert set(rows) == set(COMMANDS)
    for name, line in rows.items():
        words = line.split(None, 1)[1]
        assert ":" not in words.split()[0] and "mhar." not in words.split()[0], line  # not 'mhar.hf.cli:export_main'
        assert len(words.split()) >= 4, line


def _killed_run(root: Path, at: int = 20, steps: int = 40) -> Path:
    run = fx.write_run(root, "baseline", "debug", 0, 3.5, steps=steps, every=10,
                       overrides=[f"train.steps={steps}"]).parent
    (run / "summary.json").unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(ln for ln in lines if json.loads(ln)["step"] <= at) + "\n")
    return run


def test_eval_run_on_an_interrupted_run_says_how_far_it_got(tmp_path, capsys):
    from eval.run import main as run_main

    run = _killed_run(tmp_path / "results")
    rc = run_main(["--model", str(run), "--tasks", "lambada_openai", "--out", str(tmp_path / "ev"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1, err
    assert err[0].startswith("error: ") and "run incomplete (step 20 of 40)" in err[0] and "rerun" in err[0]
    rc = run_main(["--model", str(tmp_path / "nothing"), "--tasks", "lambada_openai", "--out", str(tmp_path / "ev"),
                   "--device", "cpu"])
    assert rc != 0 and "no such checkpoint" in capsys.readouterr().err


def test_export_hf_of_a_seed_folder_names_the_run_below(tmp_path, capsys):
    from mhar.hf.cli import export_main

    run = fx.write_run(tmp_path / "results", "mhar", "debug", 0, 3.0, heads=4).parent
    (run / "model.pt").write_bytes(b"")  # what export-hf looks for below the seed folder
    seed = run.parent  # results/runs/mhar/debug/seed0: the folder a user types
    assert export_main([str(seed), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(run) in err[0] and "checkpoint not found" not in err[0], err
    assert not (tmp_path / "hf").exists()


def test_runs_lists_run_folders_given_as_paths(tmp_path, capsys):
    """A run trained with `python -m mhar.train ... --out /anywhere/x` is listed by `mhar runs /anywhere`."""
    anywhere = tmp_path / "scratch"
    done = fx.write_run(tmp_path, "mhar", "debug", 0, 3.25, heads=4, root_dir=anywhere / "my_run")
    part = _killed_run(tmp_path / "other")
    assert R.main([str(anywhere), str(part)]) == 0
    out = capsys.readouterr().out
    assert str(done.parent) in out and "finished" in out and "3.2500" in out
    assert str(part) in out and "incomplete" in out and "20/40" in out
    assert "migrate" not in out  # not under a results folder: no layout to check
    assert not (anywhere / "runs" / "INDEX.md").exists()
    assert R.main([str(tmp_path / "empty_nothing")]) == 2
    assert "no such folder" in capsys.readouterr().err
