"""The workflow's `export_hf` target: every trained run of the config exported as a Hugging Face directory."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_workflow import configfiles, job_counts, load, snakemake  # noqa: E402


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


# --- released checkpoints as downstream arms --------------------------------------------------------------
def released_overlay(tmp_path: Path, base: str, mhar: str) -> Path:
    overlay = tmp_path / "released.yaml"
    arms = {"rel_base": {"hf": base, "size": "debug-rel", "group": "g", "tokenizer": "byte"},
            "rel_mhar": {"hf": mhar, "size": "debug-rel", "group": "g", "tokenizer": "byte"}}
    overlay.write_text(json.dumps({"released": arms}))
    return overlay


def test_released_arms_are_imported_and_evaluated_in_the_dry_run(tmp_path):
    overlay = released_overlay(tmp_path, "org/base", "org/mhar")
    res = snakemake(["reproduce_downstream", "-n", *configfiles("config/ci.yaml"), str(overlay)], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    counts = job_counts(res.stdout)
    n_tasks = len(load("config/ci.yaml")["downstream"]["tasks"])
    assert counts["import_released"] == 2 and counts["evaluate_released"] == 2 * n_tasks
    assert "results/eval/released/rel_mhar/" in res.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"released": {"x": {"hf": "a/b", "sise": "1B"}}}))
    res = snakemake(["reproduce_downstream", "-n", *configfiles("config/ci.yaml"), str(bad)], tmp_path)
    assert res.returncode != 0 and "released.x" in res.stdout + res.stderr


@pytest.mark.slow
def test_export_hf_and_released_arms_end_to_end(tmp_path):
    """config/ci.yaml + two released checkpoints, one invocation of `export_hf reproduce_downstream`: every trained
    run is exported (and loads as it should); a stock Qwen3 baseline and an authors' full_mh checkpoint (same size
    label and group) are imported, evaluated and compared in reports/downstream.csv beside the trained runs."""
    data = os.environ.get("MHAR_DATA_DIR")
    if not data or not Path(data, "lambada_openai").is_dir():
        pytest.skip("needs the local data mirror (MHAR_DATA_DIR with tinyshakespeare/, lambada_openai/)")
    import csv

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'hf'))  # the builder lives beside its own tests
    from test_hf_authors import authors_checkpoint

    torch.manual_seed(0)
    base = Qwen3ForCausalLM(Qwen3Config(vocab_size=257, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        max_position_embeddings=256, tie_word_embeddings=True))
    base.save_pretrained(tmp_path / "base")
    authors_checkpoint(tmp_path / "mhar", "full_mh", layers=2, heads=4, vocab=257,
                       extra_config={"max_position_embeddings": 256})
    overlay = released_overlay(tmp_path, str(tmp_path / "base"), str(tmp_path / "mhar"))
    env = {"MHAR_DATA_DIR": str(Path(data).resolve())}
    cfgs = [*configfiles("config/ci.yaml"), str(overlay)]
    res = snakemake(["export_hf", "reproduce_downstream", "--cores", "2", *cfgs], tmp_path, env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = sorted(tmp_path.glob("results/runs/*/*/seed*/*/model.pt"))  # <label>/<size>/seed<k>/<rid>
    exports = sorted(tmp_path.glob("results/hf/*/*/seed*/*"))
    assert len(runs) == len(exports) == distinct_runs(load("config/ci.yaml"))
    for folder in exports:
        rep = json.loads((folder / "mhar_export.json").read_text())
        label = folder.parts[-4]
        assert rep["architecture"] == ("Qwen3ForCausalLM" if label == "baseline" else "MharForCausalLM")
        assert rep["check"]["max_abs_diff"] <= 1e-5 and rep["run"]["label"] == label
        assert "tail_mean_val_loss" in (folder / "README.md").read_text()
        assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"} <= {
            p.name for p in folder.iterdir()}
    assert list(tmp_path.glob("results/benchmarks/export_hf/**/*.tsv"))
    tables = list(tmp_path.glob("results/reports/*/downstream.csv"))  # an overlay's reports: results/reports/<hash>
    assert len(tables) == 1, tables
    rows = list(csv.DictReader(tables[0].open()))
    rel = [r for r in rows if r["size"] == "debug-rel"]
    assert rel and all(r["variant"] == "mhar" and int(r["n"]) > 0 for r in rel), rows
    assert any(r["size"] == "debug" for r in rows)  # the trained runs' comparison is still there
    rec = json.loads(next((tmp_path / "results/eval/released/rel_mhar").glob("*/*/results.json")).read_text())
    assert rec["run"]["label"] == "rel_mhar" and rec["run"]["pairing"] == "released-g"
    res = snakemake(["export_hf", "reproduce_downstream", "--cores", "2", *cfgs], tmp_path, env)
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr
