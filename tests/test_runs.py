"""mhar.runs.layout: the run listing / INDEX.md and the migration of results from the older layout."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

try:
    import fixtures_analysis as fx
except ImportError:
    from tests import fixtures_analysis as fx
import mhar.runs.layout as R
from mhar.runs.config import identity_hash, legacy_identity_hash, load_run_config, yaml_load

REPO = Path(__file__).resolve().parents[1]
OLD_TIME = 1_600_000_000  # an mtime the migration must keep


def _cfg_of(run_dir: Path):
    return load_run_config(run_dir / "config.yaml")


def _old_layout(results: Path, label: str, variant: str, seed: int, heads=None, with_rid=True, overrides=()):
    """A run as the older workflow laid it out: runs/<pairing hash>/<label>/<size>/seed<k>/<old identity>/, with
    its evaluation, logs and tokenization record; every file gets the mtime OLD_TIME."""
    tmp = fx.write_run(results.parent / "staging", variant, "debug", seed, 3.0, heads=heads, label=label,
                       overrides=overrides).parent
    cfg = _cfg_of(tmp)
    raw = yaml_load((tmp / "config.yaml").read_text())
    old_hash = "b95faf65a6" if not overrides else "c0ffee0001"
    old_rid = legacy_identity_hash(raw)[:10]
    rel = f"{old_hash}/{label}/debug/seed{seed}" + (f"/{old_rid}" if with_rid else "")
    run = results / "runs" / rel
    run.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, run)
    (run / "model.pt").write_bytes(b"weights")
    (run / "model.pt.sha256").write_text("x  model.pt\n")
    ev = results / "eval" / rel / "21e8acfd" / "lambada_openai"
    ev.mkdir(parents=True)
    (ev / "results.json").write_text(json.dumps({"model": f"results/runs/{rel}/model.pt", "n": 8}))
    (ev / "samples.jsonl").write_text("{}\n")
    logs = results / "logs" / "train" / rel
    logs.parent.mkdir(parents=True, exist_ok=True)
    logs.with_suffix(".log").write_text("trained\n")
    logs.with_suffix(".run_config.yaml").write_text("x: 1\n")
    elog = results / "logs" / "eval" / rel / "21e8acfd" / "lambada_openai.log"
    elog.parent.mkdir(parents=True, exist_ok=True)
    elog.write_text("evaluated\n")
    (results / "data" / old_hash).mkdir(parents=True, exist_ok=True)
    (results / "data" / old_hash / "shards.json").write_text("{}")
    (results / "logs" / "data").mkdir(parents=True, exist_ok=True)
    (results / "logs" / "data" / f"{old_hash}.log").write_text("tokenized\n")
    for p in results.rglob("*"):
        if p.is_file():
            os.utime(p, (OLD_TIME, OLD_TIME))
    return cfg, rel


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime) for p in sorted(root.rglob("*"))
            if p.is_file()}


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
    assert rows["somewhere/else"].misplaced and "migrate" in rows["somewhere/else"].note
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


# --- migration ----------------------------------------------------------------------------------------------
def test_migrate_moves_runs_evals_logs_and_data_keeping_mtimes(tmp_path, capsys):
    res = tmp_path / "results"
    moved = []
    for label, variant, seed, heads, with_rid in (("baseline", "baseline", 0, None, True),
                                                  ("mhar", "mhar", 0, 4, True),
                                                  ("mhar", "mhar", 1, 4, False)):  # the layout before <rid>
        moved.append(_old_layout(res, label, variant, seed, heads, with_rid))
    before = _tree(res)
    assert R.main(["migrate", "--results", str(res), "--dry-run"]) == 0
    assert _tree(res) == before and "would move" in capsys.readouterr().out
    assert R.main(["migrate", "--results", str(res)]) == 0
    out = capsys.readouterr().out
    after = _tree(res)
    for cfg, old in moved:
        new = R.run_relpath(cfg)
        key = R.run_key(cfg)
        tail = f"{key['variant']}/debug/seed{key['seed']}/{key['rid']}"
        assert new == f"runs/{tail}"
        for old_p, new_p in ((f"runs/{old}/summary.json", f"{new}/summary.json"),
                             (f"runs/{old}/model.pt", f"{new}/model.pt"),
                             (f"eval/{old}/21e8acfd/lambada_openai/results.json",
                              f"eval/{tail}/21e8acfd/lambada_openai/results.json"),
                             (f"logs/train/{old}.log", f"logs/train/{tail}.log"),
                             (f"logs/eval/{old}/21e8acfd/lambada_openai.log",
                              f"logs/eval/{tail}/21e8acfd/lambada_openai.log")):
            assert after[new_p] == before[old_p], new_p  # same bytes, same mtime
            assert old_p not in after
    dkey = R.data_key(moved[0][0])
    assert after[f"data/{dkey}/shards.json"] == before["data/b95faf65a6/shards.json"]
    assert f"logs/data/{dkey}.log" in after
    assert not (res / "runs" / "b95faf65a6").exists() and not (res / "eval" / "b95faf65a6").exists()
    record = json.loads(next((res / "migrations").glob("*.json")).read_text())
    assert sorted(m[0] for m in record["moves"] if m[0].startswith("runs/")) == sorted(f"runs/{o}" for _, o in moved)
    assert f"moved {res / 'runs' / moved[0][1]} -> {res / R.run_relpath(moved[0][0])}" in out
    assert not (res / R.PLAN_FILE).exists() and (res / "runs" / "INDEX.md").is_file()
    assert all(not r.misplaced and r.status == "finished" for r in R.scan(res))
    # moved, nothing copied: the files are the same inodes' content; and a second migrate has nothing to do
    assert R.main(["migrate", "--results", str(res)]) == 0
    assert "nothing to migrate" in capsys.readouterr().out


def test_migrate_refuses_conflicts_with_one_line_and_moves_nothing(tmp_path, capsys):
    res = tmp_path / "results"
    cfg, old = _old_layout(res, "baseline", "baseline", 0)
    target = res / R.run_relpath(cfg)
    target.mkdir(parents=True)
    (target / "summary.json").write_text("{}")  # trained again under the new layout meanwhile
    before = _tree(res)
    assert R.main(["migrate", "--results", str(res)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot move") and "already exists" in err[0]
    assert str(target) in err[0] and _tree(res) == before
    # two folders of one identity (the same config under two older hashes)
    res2 = tmp_path / "r2"
    _old_layout(res2, "baseline", "baseline", 0)
    src = next((res2 / "runs").glob("*/baseline/debug/seed0/*"))
    twin = res2 / "runs" / "ffffffffff" / "baseline" / "debug" / "seed0" / src.name
    twin.parent.mkdir(parents=True)
    shutil.copytree(src, twin, copy_function=shutil.copy2)
    before = _tree(res2)
    assert R.main(["migrate", "--results", str(res2)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would both move to" in err[0] and _tree(res2) == before
    # a running trainer
    res3 = tmp_path / "r3"
    _old_layout(res3, "baseline", "baseline", 0)
    next((res3 / "runs").glob("*/baseline/debug/seed0/*")).joinpath(".lock").write_text(f"{os.getpid()}\n")
    assert R.main(["migrate", "--results", str(res3)]) == 2
    assert "a trainer is running" in capsys.readouterr().err


def test_a_killed_migration_resumes(tmp_path, monkeypatch, capsys):
    res, ref = tmp_path / "results", tmp_path / "ref"
    for root in (res, ref):
        _old_layout(root, "baseline", "baseline", 0)
        _old_layout(root, "mhar", "mhar", 0, 4)
    assert R.main(["migrate", "--results", str(ref)]) == 0
    calls = {"n": 0}
    real = os.rename

    def killed(src, dst):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real(src, dst)

    monkeypatch.setattr(R.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        R.migrate(res)
    monkeypatch.setattr(R.os, "rename", real)
    assert (res / R.PLAN_FILE).is_file()
    assert R.main(["migrate", "--results", str(res)]) == 0
    assert "resuming the interrupted migration" in capsys.readouterr().out
    strip = lambda t: {k: v for k, v in t.items() if not k.startswith(("migrations/", "runs/INDEX.md"))}  # noqa: E731
    assert strip(_tree(res)) == strip(_tree(ref))


def test_runs_main_bad_results_folder(tmp_path, capsys):
    assert R.main(["--results", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert R.main(["migrate", "--results", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such results folder" in err[0]


# --- the workflow after a migration --------------------------------------------------------------------------
def _snakemake(args, workdir, env_extra=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "MHAR_DATA_DIR"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), **(env_extra or {}))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_workflow_plans_no_training_after_migrating_the_older_layout(tmp_path):
    """Runs trained by the workflow, laid out as the older code laid them out (pairing hash + old identity in the
    path, tokenization record under the pairing hash, no Snakemake records of the new paths): after
    `mhar runs migrate`, `snakemake -n` plans no training and no tokenization job."""
    data = os.environ.get("MHAR_DATA_DIR")
    if not data or not Path(data, "tinyshakespeare").is_dir():
        pytest.skip("needs the local data mirror (MHAR_DATA_DIR with tinyshakespeare/)")
    env = {"MHAR_DATA_DIR": str(Path(data).resolve())}
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["seeds"], cfg["heads"]["seeds"] = [0], [0]
    conf = tmp_path / "ci1.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    args = ["reproduce_table1", "--configfile", str(conf)]
    res = _snakemake([*args, "--cores", "2"], tmp_path, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = tmp_path / "results"
    # lay the finished runs out as the older code did, keeping mtimes (os.rename)
    for run in [p.parent for p in (results / "runs").glob("*/*/seed*/*/config.yaml")]:
        label, size, seed, rid = run.relative_to(results / "runs").parts
        old = f"a1b2c3d4e5/{label}/{size}/{seed}/{legacy_identity_hash(yaml_load((run / 'config.yaml').read_text()))[:10]}"
        os.renames(run, results / "runs" / old)
        log = results / "logs" / "train" / label / size / seed / f"{rid}.log"
        os.renames(log, results / "logs" / "train" / f"{old}.log")
    (dkey,) = [p.name for p in (results / "data").iterdir()]
    os.rename(results / "data" / dkey, results / "data" / "a1b2c3d4e5")
    # Snakemake's records name the new paths; without reports the table job needs every summary
    reports = cfg.get("reports_dir", "reports")
    subprocess.run(["rm", "-rf", str(tmp_path / ".snakemake"), str(tmp_path / reports)], check=True)
    plan = _snakemake([*args, "-n"], tmp_path, env)
    assert re.search(r"^train\s+2$", plan.stdout, re.M), plan.stdout[-2000:]  # before: both runs look missing
    res = subprocess.run([sys.executable, "-m", "mhar.runs.layout", "migrate", "--results", str(results)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert res.returncode == 0, res.stderr
    plan = _snakemake([*args, "-n"], tmp_path, env)
    out = plan.stdout + plan.stderr
    assert plan.returncode == 0 and re.search(r"^table1\s+1$", out, re.M), out[-3000:]
    assert not re.search(r"^(train|prepare_data)\s+\d+$", out, re.M), out[-3000:]
