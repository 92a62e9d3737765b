"""Integrity of records a user may download or share: checksummed, atomically written, never unpickled,
and evaluation results that name the exact weights (issue 15)."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import torch

from mhar.atomic import clean_stale_temps, sha256_path
from mhar.runs.checkpoint import (CheckpointError, atomic_torch_save, load_model, non_finite_tensor, read_checkpoint,
                                  save_model, verify_sha256)
from mhar.model.config import model_config
from mhar.model.residuals import display_record
from mhar.model.transformer import Transformer
from mhar.runs.config import load_run_config, run_identity
from mhar.safe_yaml import dump_yaml

DATA_DIR = os.environ.get("MHAR_DATA_DIR")


def _export(path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = Transformer(model_config("debug", max_seq_len=64))
    run = run_identity(load_run_config(None, ["model.preset=debug", "meta.name=tiny"]))
    return save_model(path, model, "byte", {"run": run, "display": display_record("baseline")})  # as mhar.train


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
    assert res["display"] == read_checkpoint(model)["extra"]["display"]  # the tables' name of the variant
    from analysis.load.runs import identify_eval  # the analysis identifies the evaluation from the record alone

    assert identify_eval(out)["label"] == "tiny"


def test_an_imported_model_without_a_display_record_gets_its_variants():
    """A model whose export carries no display record (an imported released checkpoint: import-hf writes the run
    block only) is evaluated with the registry's display record of the variant it was built as."""
    from types import SimpleNamespace

    from eval.run import model_identity
    from mhar.model.residuals import display_record

    run = {"label": "rel", "residual": {"variant": "attnres", "heads": 1}, "size": "0.6B", "seed": 0,
           "pairing": "released-g", "identity": "released:x", "released": "x"}
    got = model_identity("m.pt", SimpleNamespace(blob={"extra": {"run": run}}), sha="ab")
    assert got == {"run": run, "weights_sha256": "ab", "display": display_record("attnres")}
    assert model_identity("hf:org/m", None) == {"run": None, "weights_sha256": None}


# --- issue 44: a model without its checksum is never loaded, anywhere -----------------------------------
def _one_error_line(err: str, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]  # (lm-eval's progress bars go to stderr too)
    errors = [ln for ln in lines if ln.startswith("error")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err
    for n in needles:
        assert n in errors[0], (n, errors[0])


def _bare_model(tmp_path: Path, variant: str = "mhar") -> Path:
    """An export whose .sha256 was deleted (as the README says: such a file is never loaded)."""
    torch.manual_seed(0)
    cfg = model_config("debug", max_seq_len=64)
    cfg = type(cfg)(**{**cfg.__dict__, "residual": type(cfg.residual)(**{**cfg.residual.__dict__,
                                                                        "variant": variant, "heads": 2,
                                                                        "routing_impl": "eager"})})
    path = save_model(tmp_path / "bare" / "model.pt", Transformer(cfg), "byte")
    sha256_path(path).unlink()
    return path


def test_cpt_cli_names_a_full_disk_and_what_to_do(tmp_path, capsys, monkeypatch):
    """`python -m mhar.cpt export-hf` onto a full disk: the one line says which file, ENOSPC and what to do (an
    OSError was caught with the tool's own errors and printed bare)."""
    import errno

    import mhar.cpt.cli as C

    def full(model, out):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "hf" / "model.safetensors"))

    monkeypatch.setattr(C, "export_hf", full)
    assert C.main(["export-hf", "--model", "m.pt", "--out", str(tmp_path / "hf")]) == 2
    _one_error_line(capsys.readouterr().err, "export-hf failed on", "model.safetensors", "(ENOSPC)",
                    "the disk is full")


def test_model_without_checksum_is_refused_by_every_loader(tmp_path, capsys, monkeypatch):
    import mhar.training.cli as CLI
    from eval import probe
    from mhar.cpt.cli import main as cpt_main

    model = _bare_model(tmp_path)
    capsys.readouterr()
    # probe, cpt export-hf, the Python loader
    assert probe.main(["--model", str(model), "--out", str(tmp_path / "probe.json"), "--seq-len", "16"]) == 2
    _one_error_line(capsys.readouterr().err, "no checksum file")
    assert cpt_main(["export-hf", "--model", str(model), "--out", str(tmp_path / "hf")]) == 2
    _one_error_line(capsys.readouterr().err, "no checksum file")
    with pytest.raises(CheckpointError, match="no checksum file"):
        load_model(model)
    assert not any((tmp_path / n).exists() for n in ("fig.png", "probe.json", "hf"))
    # train.init_from (continued pretraining) checks the checksum before loading the weights
    cfg = tmp_path / "c.yaml"
    base = load_run_config(None, ["model.preset=debug", "model.residual.variant=mhar", "model.residual.heads=2",
                                  "data.corpus=synthetic:5000", "data.seq_len=32", "train.steps=1",
                                  "train.global_batch=2", "train.micro_batch=2", "train.device=cpu",
                                  f"data.cache_dir={tmp_path / 'cache'}", f"train.init_from={model}"])
    cfg.write_text(dump_yaml(base.to_dict()))
    assert CLI.main([str(cfg), "--out", str(tmp_path / "run")]) == 2
    _one_error_line(capsys.readouterr().err, "train.init_from", "no checksum file")


# --- evaluation: results keyed by weights, checks before the long work ----------------------------------
def _tiny_data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "lambada_openai").mkdir(parents=True)
    lines = ["the cat sat on the mat", "a dog ran in the park", "one more line of text"]
    (data / "lambada_openai" / "lambada_test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                                        for t in lines))
    return data


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (lm-eval's own files under lm_eval/ too): relative path -> bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _eval_args(model: Path, out: Path, data: Path) -> list[str]:
    return ["--model", str(model), "--tasks", "lambada_openai", "--out", str(out), "--limit", "2", "--device", "cpu",
            "--bootstrap-iters", "0", "--data-dir", str(data)]


def test_retrained_model_at_the_same_path_never_overwrites_its_results(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    from eval.run import main

    data = _tiny_data(tmp_path)
    model, out = _export(tmp_path / "run" / "model.pt", seed=0), tmp_path / "eval"
    assert main(_eval_args(model, out, data)) == 0
    res = out / "lambada_openai" / "results.json"
    before = _files(res.parent)
    copy = tmp_path / "copy" / "model.pt"  # the same weights elsewhere are the same model: redone, allowed
    copy.parent.mkdir()
    copy.write_bytes(model.read_bytes())
    sha256_path(copy).write_bytes(sha256_path(model).read_bytes())
    assert main(_eval_args(copy, out, data)) == 0
    assert json.loads(res.read_text())["weights_sha256"] == json.loads(before["results.json"])["weights_sha256"]
    # the redone record's lm-eval files replace the earlier ones (which sat in another model folder)
    assert sorted(k for k in _files(res.parent) if k.startswith("lm_eval/")) == \
        sorted(json.loads(res.read_text())["lm_eval_files"].values())
    assert main(_eval_args(model, out, data)) == 0  # and back
    _export(tmp_path / "run" / "model.pt", seed=1)  # retrained into the same path
    before = _files(res.parent)
    capsys.readouterr()
    assert main(_eval_args(model, out, data)) == 2
    _one_error_line(capsys.readouterr().err, "with other weights", "retrained", "another --out")
    assert _files(res.parent) == before  # results.json, samples.jsonl and lm-eval's own files


def test_vocabulary_smaller_than_the_tokenizer_is_refused_before_evaluating(tmp_path, capsys, monkeypatch):
    pytest.importorskip("lm_eval")
    import lm_eval.evaluator
    from eval.run import main

    model = save_model(tmp_path / "small" / "model.pt", Transformer(model_config("debug", vocab_size=200,
                                                                                  max_seq_len=64)), "byte")
    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", lambda *a, **k: pytest.fail("evaluation started"))
    assert main(_eval_args(model, tmp_path / "eval", _tiny_data(tmp_path))) == 2
    _one_error_line(capsys.readouterr().err, "vocabulary (200 ids) is smaller than its tokenizer's (byte: 257 ids)")
    assert not (tmp_path / "eval").exists()


def test_vocabulary_smaller_than_the_tokenizer_is_refused_by_the_lm_eval_adapter(tmp_path, capsys, monkeypatch):
    """``mhar-lm-eval --model mhar`` (and ``MharLM`` in Python, in-memory models too): the same check as
    eval.run, before any request is scored, one error line naming the model and both sizes."""
    pytest.importorskip("lm_eval")
    from eval.adapter import MharLM
    from eval.lm_eval_cli import main
    from mhar.data.tokenizer import get_tokenizer

    small = Transformer(model_config("debug", vocab_size=200, max_seq_len=64))
    model = save_model(tmp_path / "small" / "model.pt", small, "byte")
    monkeypatch.setattr(MharLM, "_loglikelihood_tokens", lambda *a, **k: pytest.fail("evaluation started"))
    monkeypatch.setenv("MHAR_DATA_DIR", str(_tiny_data(tmp_path)))
    out = tmp_path / "lm_eval_out"
    assert main(["--model", "mhar", "--model_args", f"pretrained={model}", "--tasks", "lambada_openai",
                 "--limit", "2", "--device", "cpu", "--output_path", str(out), "--log_samples"]) == 2
    _one_error_line(capsys.readouterr().err, f"error: MharLM: pretrained={model}: ",
                    "vocabulary (200 ids) is smaller than its tokenizer's (byte: 257 ids)", "re-export")
    assert not out.exists()
    with pytest.raises(ValueError, match=r"MharLM: model=Transformer: the model's vocabulary \(200 ids\)"):
        MharLM.from_model(small, get_tokenizer("byte"), device="cpu")


def _refusing_writes(monkeypatch, under: Path, code: int, only: str = ""):
    """Writes through mhar.atomic (every record and the writability probe) under ``under`` fail with ``code``:
    a read-only or full file system, simulated (root ignores file modes)."""
    import builtins

    import mhar.atomic as A

    def fake_open(path, mode="r", *a, **k):
        p = Path(path)
        if "w" in mode and under in p.parents and only in p.name:
            raise OSError(code, os.strerror(code), str(p))
        return builtins.open(path, mode, *a, **k)

    monkeypatch.setattr(A, "open", fake_open, raising=False)


def test_read_only_eval_output_is_found_before_evaluating(tmp_path, capsys, monkeypatch):
    pytest.importorskip("lm_eval")
    import errno

    import lm_eval.evaluator
    from eval.run import main

    model, out = _export(tmp_path / "run" / "model.pt"), tmp_path / "eval"
    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", lambda *a, **k: pytest.fail("evaluation started"))
    _refusing_writes(monkeypatch, out, errno.EROFS)
    assert main(_eval_args(model, out, _tiny_data(tmp_path))) == 2
    _one_error_line(capsys.readouterr().err, "Read-only file system (EROFS)", "choose a writable location")
    assert not out.exists()  # nothing left behind


def test_disk_full_while_writing_evaluation_results_keeps_the_old_ones(tmp_path, capsys, monkeypatch):
    pytest.importorskip("lm_eval")
    import errno

    from eval.run import main

    data = _tiny_data(tmp_path)
    model, out = _export(tmp_path / "run" / "model.pt"), tmp_path / "eval"
    assert main(_eval_args(model, out, data)) == 0
    before = _files(out / "lambada_openai")
    _refusing_writes(monkeypatch, out, errno.ENOSPC, only="results.json")
    capsys.readouterr()
    assert main(_eval_args(model, out, data)) == 2  # the same model again: redone, then the disk is full
    _one_error_line(capsys.readouterr().err, "No space left on device (ENOSPC)", "the disk is full")
    # the old record and the lm-eval files it names are all still there (samples.jsonl: rewritten, the same docs)
    after = _files(out / "lambada_openai")
    assert {k: v for k, v in after.items() if k != "samples.jsonl"} == \
        {k: v for k, v in before.items() if k != "samples.jsonl"}
    rec = json.loads(after["results.json"])
    assert all(v.startswith("lm_eval/") and v in after for v in rec["lm_eval_files"].values()), rec["lm_eval_files"]
    assert not list((out / "lambada_openai").glob(".*.tmp"))


def test_non_finite_weights_are_refused_by_every_evaluation_loader(tmp_path, capsys, monkeypatch):
    """A model.pt with a NaN (a diverged run) or an inf: eval.run, the lm-eval adapter and load_model refuse it
    naming the tensor, before any request is scored; nothing is written."""
    pytest.importorskip("lm_eval")
    import lm_eval.evaluator
    from eval.adapter import MharLM
    from eval.lm_eval_cli import main as lm_eval_main
    from eval.run import main

    torch.manual_seed(0)
    model = Transformer(model_config("debug", max_seq_len=64))
    with torch.no_grad():
        model.layers[1].attn.q_proj.weight[3, 5] = float("nan")
        model.final_norm.weight[0] = float("inf")
    path = save_model(tmp_path / "run" / "model.pt", model, "byte")
    numel = model.layers[1].attn.q_proj.weight.numel()
    want = f"tensor layers.1.attn.q_proj.weight (1 NaN, 0 inf of {numel} values) is not finite"
    with pytest.raises(CheckpointError, match=re.escape(want)):
        load_model(path)
    # finite weights whose sum overflows (the check's fast path) are finite; a +inf and a -inf are not
    assert non_finite_tensor({"w": torch.full((4,), 3e38), "h": torch.full((9,), 6e4, dtype=torch.float16)}) is None
    assert non_finite_tensor({"w": torch.tensor([1.0, float("inf"), float("-inf")])}) == "w (0 NaN, 2 inf of 3 values)"
    data = _tiny_data(tmp_path)
    monkeypatch.setattr(MharLM, "_loglikelihood_tokens", lambda *a, **k: pytest.fail("evaluation started"))
    monkeypatch.setenv("MHAR_DATA_DIR", str(data))
    capsys.readouterr()
    assert lm_eval_main(["--model", "mhar", "--model_args", f"pretrained={path}", "--tasks", "lambada_openai",
                         "--limit", "2", "--device", "cpu", "--output_path", str(tmp_path / "lm_eval_out")]) == 2
    _one_error_line(capsys.readouterr().err, want)
    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", lambda *a, **k: pytest.fail("evaluation started"))
    assert main(_eval_args(path, tmp_path / "eval", data)) == 2
    _one_error_line(capsys.readouterr().err, want, "retrain the run")
    assert not (tmp_path / "eval").exists() and not (tmp_path / "lm_eval_out").exists()
