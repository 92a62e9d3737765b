"""Training loop: determinism, paired batches, exact resume, guards, and learning on real text (multi-process: test_distributed.py)."""
from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import mhar.training.step as S
import mhar.training.cli as CLI
import mhar.training.train as T
from mhar.training.optim import lr_at
from mhar.training.step import flops_per_token
from mhar.runs.checkpoint import CheckpointError, load_model
from mhar.model.config import config_hash
from mhar.data.batches import unigram_entropy
from mhar.runs.config import identity_hash, load_run_config, pairing_hash, run_identity
from mhar.safe_yaml import dump_yaml
from mhar.runs.run_dir import RunFolder


def _text_corpus(path: Path, n_words: int = 30000) -> Path:
    """Deterministic pseudo-English: Zipf-distributed words from a fixed list, lines of 12 words."""
    words = ("the of and to in a is that for it as was with be by on not he this are or his from at which "
             "but have an they you were her she there been one all we their has would when if so no will "
             "out more up into do any your what some can only other new could time these two may then first").split()
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, len(words) + 1)
    idx = rng.choice(len(words), size=n_words, p=p / p.sum())
    lines = [" ".join(words[i] for i in idx[j:j + 12]) for j in range(0, n_words, 12)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _text_corpus(tmp_path_factory.mktemp("corpus") / "words.txt")


def cfg_for(corpus: Path, cache: Path, *overrides: str):
    base = [
        "model.preset=debug", f"data.corpus={corpus}", f"data.cache_dir={cache}", "data.seq_len=32",
        "data.val_tokens=256", "train.steps=6", "train.global_batch=4", "train.micro_batch=2",
        "train.warmup_steps=2", "train.eval_every=2", "train.tail_k=2", "train.checkpoint_every=3",
        "train.log_every=2", "train.threads=1", "train.lr=3e-3", "train.device=cpu",
    ]
    return load_run_config(None, base + list(overrides))


def read_metrics(run: Path, drop=("wall_s", "step_ms", "tok_s", "mfu")) -> list[dict]:  # timings vary
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


# --- schedule and FLOPs --------------------------------------------------------------------------------
def test_lr_schedule_warmup_then_cosine_to_min(corpus, tmp_path):
    cfg = cfg_for(corpus, tmp_path, "train.steps=101", "train.warmup_steps=10", "train.lr=1.0", "train.min_lr_ratio=0.1")
    lrs = np.array([lr_at(s, cfg) for s in range(101)])
    np.testing.assert_allclose(lrs[:10], np.arange(1, 11) / 10)  # linear warmup reaching the peak
    assert lrs[100] == pytest.approx(0.1)  # last update at min_lr_ratio * peak
    assert lrs[55] == pytest.approx(0.55)  # cosine midpoint: (1 + 0.1) / 2
    assert np.all(np.diff(lrs[9:]) <= 1e-12)


def test_flops_per_token_matches_linear_layer_count():
    from mhar.model.config import model_config
    from mhar.model.transformer import Transformer

    m = Transformer(model_config("debug", residual={"variant": "mhar", "heads": 4}))
    lin = sum(mod.weight.numel() for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    c, T_ = m.cfg, 64
    expect = 6 * lin + 12 * c.n_layers * c.n_heads * c.resolved_head_dim * T_
    mat = {id(mod.weight) for mod in m.modules() if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding))}
    other = sum(p.numel() for p in m.parameters() if id(p) not in mat)  # norms, routing queries/key norms
    assert other > 0
    assert abs(flops_per_token(m, T_) - expect) <= 6 * other


# --- determinism and pairing ---------------------------------------------------------------------------
def test_same_seed_gives_identical_metrics_and_files(corpus, tmp_path):
    cfg = cfg_for(corpus, tmp_path / "cache")
    s1 = T.train(cfg, tmp_path / "a")
    s2 = T.train(cfg, tmp_path / "b")
    m1, m2 = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert m1 == m2 and len([r for r in m1 if r["split"] == "train"]) == 6
    assert [r["step"] for r in m1 if r["split"] == "val"] == [2, 4, 6]
    assert s1["tail_mean_val_loss"] == pytest.approx(np.mean([v for _, v in s1["val_losses"][-2:]]))
    assert s1["tail_mean_val_loss"] == s2["tail_mean_val_loss"]
    # summary / provenance / exported model match the documented run-directory contract
    for key in ("variant", "size", "seed", "identity", "steps", "tokens", "tail_mean_val_loss", "tail_k",
                "final_val_loss", "val_losses", "wall_s", "flops", "params", "tokens_per_s", "peak_mem_gb"):
        assert key in s1
    assert s1["tokens"] == 6 * 4 * 32 and m1[-1]["flops"] == s1["flops"]
    assert s1["variant"] == "baseline" and s1["display"] == {"display": "baseline", "order": 0, "shows_heads": False}
    prov = json.loads((tmp_path / "a" / "provenance.json").read_text())
    assert prov["config"]["train"]["lr"] == 3e-3 and prov["git"]["commit"] and prov["end_time"]
    model, _, blob = load_model(tmp_path / "a" / "model.pt")
    assert model.num_params() == s1["params"]
    # identical runs export byte-identical models (sha256 beside them) and carry the run identity
    a, b = (tmp_path / d / "model.pt" for d in "ab")
    assert a.read_bytes() == b.read_bytes()
    assert (tmp_path / "a" / "model.pt.sha256").read_text().split()[0] == hashlib.sha256(a.read_bytes()).hexdigest()
    assert s1["run"] == blob["extra"]["run"] == prov["run"] == run_identity(cfg)
    assert blob["extra"]["display"] == s1["display"]  # what an evaluation of it records (eval.run.model_identity)
    assert s1["run"]["identity"] == identity_hash(cfg) == s1["identity"] == prov["identity"]
    assert s1["run"]["pairing"] == pairing_hash(cfg) == prov["pairing"] and "config_hash" not in s1
    # provenance.json's config_hash is the hash of the config it records (its one meaning everywhere)
    assert prov["config_hash"] == config_hash(prov["config"]) and "run_hash" not in prov
    # a different seed changes the run
    T.train(cfg_for(corpus, tmp_path / "cache", "train.seed=1"), tmp_path / "c")
    assert read_metrics(tmp_path / "c") != m1


def test_variants_with_same_seed_see_byte_identical_batches(corpus, tmp_path, monkeypatch):
    seen: list[bytes] = []
    orig = S.micro_forward

    def spy(model, x, y, autocast, z_weight=0.0):
        if model.training:
            seen.append(x.numpy().tobytes() + y.numpy().tobytes())
        return orig(model, x, y, autocast, z_weight)

    monkeypatch.setattr(S, "micro_forward", spy)
    runs = {}
    for name, over in [("baseline", ["model.residual.variant=baseline"]),
                       ("mhar", ["model.residual.variant=mhar", "model.residual.heads=4"]),
                       ("seed1", ["model.residual.variant=baseline", "train.seed=1"])]:
        seen.clear()
        T.train(cfg_for(corpus, tmp_path / "cache", "train.steps=4", *over), tmp_path / name)
        runs[name] = list(seen)
    assert len(runs["baseline"]) == 4 * 2  # 4 steps x 2 micro-batches
    assert runs["baseline"] == runs["mhar"]
    assert runs["baseline"] != runs["seed1"]
    assert read_metrics(tmp_path / "baseline") != read_metrics(tmp_path / "mhar")  # the models do differ


# --- resume --------------------------------------------------------------------------------------------
def _state_dict(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def test_resume_after_crash_is_bitwise_identical(corpus, tmp_path, monkeypatch):
    cfg = cfg_for(corpus, tmp_path / "cache", "model.residual.variant=mhar", "model.residual.heads=2",
                  "train.steps=8")
    T.train(cfg, tmp_path / "ref")

    # crash inside step 6: the checkpoint is at step 3, metrics.jsonl already holds steps 4-5
    calls = {"n": 0}
    orig = S.micro_forward

    def crashing(model, x, y, autocast, z_weight=0.0):
        if model.training:
            calls["n"] += 1
            if calls["n"] == 5 * 2 + 1:
                raise RuntimeError("simulated kill")
        return orig(model, x, y, autocast, z_weight)

    monkeypatch.setattr(S, "micro_forward", crashing)
    with pytest.raises(RuntimeError, match="simulated kill"):
        T.train(cfg, tmp_path / "crash")
    assert max(r["step"] for r in read_metrics(tmp_path / "crash")) == 5
    monkeypatch.setattr(S, "micro_forward", orig)
    T.train(cfg, tmp_path / "crash")  # resumes from step 3

    assert read_metrics(tmp_path / "crash") == read_metrics(tmp_path / "ref")
    a, b = _state_dict(tmp_path / "ref" / "model.pt"), _state_dict(tmp_path / "crash" / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # stop-after (a clean kill between steps) resumes exactly too
    assert T.train(cfg, tmp_path / "stop", stop_after=4) is None
    (tmp_path / "stop" / "metrics.jsonl").unlink()  # Snakemake deletes a job's declared outputs before a rerun
    T.train(cfg, tmp_path / "stop")
    assert read_metrics(tmp_path / "stop") == read_metrics(tmp_path / "ref")


def test_a_run_resumes_under_other_execution_choices(corpus, tmp_path):
    """routing_impl, compile, device and micro_batch are execution, not identity: a run started fused with compile
    on a GPU (its config.yaml says so) resumes eager on this CPU with another micro-batch and ends where the
    uninterrupted run ends; a checkpoint of another identity is refused; a changed data seed is another run and is
    refused. (Checkpoints that record the identity of earlier versions: tests/scripts/test_migrate_run_layout.py.)"""
    from mhar.runs.checkpoint import atomic_torch_save, safe_torch_load
    from mhar.safe_yaml import yaml_load

    cfg = cfg_for(corpus, tmp_path / "cache", "model.residual.variant=mhar", "model.residual.heads=2", "train.steps=4")
    ref = T.train(cfg, tmp_path / "ref")
    run = tmp_path / "run"
    T.train(cfg, run, stop_after=2)
    rec = yaml_load((run / "config.yaml").read_text())
    rec["model"]["residual"]["routing_impl"], rec["train"]["compile"], rec["train"]["device"] = "fused", True, "cuda"
    (run / "config.yaml").write_text(dump_yaml(rec))
    blob = safe_torch_load(run / "checkpoint" / "state-00000002.pt")
    again = cfg_for(corpus, tmp_path / "cache", "model.residual.variant=mhar", "model.residual.heads=2",
                    "train.steps=4", "train.micro_batch=1", "train.compile=false")
    out = T.train(again, run)
    assert out["steps"] == 4 and out["identity"] == ref["identity"] == identity_hash(cfg)
    assert out["tail_mean_val_loss"] == pytest.approx(ref["tail_mean_val_loss"], rel=1e-5)
    assert out["display"] == ref["display"] == {"display": "MHAR", "order": 4, "shows_heads": True}
    blob["identity"] = "0" * 16  # a checkpoint of another config: refused
    T.train(cfg, tmp_path / "run2", stop_after=2)
    (tmp_path / "run2" / "checkpoint" / "state-00000002.pt").unlink()
    atomic_torch_save(blob, tmp_path / "run2" / "checkpoint" / "state-00000002.pt")
    with pytest.raises(CheckpointError, match="written by a different config"):
        T.train(cfg, tmp_path / "run2")
    with pytest.raises(T.RunDirError, match="data.seed"):
        T.train(cfg_for(corpus, tmp_path / "cache", "model.residual.variant=mhar", "model.residual.heads=2",
                        "train.steps=4", "data.seed=5"), run)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(corpus, tmp_path, monkeypatch):
    cfg = cfg_for(corpus, tmp_path / "cache", "train.checkpoint_every=2")
    orig, calls = S.micro_forward, {"n": 0}

    def poisoned(model, x, y, autocast, z_weight=0.0):
        loss, obj = orig(model, x, y, autocast, z_weight)
        if model.training:
            calls["n"] += 1
            if calls["n"] > 4 * 2:  # step 5 onwards
                return loss * float("nan"), obj
        return loss, obj

    monkeypatch.setattr(S, "micro_forward", poisoned)
    with pytest.raises(T.TrainingDiverged, match=r"step 5.*checkpoint \(step 4\)"):
        T.train(cfg, tmp_path / "run")
    state = torch.load(tmp_path / "run" / "checkpoint" / "state-00000004.pt", weights_only=False)
    assert state["progress"]["step"] == 4
    assert all(math.isfinite(p.abs().sum().item()) for p in state["model"].values())
    assert not (tmp_path / "run" / "summary.json").exists()
    rec = json.loads((tmp_path / "run" / "diverged.json").read_text())  # survives the job log
    assert rec["step"] == 5 and rec["loss"] == "nan" and rec["last_checkpoint_step"] == 4


# --- run-directory guards ------------------------------------------------------------------------------
def _snapshot(d: Path) -> dict:
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_run_dir_guards(corpus, tmp_path):
    cfg = cfg_for(corpus, tmp_path / "cache", "train.steps=2")
    run = tmp_path / "run"
    summary = T.train(cfg, run)
    before = _snapshot(run)
    # same config: finished run is returned, nothing rewritten
    assert T.train(cfg, run) == summary and _snapshot(run) == before
    # different config: refused, nothing overwritten
    with pytest.raises(T.RunDirError, match="different config.*train.lr"):
        T.train(cfg_for(corpus, tmp_path / "cache", "train.steps=2", "train.lr=1e-3"), run)
    assert _snapshot(run) == before
    # corrupt checkpoint of an unfinished run: clear error, files untouched
    (run / "summary.json").unlink()
    (run / "checkpoint" / "state-00000002.pt").write_bytes(b"not a checkpoint")
    before = _snapshot(run)
    with pytest.raises(CheckpointError, match="corrupt"):
        T.train(cfg, run)
    assert _snapshot(run) == before


def test_cli_errors_are_clear(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MHAR_DATA_DIR", raising=False)
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(f"model: {{preset: debug}}\ndata: {{corpus: {corpus}, cache_dir: {tmp_path}}}\n")
    assert CLI.main([str(cfg_file), "train.lrr=1", "--out", str(tmp_path / "r")]) == 2
    assert "train.lrr" in capsys.readouterr().err
    assert CLI.main([str(cfg_file), "data.corpus=tinyshakespeare", "--out", str(tmp_path / "r")]) == 2
    assert "MHAR_DATA_DIR" in capsys.readouterr().err
    assert CLI.main([str(cfg_file), f"data.corpus={tmp_path}/missing.txt", "--out", str(tmp_path / "r")]) == 2
    assert "missing.txt" in capsys.readouterr().err
    assert CLI.main([str(cfg_file), "data.tokenizer=no/such/tokenizer.json", "--out", str(tmp_path / "r")]) == 2
    assert "unknown tokenizer" in capsys.readouterr().err
    for var, bad in (("MHAR_ROUTING_AUTOTUNE", "fast"), ("MHAR_ROUTING_PDL", "yes")):
        monkeypatch.setenv(var, bad)
        assert CLI.main([str(cfg_file), "--out", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {var}={bad!r}: set it to one of") and err.count("\n") == 1, err
        monkeypatch.delenv(var)
    assert not (tmp_path / "r").exists()  # a run that failed before writing anything leaves no directory
    assert CLI.main([str(cfg_file), "--print-config", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "# identity: " in out and "# pairing: " in out and "run_hash" not in out


# DDP and FSDP2 on 2 processes (vs 1 process with accumulation, batch hashes, resume): tests/training/test_distributed.py


# --- learning on real English ---------------------------------------------------------------------------
@pytest.mark.slow
def test_tiny_preset_learns_real_english_below_unigram_entropy(tmp_path):
    data_dir = os.environ.get("MHAR_DATA_DIR")
    if not data_dir or not (Path(data_dir) / "tinyshakespeare" / "input.txt").is_file():
        pytest.skip("needs MHAR_DATA_DIR with tinyshakespeare/input.txt")
    cfg = load_run_config(None, [
        "model.preset=tiny", "model.residual.variant=mhar", "model.residual.heads=4",
        "data.corpus=tinyshakespeare", f"data.cache_dir={tmp_path}", "data.seq_len=64", "data.val_tokens=2048",
        "train.steps=40", "train.global_batch=16", "train.micro_batch=16", "train.lr=3e-3", "train.warmup_steps=8",
        "train.eval_every=20", "train.tail_k=2", "train.checkpoint_every=1000", "train.threads=1",
    ])
    raw = (Path(data_dir) / "tinyshakespeare" / "input.txt").read_bytes()
    h_unigram = unigram_entropy(np.frombuffer(raw, dtype=np.uint8))  # nats per byte
    summary = T.train(cfg, tmp_path / "run")
    assert 3.0 < h_unigram < 3.5
    assert summary["final_val_loss"] < 0.85 * h_unigram, (summary["final_val_loss"], h_unigram)


# --- integrity: safe resume, atomic records, lock, divergence record -----------------------------------
class _Payload:
    """Unpickling this creates a file: proof that a load executed code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("checksum, refusal", [("stale", "fails its sha256 check"), ("none", "no checksum file"),
                                               ("forged", "weights-only unpickler refused it: Unsupported global")])
def test_planted_pickle_checkpoint_is_refused_and_runs_nothing(corpus, tmp_path, capsys, checksum, refusal):
    from mhar.runs.checkpoint import write_sha256

    cfg_file = tmp_path / "c.yaml"
    run = tmp_path / "run"
    args = [str(cfg_file), "--out", str(run)]
    cfg_file.write_text(dump_yaml(cfg_for(corpus, tmp_path / "cache").to_dict()))
    assert CLI.main(args + ["--stop-after", "3"]) == 0
    marker = tmp_path / "pwned"
    state = run / "checkpoint" / "state-00000003.pt"
    torch.save({"format": T.STATE_FORMAT, "progress": _Payload(marker)}, state)
    if checksum == "none":
        (run / "checkpoint" / "state-00000003.pt.sha256").unlink()
    elif checksum == "forged":  # whoever plants a file can plant its checksum too: weights_only refuses it
        write_sha256(state)
    before = _snapshot(run)
    capsys.readouterr()
    assert CLI.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: training checkpoint") and err.count("\n") == 1, err
    assert refusal in err
    assert not marker.exists() and _snapshot(run) == before


def test_flipped_byte_in_checkpoint_or_model_is_refused(corpus, tmp_path, capsys):
    cfg = cfg_for(corpus, tmp_path / "cache", "train.steps=3")
    run = tmp_path / "run"
    T.train(cfg, run, stop_after=2)
    state = run / "checkpoint" / "state-00000002.pt"
    raw = bytearray(state.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    state.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="fails its sha256 check"):
        T.train(cfg, run)
    state.unlink()
    T.train(cfg, run)
    model = run / "model.pt"
    raw = bytearray(model.read_bytes())
    raw[-100] ^= 0x01
    model.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"model.pt fails its sha256 check") as e:
        load_model(model)
    assert "\n" not in str(e.value)


def test_cut_short_summary_is_rebuilt_and_records_are_atomic(corpus, tmp_path):
    cfg = cfg_for(corpus, tmp_path / "cache", "train.steps=2", "train.eval_every=1")
    run = tmp_path / "run"
    summary = T.train(cfg, run)
    (run / "summary.json").write_text("")  # what an in-place writer left after a kill
    assert T.train(cfg, run)["val_losses"] == summary["val_losses"]
    assert json.loads((run / "summary.json").read_text())["val_losses"] == summary["val_losses"]
    # a writer killed mid-write leaves the old record intact and a temp file the next start removes
    code = ("import os, sys; from mhar.atomic import atomic_write_bytes\n"
            "def half(f):\n    f.write(b'{\"trunc'); f.flush(); os._exit(9)\n"
            "atomic_write_bytes(sys.argv[1], half)\n")
    r = subprocess.run([sys.executable, "-c", code, str(run / "summary.json")], cwd=Path(__file__).parents[2])
    assert r.returncode == 9
    assert json.loads((run / "summary.json").read_text())["val_losses"] == summary["val_losses"]
    assert len(list(run.glob(".summary.json.*.tmp"))) == 1
    (run / "checkpoint" / f".state.pt.{_dead_pid()}.tmp").write_bytes(b"partial")
    T.train(cfg, run)
    assert not list(run.glob(".*.tmp")) and not list((run / "checkpoint").glob(".*.tmp"))


def test_second_trainer_is_refused_and_dead_lock_is_taken_over(corpus, tmp_path, capsys):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(dump_yaml(cfg_for(corpus, tmp_path / "cache", "train.steps=2").to_dict()))
    run = tmp_path / "run"
    holder = RunFolder(run)
    holder.acquire()  # another trainer holds the directory
    try:
        assert CLI.main([str(cfg_file), "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert err == f"error: {run} is in use by another trainer (pid {os.getpid()}); wait for it to finish, " \
                      "or stop it, before training into this directory\n"
        assert not (run / "metrics.jsonl").exists()
    finally:
        holder.release()
    run.mkdir(exist_ok=True)
    (run / ".lock").write_text(f"{_dead_pid()}\n")  # lock file of a killed trainer
    assert CLI.main([str(cfg_file), "--out", str(run)]) == 0 and (run / "summary.json").is_file()


def test_unusable_out_and_bad_numbers_fail_before_loading_data(corpus, tmp_path, capsys, monkeypatch):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(dump_yaml(cfg_for(corpus, tmp_path / "cache").to_dict()))
    monkeypatch.setattr(T, "load_data", lambda *a, **k: pytest.fail("data loaded before --out was checked"))
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "run"):
        assert CLI.main([str(cfg_file), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out {out} is not a usable run directory") and err.count("\n") == 1
    assert CLI.main([str(cfg_file), "train.lr=.inf", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == "error: train.lr: must be a finite number, got inf\n"


def test_non_finite_weights_after_the_last_update_fail_and_are_recorded(corpus, tmp_path, monkeypatch):
    cfg = cfg_for(corpus, tmp_path / "cache", "train.steps=4", "train.checkpoint_every=2")
    orig = torch.optim.AdamW.step
    calls = {"n": 0}

    def last_update_blows_up(self, *a, **k):
        out = orig(self, *a, **k)
        calls["n"] += 1
        if calls["n"] == 4:  # loss and grad norm of this step were finite: only the weights are not
            self.param_groups[0]["params"][0].data.fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", last_update_blows_up)
    with pytest.raises(T.TrainingDiverged, match=r"non-finite validation loss/weights at step 4"):
        T.train(cfg, tmp_path / "run")
    rec = json.loads((tmp_path / "run" / "diverged.json").read_text())
    assert rec["status"] == "diverged" and rec["step"] == 4 and rec["last_checkpoint_step"] == 2
    assert not (tmp_path / "run" / "summary.json").exists() and not (tmp_path / "run" / "model.pt").exists()
