"""Data pipeline: corpora, held-out splits, tokenize-once cache, packing, paired batch order."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch

from mhar.data.batches import BatchOrder, PackedTokens, TrainData, unigram_entropy
from mhar.data.corpus import DataError, resolve_corpus
from mhar.data.shards import build_shards
from mhar.data.config import DataConfig

DATA_DIR = os.environ.get("MHAR_DATA_DIR")
EOT = 256  # byte tokenizer


def _docs_from_stream(stream: np.ndarray) -> list[bytes]:
    """Split a byte-tokenizer stream at end-of-text ids (every document is followed by one)."""
    assert stream[-1] == EOT
    cuts = np.flatnonzero(stream == EOT)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [bytes(stream[s:e].astype(np.uint8)) for s, e in zip(starts, cuts)]


def test_tail_holdout_splits_every_document_without_overlap(tmp_path):
    docs = [f"doc {i}\n" + "".join(f"line {i}.{j} text\n" for j in range(40)) for i in range(3)]
    for i, d in enumerate(docs):
        (tmp_path / f"d{i}.txt").write_text(d)
    cfg = DataConfig(corpus=str(tmp_path), cache_dir=str(tmp_path / "cache"), seq_len=8, val_fraction=0.2)
    sh = build_shards(cfg, vocab_size=257, log=lambda m: None)
    assert sh.meta["holdout_rule"] == "tail"  # few documents -> tail of each
    train, val = _docs_from_stream(np.asarray(sh.train)), _docs_from_stream(np.asarray(sh.val))
    assert len(train) == len(val) == 3
    for d, a, b in zip(docs, train, val):
        assert a + b == d.encode()  # nothing lost, nothing shared
        assert a.endswith(b"\n") and 0.15 < len(b) / len(d) < 0.25


def test_document_holdout_is_deterministic_and_disjoint(tmp_path):
    rows = [{"text": f"document number {i} " * (1 + i % 5)} for i in range(400)]
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(corpus=str(f), cache_dir=str(tmp_path / "cache"), seq_len=8, val_fraction=0.1)
    sh = build_shards(cfg, vocab_size=257, log=lambda m: None)
    assert sh.meta["holdout_rule"] == "documents"
    train, val = set(_docs_from_stream(np.asarray(sh.train))), set(_docs_from_stream(np.asarray(sh.val)))
    assert not train & val and train | val == {r["text"].encode() for r in rows}
    assert 20 <= len(val) <= 60  # ~10% of 400 (binomial sd ~6)
    sh2 = build_shards(DataConfig(corpus=str(f), cache_dir=str(tmp_path / "other"), seq_len=8, val_fraction=0.1),
                       vocab_size=257, log=lambda m: None)
    assert np.array_equal(sh.val, sh2.val)


def test_explicit_validation_split_is_used(tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"t": f"train {i}"}) + "\n" for i in range(50)))
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps({"t": f"valid {i}"}) + "\n" for i in range(10)))
    cfg = DataConfig(corpus=str(tmp_path), text_field="t", cache_dir=str(tmp_path / "cache"), seq_len=8)
    sh = build_shards(cfg, vocab_size=257, log=lambda m: None)
    assert sh.meta["holdout_rule"] == "split"
    assert _docs_from_stream(np.asarray(sh.val)) == [f"valid {i}".encode() for i in range(10)]
    assert len(_docs_from_stream(np.asarray(sh.train))) == 50


def test_cache_is_built_once_and_keyed_by_tokenizer(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("hello world\n" * 200)
    logs: list[str] = []
    cfg = DataConfig(corpus=str(f), cache_dir=str(tmp_path / "cache"), seq_len=8)
    a = build_shards(cfg, 257, logs.append)
    b = build_shards(cfg, 257, logs.append)
    assert len(logs) == 1 and a.path == b.path and isinstance(b.train, np.memmap)
    gpt2 = Path(DATA_DIR or "/nonexistent") / "tokenizers" / "gpt2" / "tokenizer.json"
    if gpt2.is_file():
        c = build_shards(DataConfig(corpus=str(f), tokenizer=str(gpt2), cache_dir=str(tmp_path / "cache"), seq_len=8),
                         50257, logs.append)
        assert c.path != a.path and c.meta["eot_id"] == 50256 and c.train.dtype == np.uint16
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(gpt2)).encode("hello world\n" * 10).ids
        assert list(c.train[:len(ids)]) == ids


def test_packing_covers_the_stream_without_padding():
    stream = np.arange(103, dtype=np.uint16)
    p = PackedTokens(stream, seq_len=10)
    assert len(p) == 10  # (103 - 1) // 10
    x, y = p.get(np.arange(len(p)))
    assert x.dtype == torch.int64 and x.shape == (10, 10)
    assert torch.equal(x.flatten(), torch.arange(100)) and torch.equal(y, x + 1)


def test_batch_order_is_a_seeded_permutation_per_epoch_and_splits_over_ranks():
    n, G = 10, 4
    order = BatchOrder(n, G, seed=3)
    samples = np.concatenate([order.step_indices(s) for s in range(5)])  # 20 samples = 2 epochs
    assert sorted(samples[:10]) == list(range(10)) and sorted(samples[10:]) == list(range(10))
    assert not np.array_equal(samples[:10], samples[10:])
    again = BatchOrder(n, G, seed=3)
    assert all(np.array_equal(order.step_indices(s), again.step_indices(s)) for s in (4, 0, 7))
    assert not np.array_equal(BatchOrder(n, G, seed=4).step_indices(0), order.step_indices(0))
    for step in range(3):
        parts = [mb for r in range(2) for mb in order.rank_micro_batches(step, r, world=2, micro=1)]
        assert np.array_equal(np.concatenate(parts), order.step_indices(step))
    with pytest.raises(DataError, match="global_batch"):
        order.rank_micro_batches(0, 0, world=3, micro=1)


def test_train_data_batches_depend_only_on_data_config(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("".join(f"line {i}\n" for i in range(2000)))
    cfg = DataConfig(corpus=str(f), cache_dir=str(tmp_path / "cache"), seq_len=16, val_tokens=64)
    d1 = TrainData(build_shards(cfg, 257, lambda m: None), cfg, global_batch=8, seed=0)
    d2 = TrainData(build_shards(cfg, 50000, lambda m: None), cfg, global_batch=8, seed=0)  # other model vocab
    b1 = [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y in d1.micro_batches(5, micro=4)]
    b2 = [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y in d2.micro_batches(5, micro=4)]
    assert b1 == b2 and len(b1) == 2
    assert d1.n_val == 4 and sum(len(x) for x, _ in d1.val_batches(micro=3)) == 4


def test_synthetic_corpus_is_deterministic_zipf(tmp_path):
    cfg = DataConfig(corpus="synthetic:50000:100", seq_len=16)
    a, b = build_shards(cfg, 100), build_shards(cfg, 100)
    assert np.array_equal(a.train, b.train) and not np.array_equal(a.train[:1000], a.val[:1000])
    assert a.train.min() >= 0 and a.train.max() == 99  # 99 = end-of-text
    counts = np.bincount(a.train[a.train < 99], minlength=99)
    assert counts[0] > counts[1] > counts[10] > counts[90]
    with pytest.raises(DataError, match="exceeds model.vocab_size"):
        build_shards(cfg, 50)


def test_unigram_entropy_matches_scipy():
    x = np.random.default_rng(0).integers(0, 7, size=1000)
    assert unigram_entropy(x) == pytest.approx(scipy.stats.entropy(np.bincount(x)))


def test_clear_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("MHAR_DATA_DIR", raising=False)
    with pytest.raises(DataError, match="MHAR_DATA_DIR"):
        resolve_corpus("nltk_gutenberg", None)  # local-only corpus: no hub fallback
    hub = resolve_corpus("tinyshakespeare", None)  # falls back to the hub copy (not contacted here)
    assert hub.fingerprint() == {"kind": "hf", "path": "karpathy/tiny_shakespeare", "name": None, "text_field": "text"}
    with pytest.raises(DataError, match="no file or directory"):
        resolve_corpus("nope.txt", tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        build_shards(DataConfig(corpus="tinyshakespeare", data_dir=str(tmp_path / "nodir")), 257)
    evalonly = tmp_path / "evalonly"  # a directory with validation/test files only (like wikitext2 here)
    evalonly.mkdir()
    for split in ("validation", "test"):
        (evalonly / f"{split}.jsonl").write_text(json.dumps({"text": "x" * 1000}) + "\n")
    with pytest.raises(DataError, match="no training split"):
        build_shards(DataConfig(corpus=str(evalonly), cache_dir=str(tmp_path / "c")), 257)
    f = tmp_path / "a.txt"
    f.write_text("some text\n" * 100)
    with pytest.raises(DataError, match="unknown tokenizer"):
        build_shards(DataConfig(corpus=str(f), tokenizer="no_such_tok", cache_dir=str(tmp_path / "c")), 257)
    with pytest.raises(DataError, match="model.vocab_size"):
        build_shards(DataConfig(corpus=str(f), cache_dir=str(tmp_path / "c")), 100)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DataError, match="text_field"):
        build_shards(DataConfig(corpus=str(tmp_path / "bad.jsonl"), cache_dir=str(tmp_path / "c")), 257)


@pytest.mark.skipif(not DATA_DIR, reason="needs MHAR_DATA_DIR (local data mirror)")
def test_local_named_corpora(tmp_path):
    cfg = DataConfig(corpus="nltk_gutenberg", cache_dir=str(tmp_path), seq_len=64)
    corpus = resolve_corpus(cfg.corpus, Path(DATA_DIR))
    assert corpus.n_docs == 15
    ts = build_shards(DataConfig(corpus="tinyshakespeare", cache_dir=str(tmp_path), seq_len=64), 257, lambda m: None)
    raw = (Path(DATA_DIR) / "tinyshakespeare" / "input.txt").read_bytes()
    assert bytes(np.asarray(ts.train[:-1], dtype=np.uint8)) + bytes(np.asarray(ts.val[:-1], dtype=np.uint8)) == raw
    wt = build_shards(DataConfig(corpus=str(Path(DATA_DIR) / "tinyshakespeare" / "input.txt"), val_corpus="wikitext2",
                                 cache_dir=str(tmp_path), seq_len=64), 257, lambda m: None)
    assert wt.meta["val_docs"] == 60 and len(wt.train) == len(raw) + 1


def test_unreadable_corpora_give_one_line_errors(tmp_path):
    cache = str(tmp_path / "c")
    bad_utf8 = tmp_path / "a.jsonl"
    bad_utf8.write_bytes(json.dumps({"text": "ok " * 50}).encode() + b"\n" + b'{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"a.jsonl:2: not UTF-8 text \(byte 0xe9"):
        build_shards(DataConfig(corpus=str(bad_utf8), cache_dir=cache), 257)
    bad_json = tmp_path / "b.jsonl"
    bad_json.write_text(json.dumps({"text": "ok"}) + "\n{not json\n")
    with pytest.raises(DataError, match=r"b.jsonl:2: not valid JSON"):
        build_shards(DataConfig(corpus=str(bad_json), cache_dir=cache), 257)
    not_obj = tmp_path / "d.jsonl"
    not_obj.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"d.jsonl:1: expected a JSON object"):
        build_shards(DataConfig(corpus=str(not_obj), cache_dir=cache), 257)
    latin1 = tmp_path / "e.txt"
    latin1.write_bytes("Götterdämmerung, café\n".encode("latin-1") * 200)
    with pytest.raises(DataError, match=r"e.txt: not UTF-8 text .*iconv -f latin1"):
        build_shards(DataConfig(corpus=str(latin1), cache_dir=cache), 257)
    assert not [p for p in Path(cache).glob(".*") if p.is_dir()]  # failed builds leave no partial build


# --- parallel, deterministic, resumable tokenization -------------------------------------------------
def _long_text(seed: int, n_lines: int) -> str:
    """Hard-wrapped prose with the whitespace a tokenizer is picky about: blank lines, trailing and
    leading spaces, tabs, digits, punctuation runs, non-ASCII letters."""
    rng = np.random.default_rng(seed)
    words = ["the", "Cat", "sat", "on", "a", "mat,", "über", "naïve", "1234567", "--", "it's", "end.", "(x)", "wé're"]
    lines = []
    for _ in range(n_lines):
        line = " ".join(rng.choice(words, size=int(rng.integers(1, 12))))
        kind = rng.integers(0, 10)
        if kind == 0:
            line = ""  # blank line
        elif kind == 1:
            line += "  "  # trailing spaces before the newline
        elif kind == 2:
            line = "    " + line  # indented
        elif kind == 3:
            line = "\t" + line + "!!"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _train_bpe(tmp_path: Path, texts: list[str], name: str, pre=None, normalizer=None, bos: bool = False) -> str:
    """A small BPE tokenizer.json trained on the fixture (GPT-2-like byte-level by default)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre or pre_tokenizers.ByteLevel(add_prefix_space=False)
    if normalizer is not None:
        tk.normalizer = normalizer
    tk.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>"] + (["<s>"] if bos else [])
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos:
        tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tk.token_to_id("<s>"))])
    out = tmp_path / name
    out.mkdir()
    tk.save(str(out / "tokenizer.json"))
    return str(out)


def _reference_streams(cfg: DataConfig) -> dict:
    """The shards' definition: every document of the split stream encoded whole (``_encode``), in order."""
    from mhar.data.corpus import split_stream
    from mhar.data.shards import _encode, _token_dtype
    from mhar.data.tokenizer import get_tokenizer

    tok = get_tokenizer(cfg.tokenizer)
    _, stream = split_stream(resolve_corpus(cfg.corpus, None, cfg.text_field), cfg.holdout, cfg.val_fraction)
    out = {"train": [], "val": []}
    for split, text in stream:
        if text:
            out[split].append(_encode(tok, text))
    return {k: np.concatenate(v).astype(_token_dtype(tok.vocab_size)).tobytes() for k, v in out.items()}


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of ~300 characters and tasks of ~2000, so that a small fixture is cut and shared out."""
    import mhar.data.shards as D

    monkeypatch.setattr(D, "PIECE_CHARS", 300)
    monkeypatch.setattr(D, "TASK_CHARS", 2000)


@pytest.mark.parametrize("kind", ["bytelevel", "bos_template", "not_cuttable_metaspace", "not_cuttable_normalizer"])
def test_shards_are_the_same_for_any_worker_count_and_equal_whole_document_encoding(tmp_path, small_pieces, kind):
    from tokenizers import normalizers, pre_tokenizers

    import mhar.data.shards as D

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [_long_text(i, 120 + 60 * i) for i in range(5)]
    for i, t in enumerate(texts):
        (corpus / f"doc{i}.txt").write_text(t)
    extra = {"bytelevel": {}, "bos_template": {"bos": True},
             "not_cuttable_metaspace": {"pre": pre_tokenizers.Metaspace()},
             "not_cuttable_normalizer": {"normalizer": normalizers.Lowercase()}}[kind]
    tok = _train_bpe(tmp_path, texts, kind, **extra)
    enc = D._Encoder(__import__("mhar.data.tokenizer", fromlist=["get_tokenizer"]).get_tokenizer(tok))
    if kind == "bos_template":
        assert len(enc.prefix) == 1 and len(enc.suffix) == 0
    if kind.startswith("not_cuttable"):  # a prefix space per piece / a normalizer: documents stay whole
        assert not enc.cuttable and all(len(enc.pieces(t)) == 1 for t in texts)
    else:  # the fixture's documents really are cut into several pieces
        assert all(len(enc.pieces(t)) >= 5 for t in texts)
    ref = _reference_streams(DataConfig(corpus=str(corpus), tokenizer=tok, seq_len=16))
    for workers in (1, 2, 3):
        sh = build_shards(DataConfig(corpus=str(corpus), tokenizer=tok, cache_dir=str(tmp_path / f"c{workers}"),
                                     seq_len=16), 1000, lambda m: None, workers=workers)
        assert sh.meta["workers"] == workers
        assert (sh.path / "train.bin").read_bytes() == ref["train"], workers
        assert (sh.path / "val.bin").read_bytes() == ref["val"], workers


def test_gpt2_and_olmo2_pieces_encode_like_whole_documents():
    """On real text (the Gutenberg books) and real tokenizers: every cut is invisible in the ids."""
    if not DATA_DIR or not Path(DATA_DIR, "nltk_gutenberg").is_dir():
        pytest.skip("needs MHAR_DATA_DIR with nltk_gutenberg/ and tokenizers/")
    import mhar.data.shards as D
    from mhar.data.tokenizer import get_tokenizer

    text = Path(DATA_DIR, "nltk_gutenberg", "gutenberg", "carroll-alice.txt").read_bytes().decode("latin-1")
    text = text.replace("\r\n", "\n")
    for name in ("gpt2", "olmo2-dolma2"):
        tok = get_tokenizer(str(Path(DATA_DIR, "tokenizers", name, "tokenizer.json")))
        enc = D._Encoder(tok)
        pieces = enc.pieces(text)
        assert enc.cuttable and len(pieces) >= 2 and "".join(pieces) == text
        ids = np.concatenate([enc.encode(p, i == 0, i == len(pieces) - 1) for i, p in enumerate(pieces)])
        assert ids.tolist() == D._encode(tok, text).tolist(), name


def test_progress_lines_report_tokens_per_second(tmp_path, small_pieces, monkeypatch):
    import mhar.data.shards as D

    monkeypatch.setattr(D, "PROGRESS_EVERY_S", 0.0)
    f = tmp_path / "a.txt"
    f.write_text(_long_text(0, 400))
    logs: list[str] = []
    sh = build_shards(DataConfig(corpus=str(f), cache_dir=str(tmp_path / "c"), seq_len=16), 257, logs.append, workers=2)
    assert any(re.search(r"tokenizing .*\d[\d,]* tokens, \d+% of .* [\d.]+M tokens/s \(2 worker", m) for m in logs), logs
    assert re.search(r"tokenized .* \([\d.]+M tokens/s, 2 worker\(s\)\)", logs[-1]) and sh.meta["tokens_per_s"] > 0


def test_tokenize_workers_env(monkeypatch, tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("some text\n" * 100)
    monkeypatch.setenv("MHAR_TOKENIZE_WORKERS", "3")
    assert build_shards(DataConfig(corpus=str(f), cache_dir=str(tmp_path / "a"), seq_len=8), 257,
                        lambda m: None).meta["workers"] == 3
    monkeypatch.setenv("MHAR_TOKENIZE_WORKERS", "many")
    with pytest.raises(DataError, match="MHAR_TOKENIZE_WORKERS='many'"):
        build_shards(DataConfig(corpus=str(f), cache_dir=str(tmp_path / "b"), seq_len=8), 257)


_KILLABLE_BUILD = """
import sys, time
import mhar.data.shards as D
from mhar.data.config import DataConfig
D.PIECE_CHARS, D.TASK_CHARS, D.COMMIT_EVERY_S = 300, 2000, 0.0
encode_task = D._Encoder.encode_task
def slow(self, task, dtype):  # a slow tokenizer: the kill lands in the middle of the build
    time.sleep(0.05)
    return encode_task(self, task, dtype)
D._Encoder.encode_task = slow
D.build_shards(DataConfig(corpus=sys.argv[1], tokenizer=sys.argv[2], cache_dir=sys.argv[3], seq_len=16), 1000,
               workers=int(sys.argv[4]))
"""


def _kill_build_at(tmp_path: Path, args: list[str], when) -> Path:
    """Run a build in a child process, SIGKILL it once ``when(progress)`` holds; returns the partial folder."""
    import signal
    import subprocess
    import sys
    import time

    cache = Path(args[2])
    child = subprocess.Popen([sys.executable, "-c", _KILLABLE_BUILD, *args], cwd=Path(__file__).parents[2])
    try:
        t0 = time.time()
        while time.time() - t0 < 120:
            progress = [json.loads(p.read_text())["progress"] for p in cache.glob(".*.partial/progress.json")
                        if p.stat().st_size]
            if progress and when(progress[0]):
                break
            assert child.poll() is None, "the build finished before it could be killed"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    (partial,) = cache.glob(".*.partial")
    return partial


@pytest.mark.parametrize("workers", [1, 2])
def test_killed_build_resumes_and_ends_byte_identical(tmp_path, small_pieces, workers):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [_long_text(i, 300) for i in range(6)]
    for i, t in enumerate(texts):
        (corpus / f"doc{i}.txt").write_text(t)
    tok = _train_bpe(tmp_path, texts, "tok")
    cfg = lambda cache: DataConfig(corpus=str(corpus), tokenizer=tok, cache_dir=str(cache), seq_len=16)  # noqa: E731
    whole = build_shards(cfg(tmp_path / "whole"), 1000, lambda m: None, workers=workers)
    total = sum(len(t) for t in texts)

    cache = tmp_path / "killed"
    partial = _kill_build_at(tmp_path, [str(corpus), tok, str(cache), str(workers)],
                             lambda p: p["chars"] >= total / 2)  # killed at 50%
    done = json.loads((partial / "progress.json").read_text())["progress"]
    assert 0 < done["tasks"] and not done["done"] and not (partial / "meta.json").exists()
    with open(partial / "train.bin", "ab") as f:  # bytes written after the last recorded progress
        f.write(b"\x07" * (whole.path / "train.bin").stat().st_size)
    logs: list[str] = []
    resumed = build_shards(cfg(cache), 1000, logs.append, workers=workers)
    assert any("resuming" in m for m in logs) and resumed.meta["resumed_after_tasks"] == done["tasks"]
    for name in ("train.bin", "val.bin"):
        assert (resumed.path / name).read_bytes() == (whole.path / name).read_bytes(), name
    assert {k: resumed.meta[k] for k in ("train_tokens", "val_tokens", "train_docs", "val_docs")} == \
        {k: whole.meta[k] for k in ("train_tokens", "val_tokens", "train_docs", "val_docs")}
    assert not partial.exists()

    if workers == 1:
        return
    # killed again and again, at arbitrary points: still the same shards
    cache = tmp_path / "killed_often"
    for frac in (0.2, 0.7):
        _kill_build_at(tmp_path, [str(corpus), tok, str(cache), str(workers)], lambda p, f=frac: p["chars"] >= total * f)
    again = build_shards(cfg(cache), 1000, lambda m: None, workers=3 - workers)  # another worker count, too
    for name in ("train.bin", "val.bin"):
        assert (again.path / name).read_bytes() == (whole.path / name).read_bytes(), name


def test_streaming_hub_loader_on_a_local_snapshot(tmp_path, monkeypatch):
    """`hf:<path>:<config>` goes through datasets.load_dataset(..., streaming=True) exactly as on the hub:
    here a local folder laid out like HuggingFaceFW/fineweb-edu (README configs, sample/10BT/*.parquet)."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    calls = []
    real = datasets.load_dataset

    def spy(*a, **k):
        calls.append((a, k))
        return real(*a, **k)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    repo = tmp_path / "fineweb-edu"
    (repo / "sample" / "10BT").mkdir(parents=True)
    (repo / "data").mkdir()
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*.parquet\n"
        "- config_name: sample-10BT\n  data_files:\n  - split: train\n    path: sample/10BT/*.parquet\n---\n# fixture\n")
    rows = [{"text": f"Document {i}. " + "word " * (5 + i % 17), "id": f"<urn:{i}>", "score": 3.0} for i in range(300)]
    for k in range(2):
        pq.write_table(pa.Table.from_pylist(rows[k * 150:(k + 1) * 150]), repo / "sample" / "10BT" / f"00{k}_00000.parquet")
    pq.write_table(pa.Table.from_pylist([{"text": "other config", "id": "x", "score": 0.0}] * 5), repo / "data" / "x.parquet")

    spec = f"hf:{repo}:sample-10BT"
    corpus = resolve_corpus(spec, None)
    assert corpus.splits() == ("train",) and next(corpus.documents("train")) == rows[0]["text"]
    cfg = DataConfig(corpus=spec, cache_dir=str(tmp_path / "c"), seq_len=8, val_fraction=0.1, max_train_tokens=20000)
    sh = build_shards(cfg, 257, lambda m: None)
    assert any(k.get("streaming") and a[:2] == (str(repo), "sample-10BT") for a, k in calls)
    assert sh.meta["holdout_rule"] == "documents" and sh.meta["train_tokens"] == 20000  # capped stream
    # the same documents as local parquet files give the same held-out split (same documents rule)
    flat = tmp_path / "flat.parquet"
    pq.write_table(pa.Table.from_pylist(rows), flat)
    local = build_shards(DataConfig(corpus=str(flat), cache_dir=str(tmp_path / "c2"), seq_len=8, val_fraction=0.1,
                                    max_train_tokens=20000), 257, lambda m: None)
    assert np.array_equal(sh.train, local.train) and np.array_equal(sh.val, local.val)
    # a changed snapshot is a new cache key
    before = corpus.fingerprint()
    pq.write_table(pa.Table.from_pylist(rows[:10]), repo / "sample" / "10BT" / "001_00000.parquet")
    assert resolve_corpus(spec, None).fingerprint() != before
