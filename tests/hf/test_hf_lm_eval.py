"""Stock lm-eval on an exported MHAR model: ``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True``
(lm-eval's own CLI entry point, in a process where ``mhar`` cannot be imported) gives the per-sample
log-likelihoods of ``mhar-lm-eval --model mhar`` on the same checkpoint, within 1e-4.

Two local tasks (a handful of documents, written here): a ``loglikelihood`` task (last word given the
rest) and a ``loglikelihood_rolling`` task whose longest document spans several 64-token windows.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from mhar.runs.checkpoint import save_model  # noqa: E402
from mhar.hf import export_hf  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_hf_export import BLOCKER, ROOT, trained_like  # noqa: E402

DOCS = ["the cat sat on the mat", "a dog ran in the park today", "she sells sea shells by the sea shore",
        "one more line of text for the test", "colourless green ideas sleep furiously",
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light."]
TASKS = {
    "mhar_hf_lastword": """
output_type: loglikelihood
doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_target: "{{' '+text.split(' ')[-1]}}"
metric_list:
  - metric: acc
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
""",
    "mhar_hf_rolling": """
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
""",
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_lm_eval")
    model = trained_like(dict(residual={"variant": "mhar", "heads": 4}, max_seq_len=64), seed=11)
    run = root / "run"
    run.mkdir()
    save_model(run / "model.pt", model, "byte")
    export_hf(run, root / "hf")
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS))
    for name, body in TASKS.items():
        head = (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tasks / 'docs.jsonl'}\n"
                "test_split: test\n")
        (tasks / f"{name}.yaml").write_text(head + body.lstrip() + "metadata:\n  version: 1.0\n")
    return root, run / "model.pt", root / "hf", tasks


def _common(tasks: Path, out: Path) -> list[str]:
    return ["--tasks", ",".join(TASKS), "--include_path", str(tasks), "--device", "cpu", "--batch_size", "2",
            "--output_path", str(out), "--log_samples"]


def _samples(out: Path, task: str) -> list[dict]:
    (path,) = list(out.rglob(f"samples_{task}_*.jsonl"))
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda s: s["doc_id"])


def _lls(resps) -> list[float]:
    return [float(r[0][0] if isinstance(r[0], (list, tuple)) else r[0]) for r in resps]


@pytest.mark.slow
def test_stock_lm_eval_hf_equals_mhar_lm_eval(setup):
    root, ckpt, hf_dir, tasks = setup
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_MODULES_CACHE": str(root / "hf_modules")}
    env.pop("MHAR_DATA_DIR", None)
    out_hf, out_mhar = root / "out_hf", root / "out_mhar"
    argv = ["lm_eval", "--model", "hf", "--model_args",
            f"pretrained={hf_dir},trust_remote_code=True,dtype=float32,max_length=64", *_common(tasks, out_hf)]
    child = root / "stock_lm_eval.py"
    child.write_text(BLOCKER % {"root": str(ROOT)} + f"import sys\nsys.argv = {argv!r}\n"
                     "from lm_eval.__main__ import cli_evaluate\ncli_evaluate()\n"
                     "assert not any(m == 'mhar' or m.startswith('mhar.') for m in sys.modules)\n")
    r = subprocess.run([sys.executable, str(child)], cwd=root, env={**env, "PYTHONPATH": ""}, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    r = subprocess.run([sys.executable, "-m", "eval.lm_eval_cli", "--model", "mhar", "--model_args",
                        f"pretrained={ckpt},max_length=64", *_common(tasks, out_mhar)],
                       cwd=root, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    worst, n = 0.0, 0
    for task in TASKS:
        a, b = _samples(out_hf, task), _samples(out_mhar, task)
        assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b] == list(range(len(DOCS)))
        for sa, sb in zip(a, b):
            assert sa["arguments"] == sb["arguments"]
            for x, y in zip(_lls(sa["resps"]), _lls(sb["resps"])):
                worst, n = max(worst, abs(x - y)), n + 1
            if task == "mhar_hf_lastword":
                assert [r[0][1] for r in sa["resps"]] == [r[0][1] for r in sb["resps"]]  # is_greedy
    assert n == 2 * len(DOCS) and worst <= 1e-4, f"max |dLL| = {worst:.3g} over {n} requests"
    res = json.loads(next(out_hf.rglob("results_*.json")).read_text())
    args = res["config"]["model_args"]
    assert res["config"]["model"] == "hf"
    remote = args.get("trust_remote_code") if isinstance(args, dict) else "trust_remote_code=True" in args
    assert remote in (True, "True")
    print(f"stock lm-eval hf vs mhar-lm-eval: max |dLL| = {worst:.3g} over {n} requests")


LAMBADA = ["the cat sat on the mat", "a dog ran in the park today", "she sells sea shells by the sea shore",
           "colourless green ideas sleep furiously"]


@pytest.mark.slow
def test_stock_lm_eval_offline_with_our_task_folder(setup):
    """The route docs/HUGGINGFACE.md gives a stock lm-eval user with no network: `lm_eval --model hf ... --tasks
    lambada_openai --include_path "$(python -m eval.tasks)"` with MHAR_DATA_DIR set (without the include path
    lm-eval fetches the hub dataset: a ConnectionError offline). Its per-sample log-likelihoods are those of
    `mhar-lm-eval --model mhar` on the checkpoint, and `--batch_size auto` changes no number."""
    root, ckpt, hf_dir, _ = setup
    data = root / "data"
    (data / "lambada_openai").mkdir(parents=True)
    (data / "lambada_openai" / "lambada_test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                                       for t in LAMBADA))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_MODULES_CACHE": str(root / "hf_modules"), "MHAR_DATA_DIR": str(data),
           "HF_DATASETS_CACHE": str(root / "ds_cache"), "PYTHONPATH": str(ROOT)}
    include = subprocess.run([sys.executable, "-m", "eval.tasks"], env=env, capture_output=True, text=True,
                             check=True, timeout=120).stdout.strip()
    assert Path(include) == ROOT / "eval" / "tasks"
    common = ["--tasks", "lambada_openai", "--device", "cpu", "--log_samples"]
    lm_eval = [sys.executable, "-c", "import sys; from lm_eval.__main__ import cli_evaluate; sys.argv[0] = 'lm_eval'; "
               "cli_evaluate()"]
    r = subprocess.run(lm_eval + ["--model", "hf", "--model_args",
                                  f"pretrained={hf_dir},trust_remote_code=True,dtype=float32,max_length=64",
                                  "--include_path", include, "--batch_size", "auto",
                                  "--output_path", str(root / "lam_hf"), *common],
                       cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    r = subprocess.run([sys.executable, "-m", "eval.lm_eval_cli", "--model", "mhar", "--model_args",
                        f"pretrained={ckpt},max_length=64", "--batch_size", "3", "--output_path", str(root / "lam_m"),
                        *common], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    a, b = _samples(root / "lam_hf", "lambada_openai"), _samples(root / "lam_m", "lambada_openai")
    assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b] == list(range(len(LAMBADA)))
    worst = max(abs(x - y) for sa, sb in zip(a, b) for x, y in zip(_lls(sa["resps"]), _lls(sb["resps"])))
    assert worst <= 1e-4, f"max |dLL| = {worst:.3g}"
    res = json.loads(next((root / "lam_hf").rglob("results_*.json")).read_text())
    assert res["configs"]["lambada_openai"]["metadata"]["source"] == "local"  # our YAML, the mirror's data
