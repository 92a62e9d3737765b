"""The workflow's `export_hf` target: every trained run of the config exported as a Hugging Face directory."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_workflow import REPO, configfiles, job_counts, load, snakemake  # noqa: E402


def distinct_runs(cfg: dict) -> int:
    cells = {(v, s, k) for v in cfg["table1"]["variants"] for s in cfg["sizes"] for k in cfg["seeds"]}
    for block in ("heads", "downstream"):
        b = cfg[block]
        cells |= {(v, s, k) for v in b["variants"] for s in b["sizes"] for k in b["seeds"]}
    return len(cells)


@pytest.mark.parametrize("config_name", ["config/config.yaml", "config/paper.yaml"])
def test_export_hf_dry_run_exports_every_trained_run(config_name, tmp_path):
    res = snakemake(["export_hf", "-n", *configfiles(config_name)], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    counts = job_counts(res.stdout)
    assert counts["export_hf_run"] == distinct_runs(load(config_name)) == counts["train"]


@pytest.mark.slow
def test_export_hf_end_to_end(tmp_path):
    data = os.environ.get("MHAR_DATA_DIR")
    if not data or not Path(data, "tinyshakespeare").is_dir():
        pytest.skip("needs the local data mirror (MHAR_DATA_DIR with tinyshakespeare/)")
    env = {"MHAR_DATA_DIR": str(Path(data).resolve())}
    ci = configfiles("config/ci.yaml")
    res = snakemake(["export_hf", "--cores", "2", *ci], tmp_path, env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = sorted(tmp_path.glob("results/runs/*/*/*/seed*/*/model.pt"))
    exports = sorted(tmp_path.glob("results/hf/*/*/*/seed*/*"))
    assert len(runs) == len(exports) == distinct_runs(load("config/ci.yaml"))
    for folder in exports:
        rep = json.loads((folder / "mhar_export.json").read_text())
        label = folder.parts[-4]
        assert rep["architecture"] == ("Qwen3ForCausalLM" if label == "baseline" else "MharForCausalLM")
        assert rep["check"]["max_abs_diff"] <= 1e-5 and rep["run"]["label"] == label
        assert "tail_mean_val_loss" in (folder / "README.md").read_text()
        assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"} <= {
            p.name for p in folder.iterdir()}
    assert list(tmp_path.glob("results/logs/export_hf/**/*.benchmark.tsv"))
    res = snakemake(["export_hf", "--cores", "2", *ci], tmp_path, env)
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr
