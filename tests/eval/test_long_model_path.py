"""A model path longer than a file name may be (each folder under the limit, the whole path over it): lm-eval
names its output folder after the whole path, so after the whole evaluation it could not write its files
("lm-eval could not write its output files ... check the free space and permissions": the real cause was the
file-name limit). Now ``python -m eval.run`` hashes that folder name (the evaluation is the same as from a short
path) and ``mhar-lm-eval --output_path`` refuses the path in one line before evaluating anything."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
from mhar.model.config import model_config  # noqa: E402
from mhar.model.transformer import build_model  # noqa: E402
from mhar.atomic import name_max  # noqa: E402
from mhar.runs.checkpoint import save_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def long_model(tmp_path):
    torch.manual_seed(0)
    model = build_model(model_config("debug", vocab_size=257, max_seq_len=64))
    short = save_model(tmp_path / "short" / "model.pt", model, "byte")
    deep = tmp_path / ("d" * 200) / ("e" * 120)  # every folder name fits; the whole path does not
    deep.mkdir(parents=True)
    (deep / "model.pt").write_bytes(short.read_bytes())
    (deep / "model.pt.sha256").write_text((short.parent / "model.pt.sha256").read_text())
    assert len(str(deep / "model.pt").replace("/", "__")) > name_max(tmp_path)
    data = tmp_path / "data"
    (data / "lambada_openai").mkdir(parents=True)
    lines = ["the cat sat on the mat", "a dog ran in the park", "one more line of text"]
    (data / "lambada_openai" / "lambada_test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    return short, deep / "model.pt", data


def test_eval_run_hashes_lm_evals_folder_name_and_evaluates_the_same(long_model, tmp_path, monkeypatch):
    from eval.run import main as run_main

    short, deep, data = long_model
    monkeypatch.setenv("MHAR_DATA_DIR", str(data))
    args = ["--tasks", "lambada_openai", "--limit", "2", "--device", "cpu", "--max-length", "64"]
    assert run_main(["--model", str(deep), *args, "--out", str(tmp_path / "long")]) == 0
    assert run_main(["--model", str(short), *args, "--out", str(tmp_path / "ref")]) == 0
    long_res = json.loads((tmp_path / "long" / "lambada_openai" / "results.json").read_text())
    ref_res = json.loads((tmp_path / "ref" / "lambada_openai" / "results.json").read_text())
    assert long_res["metrics"] == ref_res["metrics"]
    read = lambda d: [json.loads(x) for x in (d / "lambada_openai" / "samples.jsonl").read_text().splitlines()]  # noqa: E731
    assert [r["metrics"] for r in read(tmp_path / "long")] == [r["metrics"] for r in read(tmp_path / "ref")]
    files = {k: tmp_path / "long" / "lambada_openai" / v for k, v in long_res["lm_eval_files"].items()}
    assert all(f.is_file() for f in files.values())
    folder = files["results"].parent.name
    assert len(folder.encode()) <= name_max(tmp_path) and folder.endswith("__model.pt")
    assert len(folder.split("__", 1)[0]) == 16  # the hash of lm-eval's whole name
    ref_folder = (tmp_path / "ref" / "lambada_openai" / ref_res["lm_eval_files"]["results"]).parent.name
    assert ref_folder == str(short).replace("/", "__")  # a path that fits keeps lm-eval's own name


def test_lm_eval_cli_refuses_the_path_before_evaluating(long_model, tmp_path):
    short, deep, data = long_model
    env = {**os.environ, "MHAR_DATA_DIR": str(data), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "eval.lm_eval_cli", "--model", "mhar", "--model_args",
                          f"pretrained={deep},max_length=64", "--tasks", "lambada_openai", "--limit", "2",
                          "--device", "cpu", "--output_path", str(out), "--log_samples"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    errors = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("error:")]
    assert res.returncode == 2 and len(errors) == 1, res.stderr[-3000:]
    assert "file name" in errors[0] and "model path" in errors[0] and "Traceback" not in res.stderr
    assert not out.exists() and "lambada_openai" not in res.stdout  # nothing evaluated
