"""The GPU pilot's driver (benchmarks/pilot.py, pilot.sh, pilot_record.py) on CPU: the logic, not the speed.

The paper configs (config/train/paper_{100M,1B}.yaml) are overridden down to the `debug` preset and a
few steps; the driver must stop each run half way, resume it from its checkpoint to the end, evaluate it
with lm-eval, report the losses at the requested steps from the trainer's own records, project the full
run from the median step time, respect its time budget, and its rows must become record rows.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DATA = os.environ.get("MHAR_DATA_DIR")
CPU = ["model.preset=debug", "data.seq_len=64", "data.val_tokens=512", "data.tokenizer=byte", "train.global_batch=4",
       "train.micro_batch=2", "train.device=cpu", "train.dtype=fp32", "model.residual.routing_impl=eager",
       "train.log_every=1", "train.checkpoint_every=2"]


def test_paper_configs_follow_the_paper_recipe():
    from mhar.runs.config import load_run_config

    paper = {"100M": ((512, 12, 8, 4, 1536), 2048, 64), "1B": ((1280, 36, 16, 8, 5120), 1024, 32)}  # PAPER.md
    for size, (shape, seq, batch) in paper.items():
        cfg = load_run_config(ROOT / "config" / "train" / f"paper_{size}.yaml")
        m, t = cfg.model, cfg.train
        assert (m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.d_ff) == shape
        assert cfg.data.seq_len == seq and t.global_batch == batch
        assert t.global_batch % t.micro_batch == 0 and t.global_batch > t.micro_batch  # gradient accumulation
        assert (t.lr, t.beta1, t.beta2, t.eps, t.weight_decay, t.grad_clip, t.min_lr_ratio) == \
            (5e-4, 0.9, 0.95, 1e-8, 0.1, 1.0, 0.1)
        assert cfg.model.vocab_size == 151936  # the Qwen3 vocabulary: a step costs what the paper's costs
        assert t.warmup_steps == round(t.steps * 1000 / 20000) and t.eval_every == 100 and t.dtype == "bf16"
        assert cfg.data.corpus == "nltk_gutenberg" and "gpt2" in cfg.data.tokenizer


@pytest.mark.slow
def test_pilot_driver_on_cpu(tmp_path):
    if not DATA or not Path(DATA, "nltk_gutenberg").is_dir():
        pytest.skip("needs MHAR_DATA_DIR with nltk_gutenberg/ and wikitext-2-raw-v1/")
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "benchmarks.pilot", "--out", str(out), "--work", str(work), "--sizes", "100M", "1B",
           "--steps", "100M=6", "1B=4", "--loss-steps", "2", "4", "6", "--eval-every", "2", "--skip-steps", "1",
           "--eval-limit", "1", "--device", "cpu", "--budget-s", "900", "--min-stage-s", "100M=1", "1B=1",
           "--single", "1B", "--set", *CPU]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = list(csv.DictReader((out / "pilot.csv").open()))
    assert [r["size"] for r in rows] == ["100M", "1B"] and all(r["status"] == "ok" for r in rows)
    for r, steps, resumed in zip(rows, (6, 4), (3, None)):  # 1B: --single (one process, no resume)
        run = work / r["size"]
        prov = json.loads((run / "provenance.json").read_text())
        assert int(r["steps_done"]) == steps and prov.get("resumed_from_step") == resumed
        assert r["resumed_from_step"] == ("" if resumed is None else str(resumed))
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        train = {m["step"]: m for m in metrics if m["split"] == "train"}
        val = {m["step"]: m["val_loss"] for m in metrics if m["split"] == "val"}
        for s in (2, 4, 6):  # the losses are the trainer's own, at those steps
            if s <= steps:
                assert float(r[f"train_loss_{s}"]) == pytest.approx(train[s]["loss"], abs=1e-4)
                assert float(r[f"val_loss_{s}"]) == pytest.approx(val[s], abs=1e-4)
            else:
                assert r[f"train_loss_{s}"] == ""
        steady = sorted(train[s]["step_ms"] for s in train if s not in (1, (resumed or -1) + 1))
        assert float(r["step_ms_median"]) == pytest.approx(steady[len(steady) // 2])
        assert float(r["projected_full_run_h"]) == pytest.approx(20000 * float(r["step_ms_median"]) / 1e3 / 3600,
                                                                 abs=0.01)
        assert int(r["warmup_steps"]) == 1 and r["eval_status"] == "ok" and float(r["eval_bits_per_byte"]) > 0
        assert r["pilot_command"].startswith("PYTHONPATH=. python -m benchmarks.pilot") and r["torch"]
        # only small records come back under --out (no checkpoint, no weights)
        copied = {p.name for p in (out / "runs" / r["size"]).rglob("*") if p.is_file()}
        assert {"metrics.jsonl", "summary.json", "provenance.json", "results.json"} <= copied
        assert not any(n.endswith((".pt", ".safetensors")) for n in copied)
    assert "20K steps h/GPU" in res.stdout and "val@2" in res.stdout  # the summary table

    # the record: provenance added, the same pilot never recorded twice
    from benchmarks import pilot_record

    (out / "gpu.txt").write_text("NVIDIA H200, 580.00, 143771 MiB\ntorch 2.11.0 triton 3.6.0\n")
    record = tmp_path / "pilot_record.csv"
    assert pilot_record.main(["--from", str(out / "pilot.csv"), "--session", "test session", "--out", str(record)]) == 0
    rec = list(csv.DictReader(record.open()))
    assert len(rec) == 2 and rec[0]["session"] == "test session" and "H200" in rec[0]["gpu_info"]
    assert rec[0]["val_loss_2"] == rows[0]["val_loss_2"] and len(rec[0]["source_sha256"]) == 16
    with pytest.raises(SystemExit):
        pilot_record.main(["--from", str(out / "pilot.csv"), "--session", "again", "--out", str(record)])
    assert len(list(csv.DictReader(record.open()))) == 2


def test_pilot_skips_a_size_that_does_not_fit_the_budget(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "benchmarks.pilot", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
           "--sizes", "100M", "1B", "--budget-s", "60", "--min-stage-s", "100M=120", "1B=120", "--set", *CPU]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "out" / "pilot.csv").open()))
    assert [r["status"].split(":")[0] for r in rows] == ["skipped", "skipped"]
    assert "1B needs about 120 s" in rows[1]["status"]
    assert not (tmp_path / "w" / "100M").exists()  # nothing was started


def test_pilot_record_refuses_bad_input(tmp_path, capsys):
    from benchmarks import pilot_record

    with pytest.raises(SystemExit):
        pilot_record.main(["--from", str(tmp_path / "none.csv"), "--session", "s", "--out", str(tmp_path / "r.csv")])
    assert "error: --from" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit):
        pilot_record.main(["--from", str(bad), "--session", "s", "--out", str(tmp_path / "r.csv")])
    assert "not a pilot record" in capsys.readouterr().err
    failed = tmp_path / "failed.csv"
    failed.write_text("utc,size,status\n2026,100M,failed (exit 1)\n")
    with pytest.raises(SystemExit):
        pilot_record.main(["--from", str(failed), "--session", "s", "--out", str(tmp_path / "r.csv")])
    assert "did not finish" in capsys.readouterr().err and not (tmp_path / "r.csv").exists()


def test_pilot_sh_prepares_the_carried_data(tmp_path):
    if not DATA or not Path(DATA, "nltk_gutenberg").is_dir():
        pytest.skip("needs MHAR_DATA_DIR")
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "benchmarks" / "pilot.sh").write_bytes((ROOT / "benchmarks" / "pilot.sh").read_bytes())
    res = subprocess.run(["bash", "benchmarks/pilot.sh", "prepare"], cwd=repo, capture_output=True, text=True,
                         env={**os.environ, "MHAR_DATA_DIR": DATA}, timeout=120)
    assert res.returncode == 0, res.stderr
    data = repo / ".gpudata" / "data"
    from mhar.data.corpus import resolve_corpus
    from mhar.data.tokenizer import get_tokenizer

    assert resolve_corpus("nltk_gutenberg", data).n_docs == 15
    cfg = yaml.safe_load((ROOT / "config" / "train" / "paper_100M.yaml").read_text())
    assert get_tokenizer(cfg["data"]["tokenizer"], data).vocab_size == 50257
    assert (data / "wikitext-2-raw-v1" / "validation.jsonl").is_file()
    res = subprocess.run(["bash", "benchmarks/pilot.sh"], cwd=repo, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "OUT"})
    assert res.returncode != 0 and "OUT" in res.stderr
