"""The adapter equals lm-eval's own ``hf`` model on a Llama-3-style tokenizer (separate BOS that the
tokenizer's template prepends) and a tiny converted Llama: per-sample log-likelihoods on WikiText-2,
LAMBADA and HellaSwag, and GSM8K greedy generations (stock local task YAMLs, real data)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("lm_eval")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from eval.adapter import MharLM  # noqa: E402
from mhar import cpt  # noqa: E402
from mhar.runs.checkpoint import save_model  # noqa: E402

torch.set_num_threads(1)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
DATA = os.environ.get("MHAR_DATA_DIR")
MAX_LEN = 96

_CORPUS = [
    "The cat sat on the mat. Janet's ducks lay 16 eggs per day; she eats three for breakfast.",
    "Question: How many apples are left? Answer: 12 - 5 = 7 apples are left. #### 7",
    "A man is sitting on a roof. He starts pulling up roofing on a roof, then he is using wrap.",
    " = Valkyria Chronicles III = \n Senjou no Valkyria 3 : Unrecorded Chronicles is a tactical role-playing game.",
] * 20


def llama3_style_tokenizer(folder: Path) -> Path:
    """A small byte-level BPE whose template prepends a separate BOS token (Llama-3 layout)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]),
    ])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
         "model_max_length": MAX_LEN, "clean_up_tokenization_spaces": False}))
    return folder


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(hf dir with weights + tokenizer, mhar model.pt of the same weights)."""
    root = tmp_path_factory.mktemp("llama3ish")
    hf_dir = llama3_style_tokenizer(root / "hf")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * MAX_LEN,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=tok.token_to_id(BOS),
                      eos_token_id=tok.token_to_id(EOS), rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(30)  # a peaked next-token distribution: greedy is far from ties
    hf.save_pretrained(hf_dir)
    model, report = cpt.convert_hf_llama(hf, variant="baseline")
    assert report.exact
    path = save_model(root / "model.pt", model, str(hf_dir))
    return hf_dir, path


def _hf(hf_dir):
    from lm_eval.api.registry import get_model

    return get_model("hf").create_from_arg_obj(
        {"pretrained": str(hf_dir), "dtype": "float32", "max_length": MAX_LEN},
        {"batch_size": 2, "device": "cpu"})


def _mhar(path, **kw):
    return MharLM(pretrained=str(path), device="cpu", batch_size=2, max_length=MAX_LEN, **kw)


def test_tokenizer_follows_transformers(pair):
    """Same ids as the transformers tokenizer for every encode path; BOS is the prefix token."""
    hf_dir, path = pair
    ours, ref = _mhar(path), _hf(hf_dir)
    bos = ref.tokenizer.bos_token_id
    assert ours.prefix_token_id == ref.prefix_token_id == bos != ours.eot_token_id
    for text in ["The cat sat", " leading space", BOS + "already has one", ""]:
        assert ours.tok_encode(text) == ref.tok_encode(text)
        assert ours.tok_encode(text, add_special_tokens=False) == ref.tok_encode(text, add_special_tokens=False)
    assert ours.tok_encode("The cat")[0] == bos and ours.tok_encode(BOS + "x").count(bos) == 1
    assert _mhar(path, add_bos_token=False).tok_encode("The cat")[0] != bos
    assert ours.tok_decode(ours.tok_encode("The cat sat")) == ref.tok_decode(ref.tok_encode("The cat sat"))


def _run(lm, task, limit, **kw):
    from lm_eval.evaluator import simple_evaluate

    from eval.data_local import DataSource

    tm = DataSource.from_env().task_manager()
    res = simple_evaluate(model=lm, tasks=[task], limit=limit, log_samples=True, task_manager=tm,
                          bootstrap_iters=0, **kw)
    return sorted(res["samples"][task], key=lambda s: s["doc_id"])


@pytest.mark.skipif(not DATA, reason="needs MHAR_DATA_DIR (real WikiText-2, LAMBADA, HellaSwag, GSM8K)")
@pytest.mark.parametrize("task,limit", [("wikitext", 2), ("lambada_openai", 4), ("hellaswag", 3)])
def test_loglikelihoods_match_hf(pair, task, limit):
    hf_dir, path = pair
    a, b = _run(_hf(hf_dir), task, limit), _run(_mhar(path), task, limit)
    assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b] == list(range(limit))
    worst, n = 0.0, 0
    for sa, sb in zip(a, b):
        assert sa["arguments"] == sb["arguments"]
        for ra, rb in zip(sa["resps"], sb["resps"]):
            lla = ra[0][0] if isinstance(ra[0], (list, tuple)) else ra[0]
            llb = rb[0][0] if isinstance(rb[0], (list, tuple)) else rb[0]
            worst, n = max(worst, abs(float(lla) - float(llb))), n + 1
            if isinstance(ra[0], (list, tuple)):
                assert bool(ra[0][1]) == bool(rb[0][1])  # is_greedy
    assert n >= limit and worst <= 1e-4, f"{task}: max |dLL| = {worst:.3g} over {n} requests"


@pytest.mark.skipif(not DATA, reason="needs MHAR_DATA_DIR (real GSM8K)")
def test_gsm8k_generations_match_hf(pair):
    hf_dir, path = pair
    kw = {"gen_kwargs": "max_gen_toks=24"}  # context cut to MAX_LEN - 24 tokens once, as hf does
    a, b = _run(_hf(hf_dir), "gsm8k", 4, **kw), _run(_mhar(path), "gsm8k", 4, **kw)  # the 4 documents
    gens_a = [s["resps"][0][0] for s in a]
    gens_b = [s["resps"][0][0] for s in b]
    assert len({s["doc_id"] for s in a}) == 4 and gens_a == gens_b
    c = _run(_mhar(path, use_cache=False), "gsm8k", 4, **kw)  # the full-recompute path agrees too
    assert [s["resps"][0][0] for s in c] == gens_b
    assert any(g.strip() for g in gens_a)  # something was generated (not an empty-output tie)


def test_training_documents_are_encoded_as_evaluation_encodes(pair):
    """Training shards hold each document as the evaluation sees it (BOS first), then end-of-text."""
    from mhar.data.shards import _encode
    from mhar.data.tokenizer import get_tokenizer

    hf_dir, path = pair
    tok, lm = get_tokenizer(str(hf_dir)), _mhar(path)
    doc = "The cat sat on the mat."
    assert tok.bos_id is not None and tok.bos_id != tok.eot_id
    assert _encode(tok, doc).tolist() == lm.tok_encode(doc) + [tok.eot_id]
    assert _encode(tok, doc)[0] == tok.bos_id
