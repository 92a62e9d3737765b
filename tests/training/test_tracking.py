"""Experiment tracking (mhar.training.tracking): TensorBoard event files and offline W&B runs, read back
with TensorBoard's event reader and a reader of W&B's offline run file; routing statistics; a missing package."""
from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mhar.model.config import ConfigError
from mhar.runs.config import load_run_config
from mhar.training import tracking as TR
from test_train import cfg_for, corpus  # noqa: F401  (corpus is a fixture)

HAS_TB = TR.importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = TR.importlib.util.find_spec("wandb") is not None
needs_both = pytest.mark.skipif(not (HAS_TB and HAS_WANDB), reason="needs tensorboard and wandb (pip install -e '.[track]')")


# --- readers (independent of the writers) -----------------------------------------------------------------
def tb_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} through TensorBoard's EventAccumulator (orphaned events of a resume purged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def tb_images(log_dir: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Images(tag)] for tag in acc.Tags()["images"]}


def wandb_records(path: Path) -> list:
    """The protobuf records of one offline W&B run file (``run-<id>.wandb``): a 7-byte header (':W&B',
    magic, version), then LevelDB-log framing: 32 KiB blocks of chunks (crc32 4, length 2, type 1: full,
    first, middle, last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    out, pos, pending, block = [], 7, b"", 32768
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # block trailer
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
    return out


def _finished_records(path: Path, wait_s: float = 60.0) -> list:
    """The records of one offline run file once its ``exit`` record is there: wandb's service process writes the
    file and may still be flushing it when ``run.finish()`` has returned (seen on a loaded machine: a file
    without its records). A file that never gets one (a killed segment) is read as it is after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        records = wandb_records(path) if path.stat().st_size >= 7 else []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def wandb_run(run_dir: Path) -> dict:
    """Every offline segment of the W&B run kept in ``run_dir/wandb``: ids, groups, names, config keys and
    history rows ({key: value} with the trainer's ``step``) in the order they were written."""
    found = {"ids": [], "groups": [], "names": [], "config": set(), "history": []}
    deadline = time.monotonic() + 60
    while not list((run_dir / "wandb").glob("offline-run-*/run-*.wandb")) and time.monotonic() < deadline:
        time.sleep(0.2)  # (the same service process creates the file)
    for f in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for rec in _finished_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                found["ids"].append(rec.run.run_id)
                found["groups"].append(rec.run.run_group)
                found["names"].append(rec.run.display_name)
                found["config"] |= {item.key for item in rec.run.config.update}
            elif kind == "history":
                row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in rec.history.item}
                found["history"].append(row)
    return found


def cfg(*overrides):
    return load_run_config(None, ["model.preset=debug", "train.device=cpu", *overrides])


# --- tests ---------------------------------------------------------------------------------------------------
def test_no_tracker_is_a_silent_no_op(tmp_path):
    tr = TR.open_trackers(cfg(), tmp_path, [])
    assert not tr.active
    tr.log(1, {"train/loss": 1.0})
    tr.log_image(1, "x", np.zeros((2, 2)))
    tr.close()
    assert list(tmp_path.iterdir()) == []


def test_a_missing_package_is_one_line_naming_what_to_install(tmp_path, monkeypatch):
    real = TR.importlib.util.find_spec
    monkeypatch.setattr(TR.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError) as e:
        TR.open_trackers(cfg(), tmp_path, ["tensorboard", "wandb"])
    msg = str(e.value)
    assert "\n" not in msg and "wandb is not installed" in msg and "pip install wandb" in msg
    assert "tensorboard is" not in msg and list(tmp_path.iterdir()) == []


def test_routing_summary_against_hand_computed_entropies():
    B, T = 2, 3
    uniform = torch.full((B, T, 2, 4), 0.25)  # site with 2 heads over 4 sources: entropy log 4
    onehot = torch.zeros(B, T, 1, 2)
    onehot[..., 0] = 1.0  # 1 head, all weight on the embedding: entropy 0
    scalars, heat = TR.routing_summary({"L1.attn": uniform, "final": onehot})
    assert scalars == pytest.approx({"routing/entropy/L1.attn/h0": math.log(4), "routing/entropy/L1.attn/h1": math.log(4),
                                     "routing/entropy/final/h0": 0.0}, abs=1e-6)
    np.testing.assert_allclose(heat, [[0.25] * 4, [0.25] * 4, [1, 0, 0, 0]], atol=1e-7)


@needs_both
def test_tensorboard_and_offline_wandb_hold_what_was_logged_and_a_reopened_run_continues(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    c = cfg("meta.name=mhar_h4", "train.tracking=[tensorboard,wandb]", "train.tracking_group=cafe1234")
    rows = {s: {"loss": 3.0 / s, "lr": 1e-3 * s, "grad_norm": 0.5 + s} for s in range(1, 6)}
    tr = TR.open_trackers(c, tmp_path, c.train.tracking, provenance={"git": "abc"})
    for s in (1, 2, 3, 4):
        tr.log(s, {f"train/{k}": v for k, v in rows[s].items()} | {"note": "text is skipped"})
    tr.log_image(2, "routing/depth_weights", np.eye(3))
    tr.close()
    record = json.loads((tmp_path / TR.TRACKING_FILE).read_text())
    run_id = record["wandb"]["id"]
    assert record["tensorboard"] == {"log_dir": "tensorboard"} and record["name"] == "mhar_h4/debug/seed0"
    # resumed from a checkpoint at step 2: steps 3, 4 of the killed segment are replaced
    tr = TR.open_trackers(c, tmp_path, c.train.tracking, resume_step=2)
    for s in (3, 4, 5):
        tr.log(s, {f"train/{k}": v for k, v in rows[s].items()})
    tr.close()
    assert json.loads((tmp_path / TR.TRACKING_FILE).read_text())["wandb"]["id"] == run_id

    tb = tb_scalars(tmp_path / "tensorboard")
    for k in ("loss", "lr", "grad_norm"):
        assert tb[f"train/{k}"] == {s: pytest.approx(rows[s][k], rel=1e-6) for s in rows}, k  # float32 in TB
    assert tb_images(tmp_path / "tensorboard") == {"routing/depth_weights": [2]}

    wb = wandb_run(tmp_path)
    assert wb["ids"] == [run_id, run_id] and set(wb["groups"]) == {"cafe1234"}
    assert set(wb["names"]) == {"mhar_h4/debug/seed0"}
    assert {"config", "identity", "pairing", "run", "provenance"} <= wb["config"]
    logged = {}
    for row in wb["history"]:
        if "train/loss" in row:
            logged[row["step"]] = {k: row[f"train/{k}"] for k in ("loss", "lr", "grad_norm")}
    assert logged == rows  # exact: W&B keeps doubles
    (image,) = [row for row in wb["history"] if row.get("routing/depth_weights/_type") == "image-file"]
    assert image["step"] == 2 and (image["routing/depth_weights/width"], image["routing/depth_weights/height"]) == (3, 3)


@needs_both
def test_a_tracked_training_run_logs_metrics_jsonl_and_a_resume_continues_the_same_run(corpus, tmp_path, monkeypatch):
    """train.tracking=[tensorboard, wandb] offline: every scalar of metrics.jsonl is in both (a killed segment's
    later steps replaced by the resumed run's), the routing entropies and heatmap at each evaluation, one W&B
    run id over both segments."""
    import mhar.training.train as T

    monkeypatch.setenv("WANDB_MODE", "offline")
    c = cfg_for(corpus, tmp_path / "cache", "model.residual.variant=mhar", "model.residual.heads=2",
                "train.tracking=[tensorboard,wandb]", "train.tracking_group=0123abcd", "meta.name=mhar_h2")
    out = tmp_path / "run"
    assert T.train(c, out, stop_after=4) is None  # checkpoint at 4 (checkpoint_every=3 wrote 3 too)
    T.train(c, out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    expect = {}
    for r in rows:  # train rows: every number as train/<key>; val rows: val_loss as val/loss
        for k, v in r.items():
            if r["split"] == "train" and k != "step" and isinstance(v, (int, float)):
                expect.setdefault(f"train/{k}", {})[r["step"]] = v
        if r["split"] == "val":
            expect.setdefault("val/loss", {})[r["step"]] = r["val_loss"]
    tb = tb_scalars(out / "tensorboard")
    wb = wandb_run(out)
    logged = {}
    for row in wb["history"]:
        for k, v in row.items():
            if not k.startswith("_") and k != "step" and isinstance(v, (int, float)):
                logged.setdefault(k, {})[row["step"]] = v  # a step logged again by the resumed run: its value
    for tag, series in expect.items():
        assert tb[tag] == {s: pytest.approx(v, rel=1e-6) for s, v in series.items()}, tag
        if tag not in ("train/wall_s", "train/step_ms", "train/tok_s"):  # timings of the killed segment differ
            assert logged[tag] == series, tag
    evals = sorted(expect["val/loss"])
    entropies = [t for t in tb if t.startswith("routing/entropy/")]
    assert "routing/entropy/L0.attn/h1" in entropies and all(sorted(tb[t]) == evals for t in entropies)
    assert tb_images(out / "tensorboard") == {"routing/depth_weights": evals}
    assert "train/peak_mem_gb" in tb and "summary/tail_mean_val_loss" in tb
    record = json.loads((out / TR.TRACKING_FILE).read_text())
    assert set(wb["ids"]) == {record["wandb"]["id"]} and set(wb["groups"]) == {"0123abcd"}  # one run, resumed


# --- tracking is an observer: failures of a tracker (issue 58) ----------------------------------------------
# The trainer's CLI in a fresh process, so that what a user sees is what is checked: a writer thread's exception
# goes through threading.excepthook there (pytest's own hook would swallow it in this process). A full disk:
# TensorBoard's writer thread writes each record through its LocalFileSystem._write; from the (after+1)-th write
# into the tensorboard folder on, the bytes go to /dev/full, whose writes the kernel answers with ENOSPC, as a
# full disk does. A read-only folder is made read-only (mode 0555); root, whose file modes do not bind, trains
# without the capabilities that bypass them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so the kernel's own EACCES
# comes back; where they cannot be dropped, fault "read-only" raises that EACCES at the same call instead.
_LAUNCH = r"""
import errno, os, sys
from pathlib import Path
from tensorboard.compat.tensorflow_stub.io import gfile
fault, folder, after = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
real, writes = gfile.LocalFileSystem._write, [0]
def _write(self, filename, content, mode):
    name = os.fsdecode(filename)
    if Path(name).parent == folder:
        writes[0] += 1
        if fault == "full" and writes[0] > after:
            filename = "/dev/full"
        elif fault == "read-only":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
    return real(self, filename, content, mode)
gfile.LocalFileSystem._write = _write
from mhar.training.cli import main
sys.exit(main(sys.argv[4:]))
"""
needs_tb = pytest.mark.skipif(not HAS_TB, reason="needs tensorboard (pip install -e '.[track]')")


def _without_dac_override() -> None:
    """In the child before exec: drop the capabilities that let root ignore file modes from the bounding set (the
    exec'd program then runs without them)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _modes_bind() -> bool:
    """Whether file modes bind a process started by _train_with_fault (not root, or root that may drop the
    capabilities that bypass them)."""
    import os
    import subprocess
    import sys

    if os.geteuid() != 0:
        return True
    try:
        subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_without_dac_override, check=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _train_with_fault(c, run: Path, fault: str, after: int = 0) -> tuple[int, str]:
    import os
    import subprocess
    import sys

    from mhar.safe_yaml import dump_yaml

    config = run.parent / f"{run.name}.yaml"
    config.write_text(dump_yaml(c.to_dict()))
    p = subprocess.run([sys.executable, "-c", _LAUNCH, fault, str(run / TR.TB_DIR), str(after), str(config),
                        "--out", str(run)], capture_output=True, text=True, timeout=300,
                       preexec_fn=_without_dac_override if fault == "none" and os.geteuid() == 0 else None)
    return p.returncode, p.stderr


def _the_one_line(err: str, starts: str, *has: str) -> str:
    assert "Traceback" not in err and "Exception in thread" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), err
    for text in has:
        assert text in lines[0], (text, err)
    return lines[0]


def _recorded_off(run: Path) -> list:
    return json.loads((run / TR.TRACKING_FILE).read_text())["off"]


def _steps(run: Path) -> list:
    rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [r["step"] for r in rows if r["split"] == "train"]


@needs_tb
def test_a_read_only_tensorboard_folder_is_one_warning_and_the_run_finishes(corpus, tmp_path):
    run = tmp_path / "run"
    (run / TR.TB_DIR).mkdir(parents=True)
    (run / TR.TB_DIR).chmod(0o555)
    c = cfg_for(corpus, tmp_path / "cache", "train.tracking=[tensorboard]")
    rc, err = _train_with_fault(c, run, "none" if _modes_bind() else "read-only")
    line = _the_one_line(err, f"warning: tracking: tensorboard failed on {run / TR.TB_DIR}/events.out.tfevents.",
                         "Permission denied (EACCES)", "training goes on without tensorboard",
                         f"recorded in {run / TR.TRACKING_FILE}", "train.tracking_required=true")
    assert rc == 0 and (run / "model.pt").is_file() and _steps(run) == [1, 2, 3, 4, 5, 6], line
    (off,) = _recorded_off(run)
    assert off["backend"] == "tensorboard" and off["errno"] == "EACCES" and off["step"] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tracking"] == {"trackers": ["tensorboard"], "off": [off]}


@needs_tb
def test_a_full_disk_under_tensorboards_writer_thread_is_one_warning_and_the_run_finishes(corpus, tmp_path):
    """The disk fills after the first steps' events: the writer thread's ENOSPC is one warning (no "Exception in
    thread" traceback), the run trains to the end, tracking.json and summary.json record where tracking stopped."""
    run = tmp_path / "run"
    c = cfg_for(corpus, tmp_path / "cache", "train.tracking=[tensorboard]")
    rc, err = _train_with_fault(c, run, "full", after=30)
    _the_one_line(err, f"warning: tracking: tensorboard failed on {run / TR.TB_DIR}: No space left on device (ENOSPC)",
                  "the disk is full", "training goes on without tensorboard from step ")
    assert rc == 0 and (run / "model.pt").is_file() and _steps(run) == [1, 2, 3, 4, 5, 6]
    (off,) = _recorded_off(run)
    assert off["backend"] == "tensorboard" and off["errno"] == "ENOSPC" and 1 <= off["step"] <= 6, off
    assert json.loads((run / "summary.json").read_text())["tracking"]["off"] == [off]
    logged = [s for series in tb_scalars(run / TR.TB_DIR).values() for s in series]
    assert max(logged) < 6  # written until the disk filled


@needs_tb
def test_a_failed_tracker_under_tracking_required_is_one_error_line_and_keeps_the_checkpoint(corpus, tmp_path):
    import mhar.training.train as T

    run = tmp_path / "run"
    c = cfg_for(corpus, tmp_path / "cache", "train.tracking=[tensorboard]", "train.tracking_required=true")
    rc, err = _train_with_fault(c, run, "full", after=30)
    _the_one_line(err, f"error: tracking: tensorboard failed on {run / TR.TB_DIR}: No space left on device (ENOSPC)",
                  "train.tracking_required=true stops the run", f"completed checkpoints in {run} are kept",
                  "run the same command again to resume")
    assert rc == 2 and not (run / "summary.json").exists()
    (off,) = _recorded_off(run)
    states = sorted(p.name for p in (run / "checkpoint").glob("state-*.pt"))
    assert states == [f"state-{off['step']:08d}.pt"] and _steps(run)[-1] == off["step"]  # the failing step's state
    summary = T.train(c, run)  # the disk has room again: the same run resumes there and finishes
    assert summary["steps"] == 6 and _steps(run) == [1, 2, 3, 4, 5, 6] and summary["tracking"]["off"] == [off]


# --- a damaged tracking.json on resume ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def stopped_run(corpus, tmp_path_factory):
    """A run checkpointed at step 3 of 6 (untracked: tracking is bookkeeping, a resume may turn it on)."""
    import mhar.training.train as T

    tmp = tmp_path_factory.mktemp("stopped")
    c = cfg_for(corpus, tmp / "cache")
    assert T.train(c, tmp / "run", stop_after=3) is None
    return c, tmp / "run"


_GOOD = {"name": "mhar/debug/seed0", "tensorboard": {"log_dir": "tensorboard"},
         "wandb": {"id": "0123abcd-4567ef01", "project": "mhar", "group": None, "name": "mhar/debug/seed0",
                   "dir": "wandb"}}


def _with(path: str, value):
    record = json.loads(json.dumps(_GOOD))
    *parents, leaf = path.split(".")
    d = record
    for p in parents:
        d = d[p]
    if value is KeyError:
        del d[leaf]
    else:
        d[leaf] = value
    return json.dumps(record)


@pytest.mark.parametrize("text, says", [
    ('{"name": "mhar/debug/seed0", "wandb": {"id": ', "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    (_with("name", 3), "'name' is missing or not a non-empty string"),
    (_with("wandb.id", KeyError), "'wandb.id' is missing"),
    (_with("wandb", "0123abcd"), "'wandb' must be an object, got str"),
    (_with("wandb.group", 7), "'wandb.group' must be a string or null, got int"),
    (_with("wandb.id", "my run/1"), "'wandb.id' 'my run/1' is not a W&B run id"),  # wandb.init: a pydantic error
    (_with("wandb.id", 12345678), "'wandb.id' '12345678' is not a W&B run id"),
    (_with("wandb.project", "team/mhar"), "'wandb.project': 'team/mhar' is not a W&B project name"),
    (_with("tensorboard", {"log_dir": None}), "'tensorboard' must be an object with a string 'log_dir'"),
])
@needs_both
def test_a_damaged_tracking_record_is_one_error_line_naming_it_before_anything_is_loaded(stopped_run, tmp_path,
                                                                                         monkeypatch, capsys, text,
                                                                                         says):
    import shutil

    import mhar.training.cli as CLI
    import mhar.training.train as T
    from mhar.safe_yaml import dump_yaml

    c, stopped = stopped_run
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    (run / TR.TRACKING_FILE).write_text(text)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    monkeypatch.setattr(T, "load_data", lambda *a, **k: pytest.fail("data loaded before tracking.json was checked"))
    config = tmp_path / "c.yaml"
    config.write_text(dump_yaml(c.to_dict()))
    capsys.readouterr()
    assert CLI.main([str(config), "train.tracking=[tensorboard,wandb]", "--out", str(run)]) == 2
    line = _the_one_line(capsys.readouterr().err, f"error: {run / TR.TRACKING_FILE} is damaged: {says}",
                         "move it away to start a new tracked run", "or fix it")
    assert len(line) < 600, line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"} == before


@needs_both
@pytest.mark.parametrize("case", ["project", "init"])
def test_wandb_that_cannot_open_is_one_warning_and_a_project_wandb_refuses_never_reaches_it(tmp_path, monkeypatch,
                                                                                          case):
    """$WANDB_PROJECT with a character W&B refuses: checked here, wandb.init (whose Settings would raise a raw
    pydantic error) is not called. wandb.init failing (not logged in): one warning, the tracker is off, recorded."""
    import threading

    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    if case == "project":
        monkeypatch.setenv("WANDB_PROJECT", "team/mhar")
        monkeypatch.setattr(wandb, "init", lambda *a, **k: pytest.fail("wandb.init called"))
        says = "wandb failed (%s): $WANDB_PROJECT: 'team/mhar' is not a W&B project name" % (tmp_path / "wandb")
    else:
        def not_logged_in(*a, **k):
            raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])\nmore")

        monkeypatch.setattr(wandb, "init", not_logged_in)
        says = "wandb.init failed (api_key not configured (no-tty). call wandb.login(key=[your_api_key])); log in"
    hook, warnings = threading.excepthook, []
    tr = TR.open_trackers(cfg("train.tracking=[tensorboard,wandb]"), tmp_path, ["tensorboard", "wandb"],
                          warn=warnings.append)
    tr.log(1, {"train/loss": 2.0})
    tr.close()
    (line,) = warnings
    assert line.startswith("warning: tracking: ") and says in line and "training goes on without wandb" in line
    assert "\n" not in line and threading.excepthook is hook  # the thread hook is gone with the trackers
    (off,) = _recorded_off(tmp_path)
    assert off["backend"] == "wandb" and off["errno"] is None and off["step"] == 0
    assert tb_scalars(tmp_path / TR.TB_DIR) == {"train/loss": {1: 2.0}}  # the other tracker went on


@needs_both
def test_a_required_tracker_that_cannot_open_stops_before_training_with_one_error_line(stopped_run, tmp_path,
                                                                                       monkeypatch, capsys):
    """train.tracking_required with wandb.init failing on a resume: one error line, exit 2, nothing trained, the
    checkpoint as it was; the failure recorded in tracking.json."""
    import shutil

    import wandb

    import mhar.training.cli as CLI
    from mhar.safe_yaml import dump_yaml

    def not_logged_in(*a, **k):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", not_logged_in)
    c, stopped = stopped_run
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    states = {p.name: p.read_bytes() for p in (run / "checkpoint").iterdir()}
    config = tmp_path / "c.yaml"
    config.write_text(dump_yaml(c.to_dict()))
    capsys.readouterr()
    assert CLI.main([str(config), "train.tracking=wandb", "train.tracking_required=true", "--out", str(run)]) == 2
    _the_one_line(capsys.readouterr().err, f"error: tracking: wandb failed ({run / 'wandb'}): wandb.init failed "
                  "(api_key not configured (no-tty)); log in", "train.tracking_required=true stops the run")
    assert {p.name: p.read_bytes() for p in (run / "checkpoint").iterdir()} == states
    assert _steps(run) == [1, 2, 3] and not (run / "summary.json").exists()
    assert [(o["backend"], o["step"]) for o in _recorded_off(run)] == [("wandb", 3)]
