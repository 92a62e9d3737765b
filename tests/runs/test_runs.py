"""mhar.runs.layout: the run listing and results/runs/INDEX.md."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

try:
    import fixtures_analysis as fx
except ImportError:
    from tests import fixtures_analysis as fx
import mhar.runs.layout as R
from mhar.runs.config import identity_hash, load_run_config

def _cfg_of(run_dir: Path):
    return load_run_config(run_dir / "config.yaml")


# --- listing -----------------------------------------------------------------------------------------------
def test_listing_reads_each_run_folders_records_and_writes_the_index(tmp_path, capsys):
    res = tmp_path / "results"
    done = fx.write_run(res, "mhar", "debug", 0, 3.25, heads=4, label="mhar_h4").parent
    part = fx.write_run(res, "baseline", "debug", 1, 3.5).parent
    (part / "summary.json").unlink()  # killed at step 120: metrics.jsonl holds steps up to 120
    lines = (part / "metrics.jsonl").read_text().splitlines()
    (part / "metrics.jsonl").write_text("\n".join(ln for ln in lines if json.loads(ln)["step"] <= 120) + "\n")
    div = fx.write_run(res, "baseline", "debug", 2, 3.5).parent
    (div / "summary.json").unlink()
    (div / "diverged.json").write_text(json.dumps({"status": "diverged", "what": "loss/grad norm", "step": 57}))
    live = fx.write_run(res, "baseline", "debug", 3, 3.5).parent
    (live / "summary.json").unlink()
    (live / ".lock").write_text(f"{os.getpid()}\n")  # a live python process holds it
    dead = fx.write_run(res, "baseline", "debug", 4, 3.5).parent
    (dead / "summary.json").unlink()
    (dead / ".lock").write_text("999999999\n")  # its trainer died: incomplete, not running
    moved = res / "runs" / "somewhere" / "else"
    os.renames(fx.write_run(res / "x", "baseline", "debug", 5, 3.5).parent, moved)
    assert R.main(["--results", str(res)]) == 0
    out = capsys.readouterr().out
    rows = {r.rel: r for r in R.scan(res)}
    rel = lambda d: d.relative_to(res / "runs").as_posix()  # noqa: E731
    assert rows[rel(done)].status == "finished" and rows[rel(done)].metrics["tail_mean_val_loss"] == pytest.approx(3.25)
    assert (rows[rel(done)].label, rows[rel(done)].size, rows[rel(done)].seed) == ("mhar_h4", "debug", 0)
    assert rows[rel(done)].identity == identity_hash(_cfg_of(done)) and not rows[rel(done)].misplaced
    assert rows[rel(done)].rel == f"mhar_h4/debug/seed0/{identity_hash(_cfg_of(done))[:10]}"
    assert (rows[rel(part)].status, rows[rel(part)].step, rows[rel(part)].steps) == ("incomplete", 120, 200)
    assert rows[rel(div)].status == "diverged" and rows[rel(div)].step == 57
    assert rows[rel(live)].status == "running" and rows[rel(dead)].status == "incomplete"
    assert rows["somewhere/else"].misplaced and "not where its identity puts it" in rows["somewhere/else"].note
    index = (res / "runs" / "INDEX.md").read_text()
    assert f"[{rel(done)}]({rel(done)}/)" in index and "| finished |" in index and "3.2500" in index
    assert "1 diverged, 2 finished, 2 incomplete, 1 running" in index
    assert rel(done) in out and "finished" in out


def test_listing_of_a_real_training_run(tmp_path):
    from mhar.training.train import train

    cfg = load_run_config(None, ["model.preset=debug", "data.corpus=synthetic:20000", "data.seq_len=32",
                                 "data.val_tokens=64", "train.steps=2", "train.global_batch=2", "train.micro_batch=2",
                                 "train.eval_every=1", "train.device=cpu", f"data.cache_dir={tmp_path / 'c'}",
                                 "meta.name=smoke", "train.seed=3"])
    run = tmp_path / "results" / R.run_relpath(cfg)
    summary = train(cfg, run)
    (r,) = R.scan(tmp_path / "results")
    assert (r.label, r.size, r.seed, r.status, r.step) == ("smoke", "debug", 3, "finished", 2)
    assert r.identity == summary["identity"] and not r.misplaced
    assert r.metrics["tail_mean_val_loss"] == pytest.approx(summary["tail_mean_val_loss"])


def test_runs_main_bad_results_folder(tmp_path, capsys):
    assert R.main(["--results", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
