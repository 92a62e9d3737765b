"""``mhar-lm-eval`` (lm-eval's CLI with ``--model mhar`` and the local task YAMLs) runs end to end."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
from eval.lm_eval_cli import cli_argv, local_fewshot_error, main  # noqa: E402
from eval.data_local import TASKS_DIR  # noqa: E402
from mhar.runs.checkpoint import save_model  # noqa: E402
from mhar.model.config import model_config  # noqa: E402
from mhar.model.transformer import build_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


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


def test_cli_runs_lambada_with_mhar_model(setup, monkeypatch):
    """lm-eval's CLI (with --output_path --log_samples) and eval.run write the same lm-eval files."""
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

    # eval.run on the same model, task and documents: lm-eval's own files beside ours, in lm-eval's layout
    from eval.run import main as run_main

    monkeypatch.setenv("MHAR_DATA_DIR", env["MHAR_DATA_DIR"])
    assert run_main(["--model", str(ckpt), "--tasks", "lambada_openai", "--limit", "2", "--device", "cpu",
                     "--max-length", "64", "--out", str(tmp / "run")]) == 0
    task_dir = tmp / "run" / "lambada_openai"
    ours = json.loads((task_dir / "results.json").read_text())
    mine = {k: task_dir / v for k, v in ours["lm_eval_files"].items()}
    assert mine["results"].parent == mine["samples"].parent == task_dir / "lm_eval" / results[0].parent.name
    assert re.fullmatch(r"results_\d{4}-\d\d-\d\dT[\d.-]+\.json", mine["results"].name)
    assert re.fullmatch(r"samples_lambada_openai_\d{4}-\d\d-\d\dT[\d.-]+\.jsonl", mine["samples"].name)
    theirs_samples = [json.loads(x) for x in next(out.rglob("samples_lambada_openai_*.jsonl")).read_text().splitlines()]
    my_samples = [json.loads(x) for x in mine["samples"].read_text().splitlines()]
    assert len(my_samples) == len(theirs_samples) == 2
    for a, b in zip(my_samples, theirs_samples):  # every field, values included (doc, arguments, resps, ...)
        assert {"doc", "doc_id", "target", "arguments", "resps", "filtered_resps", "acc", "perplexity",
                "doc_hash", "prompt_hash", "target_hash"} <= a.keys()
        assert a == b
    mres = json.loads(mine["results"].read_text())
    assert mres.keys() == res.keys()
    for key in ("results", "n-samples", "n-shot", "versions", "higher_is_better", "task_hashes", "group_subtasks",
                "model_name", "model_name_sanitized", "model_source", "lm_eval_version"):
        assert mres[key] == res[key], key
    assert {k: mres["config"][k] for k in ("model", "model_args", "bootstrap_iters")} == \
        {k: res["config"][k] for k in ("model", "model_args", "bootstrap_iters")}
    drop = lambda c: {k: v for k, v in c.items() if k != "metadata"}  # noqa: E731  (the CLI adds model_args there)
    assert drop(mres["configs"]["lambada_openai"]) == drop(res["configs"]["lambada_openai"])
    # what our statistics read agrees with lm-eval's files
    rows = [json.loads(x) for x in (task_dir / "samples.jsonl").read_text().splitlines()]
    assert [(s["doc_id"], s["prompt_hash"], s["metrics"]["acc"]) for s in rows] == \
        [(s["doc_id"], s["prompt_hash"], s["acc"]) for s in my_samples]
    assert ours["metrics"]["acc"] == mres["results"]["lambada_openai"]["acc,none"]


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
    # the user's folders come after ours (a later include path wins a name), in both spellings
    assert cli_argv(["--include_path", "mine"], "/d") == ["--include_path", f"{TASKS_DIR}{os.pathsep}mine"]
    assert cli_argv(["ls", "--include_path=a"], "/d") == ["ls", f"--include_path={TASKS_DIR}{os.pathsep}a"]
    assert cli_argv(["--include_path", "mine"], None) == ["--include_path", "mine"]


def test_num_fewshot_refused_for_local_tasks_without_a_fewshot_split(setup, monkeypatch, capsys):
    _, env, _ = setup
    monkeypatch.setenv("MHAR_DATA_DIR", env["MHAR_DATA_DIR"])
    rc = main(["--model", "mhar", "--model_args", "pretrained=x", "--tasks", "lambada_openai", "--num_fewshot", "2"])
    assert rc == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith("error: task lambada_openai:")
    assert local_fewshot_error(["--tasks", "gsm8k", "--num_fewshot", "3"]) is None  # gsm8k has a train split
    assert "hellaswag" in local_fewshot_error(["-t", "gsm8k,hellaswag", "-f=1"])
    assert local_fewshot_error(["--tasks", "hellaswag", "--num_fewshot", "0"]) is None


def test_eval_run_and_lm_eval_cli_share_one_registry(tmp_path, monkeypatch):
    """With a data directory, eval.run and mhar-lm-eval resolve every name alike: lm-eval's stock tasks stay
    registered, eval/tasks wins the names it defines, and the user's folder (any file names) wins over both."""
    import lm_eval.tasks

    from eval.data_local import DataSource
    from eval.lm_eval_cli import _flag, split_include_paths

    data, mine = tmp_path / "data", tmp_path / "my tasks"
    data.mkdir(), mine.mkdir()
    (mine / "anything.yaml").write_text("task: my_cloze\ndataset_path: json\noutput_type: loglikelihood\n"
                                        "test_split: test\ndoc_to_text: '{{text}}'\ndoc_to_target: ' x'\n")
    (mine / "v2_hs.yaml").write_text("task: hellaswag\ndataset_path: json\noutput_type: loglikelihood\n"
                                     "test_split: test\ndoc_to_text: '{{text}}'\ndoc_to_target: ' x'\n")
    src = DataSource.from_env(data, mine)
    ours = {name: e.yaml_path for name, e in src.task_manager().task_index.items()}
    split_include_paths()  # what mhar-lm-eval's main() installs
    argv = cli_argv(["--model", "mhar", "--tasks", "my_cloze", "--include_path", str(mine)], str(data))
    cli = {name: e.yaml_path for name, e in
           lm_eval.tasks.TaskManager(include_path=_flag(argv, "--include_path")).task_index.items()}
    assert ours == cli
    assert "arc_easy" in ours and "mmlu" in ours  # the stock registry is on
    assert ours["lambada_openai"] == TASKS_DIR / "lambada_openai.yaml"  # the local mirror wins its names
    assert ours["my_cloze"] == mine / "anything.yaml" and ours["hellaswag"] == mine / "v2_hs.yaml"
    assert src.is_local_task("lambada_openai") and not src.is_local_task("hellaswag")
    assert src.missing_files("hellaswag") == []  # the user's hellaswag reads no mirror file
    # without a data directory: the stock tasks (with the user's folder on top)
    monkeypatch.delenv("MHAR_DATA_DIR", raising=False)
    hub = {name: e.yaml_path for name, e in DataSource.from_env(None, mine).task_manager().task_index.items()}
    assert hub["lambada_openai"] != TASKS_DIR / "lambada_openai.yaml" and hub["my_cloze"] == mine / "anything.yaml"


def test_eval_run_passes_lm_evals_own_wandb_logging_through(setup, monkeypatch, capsys):
    """`eval.run --wandb-args project=...,mode=offline,dir=...`: lm-eval's WandbLogger writes an offline W&B run
    holding the task's metrics (as `lm_eval --wandb_args` does); a bad value is one error line."""
    pytest.importorskip("wandb")
    from eval.run import main as run_main
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'training'))  # the builder lives beside its own tests
    from test_tracking import wandb_run

    ckpt, env, tmp = setup
    monkeypatch.setenv("MHAR_DATA_DIR", env["MHAR_DATA_DIR"])
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = ["--model", str(ckpt), "--tasks", "lambada_openai", "--limit", "2", "--device", "cpu", "--max-length", "64",
            "--out", str(tmp / "run")]
    for bad in ("project=x,oops", "projekt=x"):
        assert run_main([*args, "--wandb-args", bad]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --wandb-args")
    assert run_main([*args, "--wandb-args", f"project=mhar,mode=offline,dir={tmp},group=g1,name=mhar/debug/seed0"]) == 0
    ours = json.loads((tmp / "run" / "lambada_openai" / "results.json").read_text())
    wb = wandb_run(tmp)
    assert wb["groups"] == ["g1"] and wb["names"] == ["mhar/debug/seed0"]
    logged = {k: v for row in wb["history"] for k, v in row.items()}
    assert logged["lambada_openai/acc"] == ours["metrics"]["acc"]
