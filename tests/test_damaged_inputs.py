"""Damaged inputs are refused with one ``error:`` line (exit 2) naming the file and the first bad record, never
averaged or tabulated; YAML tags never run; an unavailable device is a config error (issue 44.4, 44.5)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fixtures_analysis as fx
from analysis import figures
from analysis.load.common import AnalysisInputError
from analysis.load.runs import run_setup
from analysis.load.samples import align, load_eval_task, metric_arrays
from analysis.tables.build import main as tables_main


def _samples(d: Path, task: str) -> tuple[Path, list[dict]]:
    sp = d / task / "samples.jsonl"
    return sp, [json.loads(x) for x in sp.read_text().splitlines()]


def _write(sp: Path, recs: list) -> None:
    sp.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))


def _refused(capsys, argv: list[str], *needles: str, main=tables_main) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
    return err


def _downstream(tmp_path: Path, dirs) -> list[str]:
    return ["downstream", "--inputs", *map(str, dirs), "--out", str(tmp_path / "d"), "--resamples", "99"]


def test_duplicated_doc_id_is_refused_not_last_one_wins(tmp_path, capsys):
    dirs, _ = fx.make_downstream(tmp_path, n=40)
    sp, recs = _samples(dirs[1], "lambada_openai")
    recs[7] = {**recs[3], "metrics": {**recs[3]["metrics"], "acc": 1.0 - recs[3]["metrics"]["acc"]}}
    _write(sp, recs)
    _refused(capsys, _downstream(tmp_path, dirs), f"{sp}:8: doc_id 3 appears again (first on line 4)")
    assert not (tmp_path / "d.csv").exists()


def test_missing_documents_are_refused_not_paired_on_the_rest(tmp_path, capsys):
    dirs, _ = fx.make_downstream(tmp_path, n=200)
    sp, recs = _samples(dirs[1], "lambada_openai")
    _write(sp, recs[:60] + recs[120:])  # 60 of 200 doc ids lost; results.json still says n=200
    _refused(capsys, _downstream(tmp_path, dirs), str(sp), "holds 140 documents", "records 200")
    # and when the record was cut to match, the pair still holds different documents
    rp = sp.parent / "results.json"
    rp.write_text(json.dumps({**json.loads(rp.read_text()), "n": 140}))
    _refused(capsys, _downstream(tmp_path, dirs), "the pair holds different documents", "first: doc_id 60")
    # the recorded doc_ids (what eval.run writes) name the first missing document
    rp.write_text(json.dumps({**json.loads(rp.read_text()), "doc_ids": list(range(200))}))
    _refused(capsys, _downstream(tmp_path, dirs), "60 recorded document(s) are missing (first: doc_id 60)")


@pytest.mark.parametrize("bad", [float("nan"), "NaN", None, float("inf")])
def test_non_finite_or_non_numeric_metric_is_refused(tmp_path, capsys, bad):
    dirs, _ = fx.make_downstream(tmp_path, n=30)
    sp, recs = _samples(dirs[0], "wikitext")
    recs[5]["metrics"]["word_perplexity"] = [bad, 12.0]
    _write(sp, recs)
    _refused(capsys, _downstream(tmp_path, dirs), f"{sp}:6: doc_id 5 metric 'word_perplexity'")


def test_string_nan_loss_in_a_summary_or_metrics_file_is_refused(tmp_path, capsys):
    good = fx.write_run(tmp_path, "baseline", "tiny", 0, 2.0)
    bad = fx.write_run(tmp_path, "mhar", "tiny", 0, 2.0, heads=4)
    s = json.loads(bad.read_text())
    s["tail_mean_val_loss"] = "NaN"
    bad.write_text(json.dumps(s))
    _refused(capsys, ["table1", "--inputs", str(good), str(bad), "--out", str(tmp_path / "t")], str(bad),
             "non-finite tail_mean_val_loss='NaN'")
    s["tail_mean_val_loss"] = 2.0
    s["val_losses"] = [[1, 2.5], [2, "NaN"]]
    bad.write_text(json.dumps(s))
    _refused(capsys, ["table1", "--inputs", str(good), str(bad), "--out", str(tmp_path / "t")], "val_losses[1]")
    s["val_losses"] = [[1, 2.5], [2, 2.0]]
    bad.write_text(json.dumps(s))
    m = bad.parent / "metrics.jsonl"
    m.write_text(json.dumps({"split": "val", "step": 1, "val_loss": 2.5, "tokens": 1, "wall_s": 1, "flops": 1}) + "\n"
                 + json.dumps({"split": "val", "step": 2, "val_loss": "NaN", "tokens": 2, "wall_s": 2, "flops": 2}) + "\n")
    _refused(capsys, ["loss_curves", "--inputs", str(good), str(bad), "--out", str(tmp_path / "f")],
             f"{m}:2: val_loss='NaN' is not a finite number", main=figures.main)


def test_yaml_python_tags_are_refused_and_never_run(tmp_path, capsys):
    import mhar.training.cli as CLI

    marker = tmp_path / "pwned"
    tag = f'!!python/object/apply:os.system ["touch {marker}"]'
    # a command-line override
    _refused(capsys, ["config/train/debug.yaml", f"train.lr={tag}", "--out", str(tmp_path / "r")],
             "override 'train.lr': YAML tag", "is refused", main=CLI.main)
    # a config file
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"train:\n  lr: {tag}\n")
    _refused(capsys, [str(cfg), "--out", str(tmp_path / "r")], f"{cfg}: not valid YAML: YAML tag", "(line 2",
             main=CLI.main)
    # the CPT manifest
    man = tmp_path / "cpt.yaml"
    man.write_text(f"base: {tag}\nplain: p\nmhar: m\n")
    _refused(capsys, ["cpt", "--inputs", str(man), "--out", str(tmp_path / "t")], f"{man}: not valid YAML: YAML tag")
    # a run directory's config.yaml read by the analysis stage
    run = fx.write_run(tmp_path, "mhar", "tiny", 0, 2.0, heads=4)
    (run.parent / "config.yaml").write_text(f"model:\n  residual: {tag}\n")
    with pytest.raises(AnalysisInputError, match="YAML tag"):
        run_setup(run.parent)
    assert not marker.exists() and not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_device_without_a_gpu_is_a_config_error(tmp_path, capsys):
    import mhar.training.cli as CLI

    _refused(capsys, ["config/train/debug.yaml", "train.device=cuda", "--out", str(tmp_path / "r")],
             "train.device=cuda but no CUDA device is visible", main=CLI.main)
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_eval_device_cuda_without_a_gpu_is_refused_not_run_on_the_cpu(tmp_path, capsys, monkeypatch):
    """``eval.run --device cuda`` and ``mhar-lm-eval --model mhar --device cuda``: the trainer's error line (exit 2)
    before anything is loaded or written; no ``--device`` still runs on the CPU."""
    pytest.importorskip("lm_eval")
    from eval import lm_eval_cli, run
    from eval.adapter import MharLM
    from mhar.runs.checkpoint import save_model
    from mhar.model.config import model_config
    from mhar.model.transformer import Transformer

    model = save_model(tmp_path / "m" / "model.pt", Transformer(model_config("debug", max_seq_len=64)), "byte")
    monkeypatch.setattr(MharLM, "_loglikelihood_tokens", lambda *a, **k: pytest.fail("evaluation started"))
    out = tmp_path / "eval"
    _refused(capsys, ["--model", str(model), "--tasks", "lambada_openai", "--out", str(out), "--limit", "2",
                      "--device", "cuda"],
             "--device cuda but no CUDA device is visible to this process; use --device cpu", main=run.main)
    assert not out.exists()
    capsys.readouterr()
    assert lm_eval_cli.main(["--model", "mhar", "--model_args", f"pretrained={model}", "--tasks", "lambada_openai",
                             "--limit", "2", "--device", "cuda:0", "--output_path", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda:0 but no CUDA device is visible to this process" in err, err
    assert not out.exists()
    with pytest.raises(ValueError, match="MharLM: device=cuda but no CUDA device is visible"):
        MharLM(pretrained=str(model), device="cuda")
    # lm-eval's own default (cuda:0 when --device is not given) is not the user's choice: cpu here
    argv = ["--model", "mhar", "--tasks", "x"]
    assert lm_eval_cli.mhar_device_argv(argv) == (argv + ["--device", "cpu"], None)
    assert lm_eval_cli.mhar_device_argv(["--model", "hf", "--device", "cuda"]) == (["--model", "hf", "--device",
                                                                                     "cuda"], None)


def test_clean_records_still_load(tmp_path):
    dirs, truth = fx.make_downstream(tmp_path, n=25)
    a, b = (load_eval_task(d, "lambada_openai") for d in dirs)
    ids = align(a, b)
    assert ids == list(range(25))
    np.testing.assert_array_equal(metric_arrays(a, "acc", ids)[0], truth["lam_b"])
