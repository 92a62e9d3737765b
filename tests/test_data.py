"""Data pipeline: corpora, held-out splits, tokenize-once cache, packing, paired batch order."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch

from mhar.data import (BatchOrder, DataError, PackedTokens, TrainData, build_shards, resolve_corpus,
                       unigram_entropy)
from mhar.runconfig import DataConfig

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
    assert not any(Path(cache).glob(".*"))  # failed builds leave no temp folder


def test_killed_cache_build_is_cleaned_at_next_start(tmp_path):
    import subprocess

    cache = tmp_path / "c"
    cache.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = cache / f".x-byte-0123.tmp-{dead.pid}-abc"
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"\0" * 100)
    live = cache / f".y-byte-0123.tmp-{os.getpid()}-abc"  # a build in progress (this process) stays
    live.mkdir()
    f = tmp_path / "t.txt"
    f.write_text("some text\n" * 200)
    build_shards(DataConfig(corpus=str(f), cache_dir=str(cache), seq_len=16), 257, lambda m: None)
    assert not stale.exists() and live.exists()
