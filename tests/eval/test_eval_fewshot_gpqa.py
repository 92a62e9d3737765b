"""eval.run: seeded GPQA answer order on the hub path, --num_fewshot honoured or refused, lm-eval's
sample field meanings (prompt_hash) next to our all-arguments hash."""
from __future__ import annotations

import hashlib
import json
import os
import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("lm_eval")
datasets = pytest.importorskip("datasets")
from lm_eval.tasks.gpqa.zeroshot.utils import process_docs as stock_process_docs  # noqa: E402

from eval.adapter import MharLM  # noqa: E402
from eval.run import evaluate_model, main  # noqa: E402
from eval.tasks.utils import seed_gpqa_choices  # noqa: E402
from mhar.runs.checkpoint import save_model  # noqa: E402
from mhar.model.config import model_config  # noqa: E402
from mhar.model.transformer import build_model  # noqa: E402

torch.set_num_threads(1)
DATA = os.environ.get("MHAR_DATA_DIR")


def _gpqa_rows(n=40):
    return datasets.Dataset.from_list([{"Question": f"q{i}", "Correct Answer": f"right {i}",
                                        "Incorrect Answer 1": f"w1 {i}", "Incorrect Answer 2": f"w2 {i}",
                                        "Incorrect Answer 3": f"w3 {i}"} for i in range(n)])


def test_hub_gpqa_order_is_the_seeded_stock_order_whatever_the_global_rng():
    raw = _gpqa_rows()
    random.seed(0)  # what a fresh stock run does before its first read of the docs
    stock = stock_process_docs(raw)
    orders = []
    for prior in (0, 123, None):  # the global RNG state before loading must not matter
        random.seed(prior)
        random.random()
        task = SimpleNamespace(config=SimpleNamespace(process_docs=stock_process_docs),
                               dataset=datasets.DatasetDict({"train": raw}))
        assert seed_gpqa_choices(task)
        assert task.config.process_docs is None
        docs = task.dataset["train"]
        orders.append([(d["choice1"], d["choice2"], d["choice3"], d["choice4"], d["answer"]) for d in docs])
        assert docs.column_names == stock.column_names  # stock keeps the raw columns too
    expected = [(d["choice1"], d["choice2"], d["choice3"], d["choice4"], d["answer"]) for d in stock]
    assert orders[0] == orders[1] == orders[2] == expected
    assert len({a for *_, a in expected}) == 4  # really shuffled
    other = SimpleNamespace(config=SimpleNamespace(process_docs=lambda d: d), dataset=None)
    assert not seed_gpqa_choices(other)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(model_config("debug", vocab_size=257, max_seq_len=512))
    return save_model(tmp_path_factory.mktemp("fs") / "model.pt", model, "byte")


@pytest.mark.skipif(not DATA, reason="needs MHAR_DATA_DIR")
def test_num_fewshot_refused_without_a_fewshot_split(ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    for task in ("hellaswag", "lambada_openai", "wikitext", "gpqa_main_zeroshot"):
        rc = main(["--model", str(ckpt), "--tasks", task, "--limit", "1", "--device", "cpu",
                   "--num_fewshot", "2", "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith(f"error: task {task}:"), err
    assert not out.exists() or not any(out.rglob("*.json*"))  # nothing written
    # a list whose first task honours --num_fewshot and whose second refuses it: refused before anything runs
    rc = main(["--model", str(ckpt), "--tasks", "gsm8k,wikitext", "--limit", "1", "--device", "cpu",
               "--num_fewshot", "2", "--out", str(out)])
    assert rc == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith("error: task wikitext:")
    assert not out.exists() or not any(out.rglob("*.json*"))


@pytest.mark.skipif(not DATA, reason="needs MHAR_DATA_DIR")
def test_num_fewshot_honoured_and_lm_eval_hash_meanings(ckpt, tmp_path):
    lm = MharLM(pretrained=str(ckpt), device="cpu", max_gen_toks=2, max_length=512)
    res = evaluate_model(ckpt, ["gsm8k"], tmp_path, limit=1, lm=lm, bootstrap_iters=0, num_fewshot=1)["gsm8k"]
    assert res["num_fewshot"] == 1
    rec = json.loads((tmp_path / "gsm8k" / "samples.jsonl").read_text().splitlines()[0])
    ctx = res["lm_eval"]["config"]  # the prompt: one worked example, then the question
    question = json.loads(open(os.path.join(DATA, "gsm8k", "test.jsonl")).readline())["question"]
    assert ctx["num_fewshot"] == 1
    # lm-eval's prompt_hash = sha256 of the first request's context; it holds exactly one "Question:" shot
    assert len(rec["arguments_hash"]) == 64 and rec["arguments_hash"] != rec["prompt_hash"]
    lm_args = []
    lm.generate_until = (lambda orig: (lambda reqs, **kw: lm_args.extend(r.args[0] for r in reqs) or orig(reqs, **kw)))(
        lm.generate_until)
    evaluate_model(ckpt, ["gsm8k"], tmp_path / "again", limit=1, lm=lm, bootstrap_iters=0, num_fewshot=1)
    (prompt,) = lm_args
    assert prompt.count("Question:") == 2 and prompt.endswith(f"Question: {question}\nAnswer:")
    assert rec["prompt_hash"] == hashlib.sha256(prompt.encode("utf-8")).hexdigest()
