"""The ``data:`` section of a run config (:class:`DataConfig`).

It lives with the package that reads it, as ``ModelConfig`` lives in ``mhar.model.config``: ``mhar.data``
imports nothing of ``mhar.runs`` (the run config above composes the sections, checks them against each other
in ``RunConfig.validate`` and hashes them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["DataConfig"]


@dataclass
class DataConfig:
    """Where text comes from, how it is tokenized, packed and split."""

    # "tinyshakespeare" | "nltk_gutenberg" | "wikitext2" (local data dir), "hf:<path>[:<name>]" (hub),
    # "synthetic:<n_tokens>" (deterministic Zipf tokens, no files), or a path to .txt/.jsonl/.parquet/dir
    corpus: str = "tinyshakespeare"
    text_field: str = "text"  # JSONL / parquet / hub column holding the document text
    tokenizer: str = "byte"  # see mhar.data.tokenizer.get_tokenizer
    seq_len: int = 256
    # Validation when the corpus has no held-out split: "tail" = last val_fraction of every document
    # (cut at a newline), "documents" = a deterministic val_fraction of documents (by content hash),
    # "auto" = tail for < 100 documents, else documents.
    holdout: str = "auto"
    val_fraction: float = 0.05
    val_tokens: int = 65536  # tokens evaluated at every evaluation (a fixed prefix of the val stream)
    val_corpus: Optional[str] = None  # validate on another corpus (its validation split) instead
    max_train_tokens: Optional[int] = None  # cap on tokenized training tokens (required for streamed hub data)
    data_dir: Optional[str] = None  # local data mirror; default $MHAR_DATA_DIR
    cache_dir: str = "results/cache/shards"
    seed: Optional[int] = None  # data-order seed; default train.seed
