"""A kill at every write step of the checkpoint, the checksum and the model export costs nothing: the same
command resumes from the newest valid checkpoint and ends with a model.pt byte-identical to an uninterrupted
run (issue 44.1). Also: resume falls back to an older valid checkpoint (one stderr line) instead of refusing,
and a full disk during a checkpoint write is one error line that loses nothing."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mhar.runs.checkpoint as C
import mhar.training.cli as CLI
import mhar.training.train as T
from mhar.runs.config import load_run_config
from mhar.safe_yaml import dump_yaml

ROOT = Path(__file__).resolve().parents[2]

# Runs in a subprocess: trains, recording every step of the write sequence of a training state, its
# checksum and a model export (2nd write into a file being hashed, fsync of a file, rename, removal; then
# the summary, the run's last record), and in "kill" mode SIGKILLs itself just before the N-th one.
_DRIVER = r"""
import os, re, signal, sys
from pathlib import Path
import mhar.runs.checkpoint as C
import mhar.training.cli as CLI

mode, target, trace, cfg_file, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
events = []

def _name(p):
    return re.sub(r"\.\d+\.tmp$", ".<pid>.tmp", Path(os.fsdecode(p)).name)

def event(what):
    if not any(k in what for k in ("state", "model", "summary")):
        return
    events.append(what)
    with open(trace, "a") as f:
        f.write(what + "\n")
    if mode == "kill" and len(events) == target:
        os.kill(os.getpid(), signal.SIGKILL)

real_replace, real_unlink, real_fsync = os.replace, os.unlink, os.fsync

def replace(a, b, *args, **kw):
    event(f"rename {_name(a)} -> {_name(b)}")
    return real_replace(a, b, *args, **kw)

def unlink(p, *args, **kw):
    event(f"remove {_name(p)}")
    return real_unlink(p, *args, **kw)

def fsync(fd):
    try:
        target_path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        target_path = ""
    if not os.path.isdir(target_path):
        event(f"fsync {_name(target_path)}")
    return real_fsync(fd)

os.replace, os.unlink, os.fsync = replace, unlink, fsync
real_write = C._HashingWriter.write

def write(self, b):
    self._n = getattr(self, "_n", 0) + 1
    if self._n == 2:  # part of the file is on disk, the rest is not
        event(f"mid-write {_name(self._f.name)}")
    return real_write(self, b)

C._HashingWriter.write = write
sys.exit(CLI.main([cfg_file, "--out", out]))
"""

OVERRIDES = ["model.preset=debug", "data.corpus=synthetic:20000", "data.seq_len=32", "data.val_tokens=128",
             "train.steps=4", "train.global_batch=2", "train.micro_batch=2", "train.warmup_steps=1",
             "train.eval_every=2", "train.tail_k=1", "train.checkpoint_every=2", "train.threads=1",
             "train.lr=3e-3", "train.device=cpu", "train.save_model_every_checkpoint=true"]


def _cfg(tmp: Path, *extra: str):
    """The run config as the CLI reads it back from its YAML file (key order included: the export's bytes)."""
    cfg = load_run_config(None, OVERRIDES + [f"data.cache_dir={tmp / 'cache'}", *extra])
    return load_run_config(_yaml(tmp, cfg))


def _driver(mode: str, n: int, trace: Path, cfg_file: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", _DRIVER, mode, str(n), str(trace), str(cfg_file), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _metrics(run: Path) -> list[dict]:
    drop = ("wall_s", "step_ms", "tok_s", "mfu")
    return [{k: v for k, v in json.loads(line).items() if k not in drop}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_clean_and_equal(run: Path, ref: Path, what: str) -> None:
    assert (run / "model.pt").read_bytes() == (ref / "model.pt").read_bytes(), what
    assert C.verify_sha256(run / "model.pt") and C.verify_sha256(run / "checkpoint" / "state-00000004.pt"), what
    assert _metrics(run) == _metrics(ref), what
    left = sorted(p.name for p in (run / "checkpoint").iterdir())
    # checkpoint/model.pt (the step-2 export) is there unless the kill came before it was complete
    assert left in (["model.pt", "model.pt.sha256", "state-00000004.pt", "state-00000004.pt.sha256"],
                    ["state-00000004.pt", "state-00000004.pt.sha256"]), (what, left)
    if "model.pt" in left:
        assert C.verify_sha256(run / "checkpoint" / "model.pt"), what
    assert not list(run.glob(".*.tmp")), what


@pytest.mark.slow
def test_a_kill_at_every_write_step_resumes_bit_identically(tmp_path):
    cfg = _cfg(tmp_path)
    cfg_file = _yaml(tmp_path, cfg)
    ref = tmp_path / "ref"
    trace = tmp_path / "trace.txt"
    r = _driver("trace", 0, trace, cfg_file, ref)
    assert r.returncode == 0, r.stderr[-2000:]
    events = trace.read_text().splitlines()
    # every step of both sequences is covered: state (data, checksum, removal of the previous one) and exports
    for needed in ("mid-write .state-00000002.pt.<pid>.tmp", "fsync .state-00000004.pt.<pid>.tmp",
                   "fsync .state-00000004.pt.sha256.<pid>.tmp",
                   "rename .state-00000004.pt.<pid>.tmp -> state-00000004.pt",
                   "rename .state-00000004.pt.sha256.<pid>.tmp -> state-00000004.pt.sha256",
                   "remove state-00000002.pt", "remove state-00000002.pt.sha256",
                   "mid-write .model.pt.<pid>.tmp", "fsync .model.pt.sha256.<pid>.tmp",
                   "rename .model.pt.<pid>.tmp -> model.pt", "rename .model.pt.sha256.<pid>.tmp -> model.pt.sha256"):
        assert needed in events, (needed, events)
    assert 20 <= len(events) <= 40, events
    for n, what in enumerate(events, 1):
        run = tmp_path / f"kill{n}"
        k = _driver("kill", n, tmp_path / f"trace{n}.txt", cfg_file, run)
        assert k.returncode == -signal.SIGKILL, (what, k.returncode, k.stderr[-2000:])
        assert not (run / "summary.json").exists(), what
        T.train(cfg, run)  # the same command again
        _assert_clean_and_equal(run, ref, f"killed before: {what}")


def test_resume_falls_back_to_the_newest_valid_checkpoint(tmp_path, capsys):
    cfg = _cfg(tmp_path, "train.steps=6", "train.save_model_every_checkpoint=false")
    ref = tmp_path / "ref"
    T.train(cfg, ref)
    run = tmp_path / "run"
    T.train(cfg, run, stop_after=2)
    ck = run / "checkpoint"
    kept = {p.name: p.read_bytes() for p in ck.iterdir()}  # state 2: what a kill before the prune leaves
    T.train(cfg, run, stop_after=4)
    assert sorted(p.name for p in ck.iterdir()) == ["state-00000004.pt", "state-00000004.pt.sha256"]
    for name, data in kept.items():
        (ck / name).write_bytes(data)
    raw = bytearray((ck / "state-00000004.pt").read_bytes())
    raw[len(raw) // 2] ^= 0x01  # the newest checkpoint is damaged (or its checksum is missing)
    (ck / "state-00000004.pt").write_bytes(bytes(raw))
    capsys.readouterr()
    assert CLI.main([str(_yaml(tmp_path, cfg)), "--out", str(run)]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: skipping the newer training checkpoint(s) "
                                                   "state-00000004.pt"), err
    assert "fails its sha256 check" in lines[0] and "state-00000002.pt (step 2)" in lines[0]
    assert (run / "model.pt").read_bytes() == (ref / "model.pt").read_bytes()
    assert _metrics(run) == _metrics(ref)
    assert sorted(p.name for p in ck.iterdir()) == ["state-00000006.pt", "state-00000006.pt.sha256"]


def test_without_any_valid_checkpoint_resume_refuses_and_keeps_everything(tmp_path, capsys):
    cfg = _cfg(tmp_path, "train.save_model_every_checkpoint=false")
    run = tmp_path / "run"
    T.train(cfg, run, stop_after=2)
    side = run / "checkpoint" / "state-00000002.pt.sha256"
    side.unlink()
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert CLI.main([str(_yaml(tmp_path, cfg)), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: training checkpoint: ") and "no checksum file" in err
    assert f"delete {run / 'checkpoint'} to restart" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def _yaml(tmp: Path, cfg) -> Path:
    p = tmp / "cfg.yaml"
    p.write_text(dump_yaml(cfg.to_dict()))
    return p


def test_disk_full_during_a_checkpoint_is_one_error_line_and_loses_nothing(tmp_path, capsys, monkeypatch):
    cfg = _cfg(tmp_path, "train.save_model_every_checkpoint=false")
    ref = tmp_path / "ref"
    T.train(cfg, ref)
    run = tmp_path / "run"
    real, calls = C._HashingWriter.write, {"files": set()}

    def full_at_second_state(self, b):
        calls["files"].add(self._f.name)
        if "state-00000004" in self._f.name:
            raise OSError(errno.ENOSPC, "No space left on device", self._f.name)
        return real(self, b)

    monkeypatch.setattr(C._HashingWriter, "write", full_at_second_state)
    capsys.readouterr()
    assert CLI.main([str(_yaml(tmp_path, cfg)), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: training failed on "), err
    assert "No space left on device (ENOSPC)" in err and "the disk is full" in err and "run the same command" in err
    left = sorted(p.name for p in (run / "checkpoint").iterdir())
    assert left == ["state-00000002.pt", "state-00000002.pt.sha256"], left  # the previous one is intact
    monkeypatch.setattr(C._HashingWriter, "write", real)
    assert CLI.main([str(_yaml(tmp_path, cfg)), "--out", str(run)]) == 0
    assert (run / "model.pt").read_bytes() == (ref / "model.pt").read_bytes()
    assert _metrics(run) == _metrics(ref)


@pytest.mark.parametrize("fault, says", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device (ENOSPC); the disk is full"),
    (ValueError("a write that fails without an OSError"),
     "torch.save could not write the file ([enforce fail at inline_container.cc")])
def test_a_write_failing_inside_torch_save_is_one_error_line_and_loses_nothing(tmp_path, capsys, monkeypatch, fault,
                                                                                says):
    """A full disk in the middle of a training state: torch.save's archive writer turns the failed write into a
    RuntimeError ("[enforce fail at inline_container.cc] unexpected pos ..."), not an OSError. Still one error line
    naming the reason, the previous checkpoint is kept, and the same command then finishes the run."""
    cfg = _cfg(tmp_path, "train.save_model_every_checkpoint=false")
    ref = tmp_path / "ref"
    T.train(cfg, ref)
    run = tmp_path / "run"
    real = C._HashingWriter.write

    class Full:  # the temp file once the disk is full
        name = "full"

        def write(self, b):
            raise fault

    def fails_mid_second_state(self, b):
        if "state-00000004" in self._f.name and self.sha.digest() != C.hashlib.sha256().digest():
            self._f = Full()  # part of the state is written
        return real(self, b)

    monkeypatch.setattr(C._HashingWriter, "write", fails_mid_second_state)
    capsys.readouterr()
    assert CLI.main([str(_yaml(tmp_path, cfg)), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    state = run / "checkpoint" / "state-00000004.pt"
    assert err.count("\n") == 1 and err.startswith(f"error: training failed on {state}: {says}"), err
    assert "run the same command again to resume" in err, err
    left = sorted(p.name for p in (run / "checkpoint").iterdir())
    assert left == ["state-00000002.pt", "state-00000002.pt.sha256"], left  # the previous one is intact
    monkeypatch.setattr(C._HashingWriter, "write", real)
    assert CLI.main([str(_yaml(tmp_path, cfg)), "--out", str(run)]) == 0
    assert (run / "model.pt").read_bytes() == (ref / "model.pt").read_bytes()
    assert _metrics(run) == _metrics(ref)


def test_hashing_while_writing_gives_the_file_hash_and_a_checksum_is_never_missing(tmp_path):
    path = tmp_path / "x.pt"
    digest = C.atomic_torch_save({"w": torch.randn(300, 300), "n": [1, 2]}, path)
    assert digest == C.file_sha256(path) and C.verify_sha256(path) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.pt", "x.pt.sha256"]


@pytest.mark.parametrize("code, says", [(errno.EROFS, "Read-only file system (EROFS)"),
                                        (errno.ENOSPC, "No space left on device (ENOSPC)")])
def test_unwritable_run_dir_fails_before_any_data_is_loaded(tmp_path, capsys, monkeypatch, code, says):
    import builtins

    import mhar.atomic as A

    run = tmp_path / "run"

    def fake_open(path, mode="r", *a, **k):  # the file system refuses writes there (root ignores file modes)
        if "w" in mode and run in Path(path).parents:
            raise OSError(code, os.strerror(code), str(path))
        return builtins.open(path, mode, *a, **k)

    monkeypatch.setattr(A, "open", fake_open, raising=False)
    monkeypatch.setattr(T, "load_data", lambda *a, **k: pytest.fail("data loaded before --out was checked"))
    cfg = _cfg(tmp_path)
    capsys.readouterr()
    assert CLI.main([str(_yaml(tmp_path, cfg)), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --out {run} is not a usable run directory: ") and says in err
    assert not run.exists()
