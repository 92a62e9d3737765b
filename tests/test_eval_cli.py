"""``mhar-lm-eval`` (lm-eval's CLI with ``--model mhar`` and the local task YAMLs) runs end to end."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
from eval.lm_eval_cli import cli_argv, local_fewshot_error, main  # noqa: E402
from eval.data_local import TASKS_DIR  # noqa: E402
from mhar.checkpoint import save_model  # noqa: E402
from mhar.config import model_config  # noqa: E402
from mhar.model import build_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _command() -> list[str]:
    exe = shutil.which("mhar-lm-eval")  # the console script when the package is installed
    return [exe] if exe else [sys.executable, "-m", "eval.lm_eval_cli"]


@pytest.fixture()
def setup(tmp_path):
    torch.manual_seed(0)
    model = build_model(model_config("debug", vocab_size=257, max_seq_len=64))
    ckpt = save_model(tmp_path / "model.pt", model, "byte")
    data = tmp_path / "data"
    (data / "lambada_openai").mkdir(parents=True)
    lines = ["the cat sat on the mat", "a dog ran in the park", "one more line of text"]
    (data / "lambada_openai" / "lambada_test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    env = {**os.environ, "MHAR_DATA_DIR": str(data), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return ckpt, env, tmp_path


def test_cli_runs_lambada_with_mhar_model(setup):
    ckpt, env, tmp = setup
    out = tmp / "lm_eval_out"
    r = subprocess.run(_command() + ["--model", "mhar", "--model_args", f"pretrained={ckpt},max_length=64",
                                     "--tasks", "lambada_openai", "--limit", "2", "--device", "cpu",
                                     "--output_path", str(out), "--log_samples"],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "lambada_openai" in r.stdout and "perplexity" in r.stdout
    results = list(out.rglob("results_*.json"))
    assert len(results) == 1
    res = json.loads(results[0].read_text())
    assert res["config"]["model"] == "mhar" and res["n-samples"]["lambada_openai"]["effective"] == 2
    assert res["configs"]["lambada_openai"]["metadata"]["source"] == "local"  # our YAML, our data


def test_cli_bad_checkpoint_is_one_error_line(setup, monkeypatch, capsys):
    _, env, tmp = setup
    monkeypatch.setenv("MHAR_DATA_DIR", env["MHAR_DATA_DIR"])
    rc = main(["--model", "mhar", "--model_args", f"pretrained={tmp}/missing.pt", "--tasks", "lambada_openai",
               "--limit", "1", "--device", "cpu"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and last.startswith("error: ") and "missing.pt" in last


def test_include_path_only_with_a_data_dir():
    assert cli_argv(["--model", "mhar"], None) == ["--model", "mhar"]
    assert cli_argv(["run", "--tasks", "x"], "/d")[-2:] == ["--include_path", str(TASKS_DIR)]
    assert cli_argv(["--include_path", "mine"], "/d") == ["--include_path", "mine"]


def test_num_fewshot_refused_for_local_tasks_without_a_fewshot_split(setup, monkeypatch, capsys):
    _, env, _ = setup
    monkeypatch.setenv("MHAR_DATA_DIR", env["MHAR_DATA_DIR"])
    rc = main(["--model", "mhar", "--model_args", "pretrained=x", "--tasks", "lambada_openai", "--num_fewshot", "2"])
    assert rc == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith("error: task lambada_openai:")
    assert local_fewshot_error(["--tasks", "gsm8k", "--num_fewshot", "3"]) is None  # gsm8k has a train split
    assert "hellaswag" in local_fewshot_error(["-t", "gsm8k,hellaswag", "-f=1"])
    assert local_fewshot_error(["--tasks", "hellaswag", "--num_fewshot", "0"]) is None
