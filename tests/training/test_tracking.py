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
