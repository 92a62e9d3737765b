"""End-to-end evaluation (eval/run.py + eval/tasks) on tiny subsets of the local data mirror.

Every task runs for two different tiny models; the per-document files must align
doc by doc with equal prompt hashes, and the aggregates must follow from the
per-document values (checked here with plain Python / statistics, not lm-eval).
Needs MHAR_DATA_DIR (layout of shared/data); tests are skipped with the reason otherwise.
"""
from __future__ import annotations

import csv
import io
import hashlib
import itertools
import json
import logging
import math
import os
import random
import re
import shutil
import statistics
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval")

from eval.adapter import MharLM  # noqa: E402
from eval.data_local import DataSource  # noqa: E402
from eval.records import arguments_hash  # noqa: E402
from eval.run import Subset, evaluate_model, main  # noqa: E402
from mhar.atomic import sha256_path  # noqa: E402
from mhar.runs.checkpoint import save_model, write_sha256  # noqa: E402
from mhar.model.config import model_config  # noqa: E402
from mhar.model.transformer import Transformer  # noqa: E402
from mhar.data.tokenizer import ByteTokenizer  # noqa: E402

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]
DATA_DIR = os.environ.get("MHAR_DATA_DIR")
HAVE_DATA = bool(DATA_DIR) and Path(DATA_DIR).is_dir()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="MHAR_DATA_DIR unset or missing: local-mirror evaluation "
                                                      "needs the shared/data layout (see shared/data/MANIFEST.md)")
LOGLIK_TASKS = ["wikitext", "lambada_openai", "hellaswag", "gpqa_main_zeroshot"]
SUBSET = "random:3:5"
GSM_SUBSET = "first:3"


def _need(task: str) -> None:
    missing = DataSource.from_env().missing_files(task)
    if missing:
        pytest.skip(f"{task}: local data file(s) missing: {', '.join(map(str, missing))}")


def _read(out: Path, task: str) -> tuple[dict, list[dict]]:
    res = json.loads((out / task / "results.json").read_text())
    samples = [json.loads(line) for line in (out / task / "samples.jsonl").read_text().splitlines()]
    return res, samples


def _jsonl_rows(rel: str) -> list[dict]:
    return [json.loads(line) for line in Path(DATA_DIR, rel).read_text(encoding="utf-8").splitlines()]


# --- subset selection (no data needed) --------------------------------------------------------
def test_subset_parsing_and_selection():
    assert Subset.parse(None).doc_ids(4) == [0, 1, 2, 3]
    assert Subset.parse("first:200").doc_ids(1319) == list(range(200))
    assert Subset.parse("first:200").doc_ids(60) == list(range(60))  # capped at the set size
    r = Subset.parse("random:50:3")
    ids = r.doc_ids(1000)
    assert ids == sorted(set(ids)) and len(ids) == 50 and max(ids) < 1000
    assert ids == Subset.parse("random:50:3").doc_ids(1000)  # fixed seed -> same documents
    assert ids != Subset.parse("random:50:4").doc_ids(1000)
    assert str(r) == "random:50:3"
    for bad in ("first", "random:5", "first:x", "last:3", "first:0"):
        with pytest.raises(ValueError, match="subset"):
            Subset.parse(bad)


# --- two models through every task --------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two different debug models evaluated on every available task; returns (out_a, out_b)."""
    if not HAVE_DATA:
        pytest.skip("MHAR_DATA_DIR unset or missing")
    root = tmp_path_factory.mktemp("evalruns")
    torch.manual_seed(0)
    a = save_model(root / "a" / "model.pt", Transformer(model_config("debug")), "byte")
    torch.manual_seed(1)
    b = save_model(root / "b" / "model.pt", Transformer(model_config("debug", tie_embeddings=False,
                                                                      residual={"variant": "mhar", "heads": 4})),
                   "byte")
    src = DataSource.from_env()
    ll_tasks = [t for t in LOGLIK_TASKS if not src.missing_files(t)]
    if ll_tasks:  # model A through the command line, model B through the Python API
        assert main(["--model", str(a), "--tasks", ",".join(ll_tasks), "--out", str(root / "out_a"),
                     "--subset", SUBSET, "--device", "cpu", "--batch-size", "8", "--bootstrap-iters", "200"]) == 0
        states = random.getstate(), torch.get_rng_state()
        evaluate_model(b, ll_tasks, root / "out_b", subset=SUBSET, device="cpu", bootstrap_iters=200)
        assert random.getstate() == states[0] and torch.equal(torch.get_rng_state(), states[1])  # caller RNG kept
    if not src.missing_files("gsm8k"):  # short generations keep CI fast (the task default is 256 tokens)
        for path, out in ((a, "out_a"), (b, "out_b")):
            lm = MharLM(pretrained=str(path), device="cpu", batch_size=4, max_gen_toks=16)
            evaluate_model(path, ["gsm8k"], root / out, subset=GSM_SUBSET, lm=lm, bootstrap_iters=200)
    for out in ("out_a", "out_b"):  # timing, for the CI budget
        print({p.parent.name: json.loads(p.read_text())["wall_s"] for p in (root / out).glob("*/results.json")})
    return root / "out_a", root / "out_b"


@needs_data
@pytest.mark.parametrize("task", LOGLIK_TASKS + ["gsm8k"])
def test_two_models_align_doc_by_doc(runs, task):
    _need(task)
    out_a, out_b = runs
    (ra, sa), (rb, sb) = _read(out_a, task), _read(out_b, task)
    n_docs = ra["n_docs_total"]
    expected = Subset.parse(GSM_SUBSET if task == "gsm8k" else SUBSET).doc_ids(n_docs)
    for res, samples in ((ra, sa), (rb, sb)):
        assert res["doc_ids"] == [s["doc_id"] for s in samples] == expected
        assert res["n"] == len(samples) == 3
        assert res["data_source"].startswith("local:") and res["data_files"]
        assert res["provenance"]["packages"]["lm_eval"]
    assert ra["model"] != rb["model"]
    for x, y in zip(sa, sb):
        assert (x["doc_id"], x["prompt_hash"], x["arguments_hash"], x["target"]) == \
            (y["doc_id"], y["prompt_hash"], y["arguments_hash"], y["target"])
        assert len(x["prompt_hash"]) == len(x["arguments_hash"]) == 64 and x["metrics"].keys() == y["metrics"].keys()
    outputs = lambda samples: [(s["responses"], s.get("generation")) for s in samples]  # noqa: E731
    assert outputs(sa) != outputs(sb)  # two different models really ran


def _check_mean_metric(res: dict, samples: list[dict], name: str) -> None:
    vals = [float(s["metrics"][name]) for s in samples]
    assert res["metrics"][name] == pytest.approx(statistics.fmean(vals))
    base, sep, filt = name.partition(",")
    assert res["metrics"][f"{base}_stderr{sep}{filt}"] == pytest.approx(statistics.stdev(vals) / math.sqrt(len(vals)))


@needs_data
@pytest.mark.parametrize("task", ["hellaswag", "gpqa_main_zeroshot"])
def test_multiple_choice_metrics_follow_from_loglikelihoods(runs, task):
    _need(task)
    for out in runs:
        res, samples = _read(out, task)
        assert res["num_fewshot"] == 0
        for s in samples:
            lls = [ll for ll, _ in s["responses"]["none"]]
            assert len(lls) == 4
            gold = s["target"] if task == "hellaswag" else "ABCD".index(s["target"].strip("()"))
            assert s["metrics"]["acc"] == float(max(range(4), key=lls.__getitem__) == gold)
        for name in ("acc", "acc_norm"):
            _check_mean_metric(res, samples, name)


@needs_data
def test_hellaswag_gold_labels_match_raw_file(runs):
    _need("hellaswag")
    rows = _jsonl_rows("hellaswag/validation.jsonl")
    _, samples = _read(runs[0], "hellaswag")
    for s in samples:
        assert s["target"] == int(rows[s["doc_id"]]["label"])
        # the task YAML's metadata cluster_field: questions sharing a source video / article are one cluster
        assert s["group"] == rows[s["doc_id"]]["source_id"]


@needs_data
def test_lambada_prompts_and_metrics(runs):
    _need("lambada_openai")
    rows = _jsonl_rows("lambada_openai/lambada_test.jsonl")
    res, samples = _read(runs[0], "lambada_openai")
    for s in samples:
        text = rows[s["doc_id"]]["text"]
        ctx, last = text.rsplit(" ", 1)
        assert s["target"] == " " + last
        assert s["arguments_hash"] == arguments_hash([(ctx, " " + last)])  # the stock prompt, rebuilt by hand
        assert s["prompt_hash"] == hashlib.sha256(ctx.encode("utf-8")).hexdigest()  # lm-eval's meaning
        (ll, greedy), = s["responses"]["none"]
        assert s["metrics"]["acc"] == int(greedy) and s["metrics"]["perplexity"] == pytest.approx(ll)
    lls = [s["responses"]["none"][0][0] for s in samples]
    assert res["metrics"]["perplexity"] == pytest.approx(math.exp(-statistics.fmean(lls)), rel=1e-9)
    assert res["metrics"]["perplexity_stderr"] > 0  # bootstrap stderr present
    _check_mean_metric(res, samples, "acc")


@needs_data
def test_wikitext_word_perplexity_and_bits_per_byte(runs):
    _need("wikitext")
    pages = [r["page"] for r in _jsonl_rows("wikitext-2-raw-v1/test.jsonl")]  # the stock eval split is test
    res, samples = _read(runs[0], "wikitext")
    ll = [s["responses"]["none"][0] for s in samples]
    words = [len(re.split(r"\s+", pages[s["doc_id"]])) for s in samples]
    nbytes = [len(pages[s["doc_id"]].encode("utf-8")) for s in samples]
    for s, w, b in zip(samples, words, nbytes):
        assert s["metrics"]["word_perplexity"][1] == w and s["metrics"]["bits_per_byte"][1] == b
    assert res["metrics"]["word_perplexity"] == pytest.approx(math.exp(-sum(ll) / sum(words)), rel=1e-9)
    assert res["metrics"]["bits_per_byte"] == pytest.approx(-sum(ll) / sum(nbytes) / math.log(2), rel=1e-9)
    assert res["model_info"]["max_length"] == 256  # the debug preset's training context
    # lm-eval gives no stderr here; eval.run bootstraps over documents. Exact bootstrap SD by enumeration:
    draws = [-sum(ll[i] for i in idx) / sum(nbytes[i] for i in idx) / math.log(2)
             for idx in itertools.product(range(len(ll)), repeat=len(ll))]
    assert "bootstrap" in res["stderr_source"]["bits_per_byte"]
    assert res["metrics"]["bits_per_byte_stderr"] == pytest.approx(statistics.pstdev(draws), rel=0.25)


@needs_data
def test_gsm8k_five_shot_strict_and_flexible(runs):
    _need("gsm8k")
    rows = _jsonl_rows("gsm8k/test.jsonl")
    res, samples = _read(runs[0], "gsm8k")
    assert res["num_fewshot"] == 5
    for s in samples:
        assert s["target"] == rows[s["doc_id"]]["answer"]
        assert isinstance(s["generation"], str) and "Question:" not in s["generation"]
        assert set(s["responses"]) == {"strict-match", "flexible-extract"}
    for name in ("exact_match,strict-match", "exact_match,flexible-extract"):
        _check_mean_metric(res, samples, name)


@needs_data
def test_missing_local_file_and_unknown_task_are_clear_errors(tmp_path):
    lm = MharLM.from_model(Transformer(model_config("debug")), ByteTokenizer(),
                           device="cpu")
    with pytest.raises(FileNotFoundError, match="lambada_test.jsonl"):
        evaluate_model("mem", ["lambada_openai"], tmp_path, limit=2, lm=lm, data_dir=tmp_path)
    with pytest.raises(KeyError, match="no_such_task"):
        evaluate_model("mem", ["no_such_task"], tmp_path, limit=2, lm=lm)


def test_cli_bad_input_is_one_line_error_and_never_overwrites(tmp_path, capsys):
    good = save_model(tmp_path / "run" / "model.pt", Transformer(model_config("debug")), "byte")
    torch.save({"rng": np.random.get_state()}, tmp_path / "state.pt")  # pickled objects
    write_sha256(tmp_path / "state.pt")  # even with its checksum it is refused (not an export, never unpickled)
    (tmp_path / "trunc.pt").write_bytes(good.read_bytes()[:500])
    (tmp_path / "trunc.pt.sha256").write_text(sha256_path(good).read_text())  # cut short in transfer
    (tmp_path / "bare.pt").write_bytes(good.read_bytes())  # copied without its checksum: never loaded
    for model, says in ((tmp_path / "trunc.pt", "corrupt"), (tmp_path / "state.pt", "pass RUN_DIR/model.pt"),
                        (tmp_path / "nope.pt", "no such checkpoint"), (tmp_path / "bare.pt", "no checksum file")):
        assert main(["--model", str(model), "--tasks", "wikitext", "--out", str(tmp_path / "o"), "--limit", "2"]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()
    # results of another model (or subset) in --out are refused before anything runs
    prior = tmp_path / "o" / "wikitext" / "results.json"
    prior.parent.mkdir(parents=True)
    prior.write_text(json.dumps({"model": str(tmp_path / "other.pt"), "subset": {"spec": "first:2"}}))
    before = prior.read_bytes()
    for args in (["--model", str(good), "--limit", "2"], ["--model", str(tmp_path / "other.pt"), "--limit", "3"]):
        assert main([*args, "--tasks", "wikitext", "--out", str(tmp_path / "o")]) == 2
        assert "refusing to overwrite" in capsys.readouterr().err
    assert prior.read_bytes() == before
    # the Python API refuses too, before loading anything (a missing model would otherwise be the error)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        evaluate_model(tmp_path / "nope.pt", "wikitext", tmp_path / "o", limit=2)
    assert prior.read_bytes() == before


# --- GPQA stays encrypted on disk ---------------------------------------------------------------
def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                st = os.stat(p)
            except OSError:
                continue
            snap[p] = (st.st_mtime_ns, st.st_size)
    return snap


@needs_data
def test_gpqa_text_never_written_to_disk(runs):
    _need("gpqa_main_zeroshot")
    import datasets

    with zipfile.ZipFile(Path(DATA_DIR, "gpqa", "dataset.zip")) as zf:  # decrypted in memory, for the scan only
        raw = zf.read("dataset/gpqa_main.csv", pwd=b"deserted-untie-orchid").decode("utf-8")
    rows = list(csv.DictReader(io.StringIO(raw)))
    needles = {r["Canary String"] for r in rows} | {r["Question"].strip()[:60] for r in rows}
    needles |= {r["Correct Answer"].strip()[:60] for r in rows if len(r["Correct Answer"].strip()) >= 25}
    needles = [n.encode("utf-8") for n in needles if n]

    watched = [REPO, Path(datasets.config.HF_DATASETS_CACHE)]
    before = {str(w): _snapshot(w) for w in watched}
    out = REPO / "results" / "eval" / f".pytest-gpqa-{uuid.uuid4().hex[:8]}"  # inside the repo on purpose
    parent_existed = out.parent.exists()
    try:
        torch.manual_seed(0)
        lm = MharLM.from_model(Transformer(model_config("debug")), ByteTokenizer(),
                               device="cpu")
        evaluate_model("mem", ["gpqa_main_zeroshot"], out, subset="first:2", lm=lm, bootstrap_iters=0)
        assert (out / "gpqa_main_zeroshot" / "samples.jsonl").is_file()
        written = []
        for w in watched:
            after = _snapshot(w)
            written += [p for p, st in after.items() if before[str(w)].get(p) != st]
        written += [str(p) for p in runs[0].rglob("*") if p.is_file()]  # the fixture's outputs too
        assert any("gpqa_main_zeroshot" in p for p in written)
        lm_eval_samples = []
        for p in written:
            try:
                blob = Path(p).read_bytes()
            except OSError:
                continue
            hits = sum(n in blob for n in needles)
            if hits and re.search(r"/lm_eval/[^/]+/samples_gpqa_main_zeroshot_[^/]+\.jsonl$", p):
                lm_eval_samples.append(p)  # lm-eval's own samples file carries each doc, as `lm_eval --log_samples`
                continue
            assert not hits, f"decrypted GPQA text ({hits} question/canary strings) found in {p}"  # not echoed
        # ... only there, and never where git could commit it: the workflow's eval outputs are git-ignored
        ours = [p for p in lm_eval_samples if p.startswith(str(out))]
        assert ours, "lm-eval's samples file of the GPQA run was not written"
        ignored = __import__("subprocess").run(["git", "check-ignore", "-q", ours[0]], cwd=REPO)
        assert ignored.returncode in (0, 128), f"{ours[0]} is not git-ignored"  # 128: not a git checkout
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if not parent_existed:
            shutil.rmtree(out.parent, ignore_errors=True)


# --- Hugging Face checkpoints: lm-eval's own HF model as an independent reference -----------------
def test_hf_model_and_our_adapter_agree_on_identical_weights(tmp_path):
    """A Llama-shaped debug model, exported to transformers format, scored by lm-eval's HF model
    (``hf:<dir>``) and by our adapter from model.pt: same prompts, same log-likelihoods."""
    if not HAVE_DATA:
        pytest.skip("MHAR_DATA_DIR unset or missing")
    tok_json = Path(DATA_DIR, "tokenizers", "gpt2", "tokenizer.json")
    if not tok_json.is_file():
        pytest.skip(f"GPT-2 tokenizer missing: {tok_json}")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="lm-eval's HF model needs accelerate (pip install 'mhar[eval]')")
    cpt = pytest.importorskip("mhar.cpt")
    tasks = [t for t in ("wikitext", "lambada_openai", "hellaswag") if not DataSource.from_env().missing_files(t)]
    if not tasks:
        pytest.skip("no local data for wikitext / lambada_openai / hellaswag")
    torch.manual_seed(0)
    model = Transformer(model_config("debug", vocab_size=50257, qk_norm=False, tie_embeddings=False))
    ours = save_model(tmp_path / "model.pt", model, str(tok_json))
    hf_dir = cpt.export_hf_llama(model, tmp_path / "hf", tok_json)
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}))
    kw = dict(subset="first:2", device="cpu", bootstrap_iters=0)
    evaluate_model(f"hf:{hf_dir}", tasks, tmp_path / "out_hf", **kw)
    evaluate_model(ours, tasks, tmp_path / "out_mhar", **kw)
    for task in tasks:
        (rh, sh), (rm, sm) = _read(tmp_path / "out_hf", task), _read(tmp_path / "out_mhar", task)
        assert rh["model_kind"] == "hf" and rm["model_kind"] == "mhar"
        assert rh["model_info"]["max_length"] == rm["model_info"]["max_length"] == 256
        for h, m in zip(sh, sm):
            assert (h["doc_id"], h["prompt_hash"], h["arguments_hash"]) == (m["doc_id"], m["prompt_hash"], m["arguments_hash"])
            vh, vm = _floats(h["responses"]["none"]), _floats(m["responses"]["none"])
            assert len(vh) == len(vm) > 0 and vh == pytest.approx(vm, rel=1e-5, abs=1e-3)


def _floats(x) -> list[float]:
    """Log-likelihoods in a response structure (bools, e.g. is_greedy, are left out)."""
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _floats(item)]
    return [] if isinstance(x, bool) else [float(x)]


# --- the task registry: stock tasks + eval/tasks + the user's tasks_dir ------------------------------
def test_user_tasks_dir_yaml_with_any_file_name(tmp_path, capsys):
    """A task of the user's own folder is found by its `task:` name (the file is named otherwise)."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"context": f"the number {i} is", "answer": str(i)}) + "\n" for i in range(4)))
    mine = tmp_path / "my_tasks"
    mine.mkdir()
    (mine / "benchmark_v2.yaml").write_text(
        "task: tiny_numbers\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(docs))}\n"
        "output_type: loglikelihood\ntest_split: test\ndoc_to_text: '{{context}}'\ndoc_to_target: ' {{answer}}'\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")
    torch.manual_seed(0)
    model = save_model(tmp_path / "run" / "model.pt", Transformer(model_config("debug")), "byte")
    with pytest.raises(KeyError, match="unknown task 'tiny_numbers'"):
        evaluate_model(model, ["tiny_numbers"], tmp_path / "o", limit=2, device="cpu")
    assert main(["--model", str(model), "--tasks", "tiny_numbers", "--tasks-dir", str(mine), "--out",
                 str(tmp_path / "o"), "--limit", "3", "--device", "cpu", "--bootstrap-iters", "0"]) == 0
    res, samples = _read(tmp_path / "o", "tiny_numbers")
    assert res["n"] == len(samples) == 3 and res["lm_eval"]["config"]["task"] == "tiny_numbers"
    assert res["lm_eval"]["config"]["metadata"]["config_source"] == str(mine / "benchmark_v2.yaml")
    assert [s["target"] for s in samples] == [" 0", " 1", " 2"]
    assert (tmp_path / "o" / "tiny_numbers" / res["lm_eval_files"]["samples"]).is_file()
    # a misspelt name: one line naming it, with the closest registered names
    capsys.readouterr()
    assert main(["--model", str(model), "--tasks", "tiny_numbrs", "--tasks-dir", str(mine), "--out",
                 str(tmp_path / "o2"), "--limit", "1", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown task 'tiny_numbrs'") and "tiny_numbers" in err[0]


@needs_data
def test_local_tasks_load_without_lm_eval_warnings(caplog):
    """Every WikiText evaluation printed 8 lm-eval warnings (metrics without aggregation / direction, and the
    --metadata advice for custom loaders); the YAMLs now state what lm-eval defaulted to, and the advice,
    which does not apply to these loaders, is filtered where lm-eval logs it."""
    _need("wikitext")
    from lm_eval.tasks import get_task_dict

    caplog.set_level(logging.INFO, logger="lm_eval")
    tasks = get_task_dict(["wikitext", "lambada_openai"], DataSource.from_env().task_manager())
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("lm_eval") and r.levelno >= logging.WARNING]
    assert not warned, warned
    wt = tasks["wikitext"]
    assert wt.aggregation()["word_perplexity"].__name__ == "weighted_perplexity"
    assert wt.aggregation()["bits_per_byte"].__name__ == "bits_per_byte"
    assert wt.higher_is_better() == {"word_perplexity": False, "byte_perplexity": False, "bits_per_byte": False}


def test_a_declared_primary_metric_the_task_does_not_produce_is_one_error_line(tmp_path, capsys):
    """`metadata: primary_metric: f1` on a task that computes acc was evaluated and tabulated on acc without a
    word: refused in one line naming the task, the metric and the metrics it produces, before anything runs."""
    from eval.task_setup import check_primary_metric

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"context": f"the number {i} is", "answer": str(i)}) + "\n" for i in range(4)))
    mine = tmp_path / "my_tasks"
    mine.mkdir()
    (mine / "numbers.yaml").write_text(
        "task: tiny_numbers_f1\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(docs))}\n"
        "output_type: loglikelihood\ntest_split: test\ndoc_to_text: '{{context}}'\ndoc_to_target: ' {{answer}}'\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n  primary_metric: f1\n")
    torch.manual_seed(0)
    model = save_model(tmp_path / "run" / "model.pt", Transformer(model_config("debug")), "byte")
    capsys.readouterr()
    assert main(["--model", str(model), "--tasks", "tiny_numbers_f1", "--tasks-dir", str(mine), "--out",
                 str(tmp_path / "o"), "--limit", "2", "--device", "cpu", "--bootstrap-iters", "0"]) == 2
    text = capsys.readouterr().err
    err = [ln for ln in text.splitlines() if ln.startswith("error:")]  # (datasets' progress bars aside)
    assert len(err) == 1 and "Traceback" not in text, text
    assert err[0].startswith("error: task tiny_numbers_f1: metadata.primary_metric 'f1' is not a metric it produces "
                             "(acc)"), err[0]
    assert str(mine / "numbers.yaml") in err[0]
    assert not list((tmp_path / "o").rglob("results.json")) and not list((tmp_path / "o").rglob("samples.jsonl"))
    # the same check on what lm-eval produced (its result keys), before our records are written
    with pytest.raises(ValueError, match=r"'f1' is not a metric it produces \(acc, perplexity\)"):
        check_primary_metric("t", {"primary_metric": "f1"},
                             ["alias", "acc,none", "acc_stderr,none", "perplexity,none", "perplexity_stderr,none"])
    check_primary_metric("t", {"primary_metric": "acc"}, ["alias", "acc,none"])
    check_primary_metric("t", {}, ["acc,none"])  # a task that names none: the tables' default order decides
