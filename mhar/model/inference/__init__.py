"""Inference at training speed: log-likelihood scoring and greedy decoding, compiled and CUDA-graph captured.

Two entry points, both used by ``eval.adapter.MharLM`` (``generate`` is the greedy entry point) and timed by
``benchmarks/bench_inference.py``, one runner each per model (``scorer_for(model)``, ``decoder_for(model)``):

* ``scoring.Scorer``: the log-likelihood requests lm-eval sends (hidden states of padded batch / length buckets
  through a compiled ``Transformer.hidden``, the output head only on the scored positions).
* ``decoding.Decoder``: ``generate`` on a static KV cache, every decode step one compiled graph replayed as a
  CUDA graph, the depth routing of a step by ``mhar.model.routing.DecodeRouter``.

Both are ``runner.Runner``s: the same compile / CUDA-graph settings, regional compilation of the sublayers and
the compile setup of ``mhar.model.compile``. The paths compute what the eager full forward computes
(tests/model/test_inference.py: per-sample log-likelihoods and greedy generations for every residual variant; fp32 on
CPU, bf16 on the GPU within 1e-2 on per-sample sums).
"""
from __future__ import annotations

from mhar.model.inference.decoding import Decoder, decoder_for, generate
from mhar.model.inference.runner import CACHE_MULTIPLE, Runner, batch_bucket, use_router
from mhar.model.inference.scoring import (HEAD_CHUNK, Scorer, chunked_logprobs, logit_logprobs, score_length_bucket,
                                          scorer_for)

__all__ = ["Decoder", "Scorer", "Runner", "decoder_for", "scorer_for", "generate", "batch_bucket", "CACHE_MULTIPLE",
           "HEAD_CHUNK", "score_length_bucket", "use_router", "chunked_logprobs", "logit_logprobs"]
