"""Integrity of records a user may download or share: checksummed, atomically written, never unpickled,
and evaluation results that name the exact weights (issue 15)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from mhar.checkpoint import (CheckpointError, atomic_torch_save, clean_stale_temps, load_model, read_checkpoint,
                             save_model, sha256_path, verify_sha256)
from mhar.config import model_config
from mhar.model import Transformer
from mhar.runconfig import load_run_config, run_identity

DATA_DIR = os.environ.get("MHAR_DATA_DIR")


def _export(path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = Transformer(model_config("debug", max_seq_len=64))
    run = run_identity(load_run_config(None, ["model.preset=debug", "meta.name=tiny"]))
    return save_model(path, model, "byte", {"run": run})


def test_export_is_byte_identical_checksummed_and_tamper_evident(tmp_path):
    a, b = _export(tmp_path / "a" / "model.pt"), _export(tmp_path / "b" / "model.pt")
    assert a.read_bytes() == b.read_bytes()  # no random temp-file name inside the archive
    digest = hashlib.sha256(a.read_bytes()).hexdigest()
    assert sha256_path(a).read_text() == f"{digest}  model.pt\n"  # sha256sum -c format
    assert verify_sha256(a) == digest and read_checkpoint(a)["extra"]["run"]["label"] == "tiny"
    raw = bytearray(a.read_bytes())
    raw[len(raw) // 3] ^= 0x40
    a.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="fails its sha256 check") as e:
        load_model(a)
    assert "\n" not in str(e.value)
    sha256_path(b).unlink()  # exports from before checksums load; a required checksum must exist
    assert verify_sha256(b, required=False) == digest
    with pytest.raises(CheckpointError, match="no checksum file"):
        verify_sha256(b)


def test_write_killed_between_file_and_checksum_is_completed(tmp_path):
    path = tmp_path / "state.pt"
    atomic_torch_save({"x": torch.zeros(2)}, path)
    old_side = sha256_path(path).read_text()
    atomic_torch_save({"x": torch.ones(2)}, path)
    new_side = sha256_path(path).read_text()
    # as if killed after renaming the file but before renaming its new checksum into place
    sha256_path(path).write_text(old_side)
    pending = tmp_path / ".state.pt.sha256.999999999.tmp"
    pending.write_text(new_side)
    (tmp_path / ".other.json.999999999.tmp").write_text("{")
    clean_stale_temps(tmp_path)
    assert sha256_path(path).read_text() == new_side and sorted(p.name for p in tmp_path.iterdir()) == [
        "state.pt", "state.pt.sha256"]


@pytest.mark.skipif(not DATA_DIR or not Path(DATA_DIR, "lambada_openai").is_dir(),
                    reason="needs MHAR_DATA_DIR with lambada_openai")
def test_eval_checks_every_task_first_and_records_the_weights(tmp_path, capsys):
    from eval.run import main

    model = _export(tmp_path / "run" / "model.pt")
    out = tmp_path / "eval"
    base = ["--model", str(model), "--out", str(out), "--subset", "first:2", "--device", "cpu",
            "--bootstrap-iters", "0", "--data-dir", DATA_DIR]
    assert main(base + ["--tasks", "lambada_openai,bogus_task"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'bogus_task'" in err and err.count("\n") == 1
    assert not out.exists()  # the good task ran nothing and wrote nothing
    assert main(base + ["--tasks", "lambada_openai"]) == 0
    res = json.loads((out / "lambada_openai" / "results.json").read_text())
    assert res["weights_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert res["run"] == read_checkpoint(model)["extra"]["run"] and res["run"]["label"] == "tiny"
