"""scripts/migrate_run_layout.py: results laid out by earlier versions move to the current layout (runs, their
evaluations, logs and tokenization records; mtimes kept, nothing retrained), and training checkpoints that name
their run by the identity of that time are converted so the trainer resumes them bit-identically."""
from __future__ import annotations

import importlib.util
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
import mhar.training.train as T
from mhar.runs.checkpoint import atomic_torch_save, safe_torch_load, verify_sha256
from mhar.runs.config import identity_hash, load_run_config
from mhar.safe_yaml import dump_yaml, yaml_load

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "migrate_run_layout.py"
_spec = importlib.util.spec_from_file_location("migrate_run_layout", SCRIPT)
M = sys.modules["migrate_run_layout"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)
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
    old_rid = M.old_identity_hash(raw)[:10]
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


# --- moving folders ----------------------------------------------------------------------------------------------
def test_migrate_moves_runs_evals_logs_and_data_keeping_mtimes(tmp_path, capsys):
    res = tmp_path / "results"
    moved = []
    for label, variant, seed, heads, with_rid in (("baseline", "baseline", 0, None, True),
                                                  ("mhar", "mhar", 0, 4, True),
                                                  ("mhar", "mhar", 1, 4, False)):  # the layout before <rid>
        moved.append(_old_layout(res, label, variant, seed, heads, with_rid))
    before = _tree(res)
    assert M.main(["--results", str(res), "--dry-run"]) == 0
    assert _tree(res) == before and "would move" in capsys.readouterr().out
    assert M.main(["--results", str(res)]) == 0
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
    assert not (res / M.PLAN_FILE).exists() and (res / "runs" / "INDEX.md").is_file()
    assert all(not r.misplaced and r.status == "finished" for r in R.scan(res))
    # moved, nothing copied: the files are the same inodes' content; and a second migrate has nothing to do
    assert M.main(["--results", str(res)]) == 0
    assert "nothing to migrate" in capsys.readouterr().out


def test_migrate_refuses_conflicts_with_one_line_and_moves_nothing(tmp_path, capsys):
    res = tmp_path / "results"
    cfg, old = _old_layout(res, "baseline", "baseline", 0)
    target = res / R.run_relpath(cfg)
    target.mkdir(parents=True)
    (target / "summary.json").write_text("{}")  # trained again under the new layout meanwhile
    before = _tree(res)
    assert M.main(["--results", str(res)]) == 2
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
    assert M.main(["--results", str(res2)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would both move to" in err[0] and _tree(res2) == before
    # a running trainer
    res3 = tmp_path / "r3"
    _old_layout(res3, "baseline", "baseline", 0)
    next((res3 / "runs").glob("*/baseline/debug/seed0/*")).joinpath(".lock").write_text(f"{os.getpid()}\n")
    assert M.main(["--results", str(res3)]) == 2
    assert "a trainer is running" in capsys.readouterr().err


def test_a_killed_migration_resumes(tmp_path, monkeypatch, capsys):
    res, ref = tmp_path / "results", tmp_path / "ref"
    for root in (res, ref):
        _old_layout(root, "baseline", "baseline", 0)
        _old_layout(root, "mhar", "mhar", 0, 4)
    assert M.main(["--results", str(ref)]) == 0
    calls = {"n": 0}
    real = os.rename

    def killed(src, dst):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real(src, dst)

    monkeypatch.setattr(M.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        M.migrate(res)
    monkeypatch.setattr(M.os, "rename", real)
    assert (res / M.PLAN_FILE).is_file()
    assert M.main(["--results", str(res)]) == 0
    assert "resuming the interrupted migration" in capsys.readouterr().out
    strip = lambda t: {k: v for k, v in t.items() if not k.startswith(("migrations/", "runs/INDEX.md"))}  # noqa: E731
    assert strip(_tree(res)) == strip(_tree(ref))


def test_bad_results_folder_is_one_line(tmp_path, capsys):
    assert M.main(["--results", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such results folder" in err[0]


# --- checkpoints of the earlier identity -----------------------------------------------------------------------
def _train_cfg(tmp: Path, *extra: str):
    return load_run_config(None, [
        "model.preset=debug", "model.residual.variant=mhar", "model.residual.heads=2", "data.corpus=synthetic:20000",
        f"data.cache_dir={tmp / 'cache'}", "data.seq_len=32", "data.val_tokens=128", "train.steps=4",
        "train.global_batch=2", "train.micro_batch=2", "train.warmup_steps=1", "train.eval_every=2", "train.tail_k=1",
        "train.checkpoint_every=2", "train.threads=1", "train.lr=3e-3", "train.device=cpu", *extra])


def _as_old_checkpoint(run: Path, old_identity: str, name: str = "state.pt") -> Path:
    """Rewrite the run's step-2 state as the earlier trainer wrote it: key identity_hash, ``checkpoint/<name>``."""
    state = run / "checkpoint" / "state-00000002.pt"
    blob = safe_torch_load(state)
    blob["identity_hash"] = old_identity
    del blob["identity"]
    state.unlink()
    state.with_name(state.name + ".sha256").unlink()
    atomic_torch_save(blob, run / "checkpoint" / name)
    return run / "checkpoint" / name


@pytest.mark.parametrize("name", ["state.pt", "state-00000002.pt"])
def test_an_old_identity_checkpoint_is_converted_and_resumes_bit_identically(tmp_path, capsys, name):
    """A run started fused with compile on a GPU (its config.yaml says so) whose checkpoint records the identity
    of that time: converted, it resumes on this CPU and ends byte-identical to an uninterrupted run."""
    cfg = _train_cfg(tmp_path)
    ref = tmp_path / "ref"
    T.train(cfg, ref)
    run = tmp_path / "run"
    T.train(cfg, run, stop_after=2)
    rec = yaml_load((run / "config.yaml").read_text())
    rec["model"]["residual"]["routing_impl"], rec["train"]["compile"], rec["train"]["device"] = "fused", True, "cuda"
    (run / "config.yaml").write_text(dump_yaml(rec))
    old = _as_old_checkpoint(run, M.old_identity_hash(rec), name)
    assert M.main(["--run", str(run), "--dry-run"]) == 0 and old.is_file()
    assert M.main(["--run", str(run)]) == 0
    assert "converted" in capsys.readouterr().out
    assert sorted(p.name for p in (run / "checkpoint").iterdir()) == ["state-00000002.pt", "state-00000002.pt.sha256"]
    assert verify_sha256(run / "checkpoint" / "state-00000002.pt")
    assert safe_torch_load(run / "checkpoint" / "state-00000002.pt")["identity"] == identity_hash(cfg)
    assert M.main(["--run", str(run)]) == 0 and "nothing to convert" in capsys.readouterr().out
    out = T.train(cfg, run)
    assert out["steps"] == 4 and out["identity"] == identity_hash(cfg)
    assert (run / "model.pt").read_bytes() == (ref / "model.pt").read_bytes()


def test_an_old_checkpoint_of_another_config_is_refused_and_left(tmp_path, capsys):
    cfg = _train_cfg(tmp_path, "train.steps=3")
    run = tmp_path / "run"
    T.train(cfg, run, stop_after=2)
    old = _as_old_checkpoint(run, "0" * 16)
    before = old.read_bytes()
    assert M.main(["--run", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {old} was written by a different config"), err
    assert old.read_bytes() == before and not (run / "checkpoint" / "state-00000002.pt").exists()


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
    scripts/migrate_run_layout.py, `snakemake -n` plans no training and no tokenization job."""
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
        old = f"a1b2c3d4e5/{label}/{size}/{seed}/{M.old_identity_hash(yaml_load((run / 'config.yaml').read_text()))[:10]}"
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
    res = subprocess.run([sys.executable, str(SCRIPT), "--results", str(results)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert res.returncode == 0, res.stderr
    plan = _snakemake([*args, "-n"], tmp_path, env)
    out = plan.stdout + plan.stderr
    assert plan.returncode == 0 and re.search(r"^table\s+1$", out, re.M), out[-3000:]
    assert not re.search(r"^(train|prepare_data)\s+\d+$", out, re.M), out[-3000:]
