"""Which corpus metric a comparison can carry, decided from the run's tokenizer.

The paper reports WikiText word perplexity of models trained with the Qwen3 tokenizer (PAPER.md). Word
perplexity is defined for any tokenizer, but a tiny byte-level model's word perplexity (millions) beside the
paper's (about 60) compares nothing; bits per byte (log-perplexity per byte, lm-eval's ``bits_per_byte``) is
what such a model's delta carries. On the same documents both are monotone in the summed log-likelihood
(word and byte counts are fixed), so the sign of a bits-per-byte delta is the sign of the word-perplexity
delta: a sign-only verdict may still read the paper's word-perplexity delta.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

PAPER_TOKENIZER = "qwen3"  # PAPER.md: "Qwen3 tokenizer (vocab 151936)"; specs like hf:Qwen/Qwen3-0.6B
PAPER_CORPUS_METRIC = "word_perplexity"
BYTE_METRIC = "bits_per_byte"
# corpus metrics and the published metric whose delta has the same sign on the same documents
SAME_SIGN_AS = {BYTE_METRIC: PAPER_CORPUS_METRIC, "byte_perplexity": PAPER_CORPUS_METRIC}


def tokenizer_of(identity: dict) -> Optional[str]:
    """The tokenizer spec recorded in a run's identity config (``data.tokenizer``), None when not recorded."""
    cfg = identity.get("config") if isinstance(identity, dict) else None
    data = (cfg or {}).get("data") if isinstance(cfg, dict) else None
    tok = (data or {}).get("tokenizer") if isinstance(data, dict) else None
    return str(tok) if tok is not None else None


def matches_paper(tokenizer: Optional[str]) -> bool:
    return tokenizer is not None and PAPER_TOKENIZER in tokenizer.lower()


def corpus_metric(tokenizer: Optional[str]) -> str:
    """The corpus (perplexity-task) metric to compare: the paper's word perplexity where the tokenizer is the
    paper's, bits per byte otherwise (and when the record does not say, where the magnitude cannot be trusted)."""
    return PAPER_CORPUS_METRIC if matches_paper(tokenizer) else BYTE_METRIC


def published_metric(metric: str) -> str:
    """The published metric a delta in ``metric`` is compared with (by sign, where the metric differs)."""
    name = metric.split(",")[0]
    return SAME_SIGN_AS.get(name, name)


def corpus_value(metric: str, loglik: Sequence[float], weight: Sequence[float]) -> float:
    """lm-eval's corpus aggregate of [loglik, weight] pairs: exp(-sum ll / sum w), or bits per byte."""
    nats = -float(np.sum(loglik)) / float(np.sum(weight))
    return nats / math.log(2) if metric.split(",")[0] == BYTE_METRIC else math.exp(nats)


NOTE = ("Corpus perplexity tasks (WikiText) compare the paper's word perplexity only where the run's tokenizer is "
        "the paper's (Qwen3); other tokenizers (byte level) compare bits per byte, whose delta has the sign of the "
        "word-perplexity delta on the same documents, so the paper's word-perplexity delta judges the sign only.")


def for_tokenizer(metric: str, available: Sequence[str], identity: dict) -> str:
    """``metric`` (a task's primary metric name, e.g. 'word_perplexity,none'), replaced by bits per byte for a run
    whose tokenizer is not the paper's when the task recorded it."""
    if metric.split(",")[0] != PAPER_CORPUS_METRIC:
        return metric
    want = corpus_metric(tokenizer_of(identity))
    return next((n for n in available if n.split(",")[0] == want), metric)


def unit_note(metric: str, published: Optional[str]) -> str:
    """' word_perplexity' after a published delta read in another metric than ours (compared by sign only)."""
    if not published or published == metric.split(",")[0]:
        return ""
    return f" {published}"
