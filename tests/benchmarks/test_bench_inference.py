"""benchmarks/bench_inference.py: CPU smoke run with the debug preset (the GPU run is the lead's)."""
from __future__ import annotations

import csv

import pytest
import torch

from benchmarks import bench_inference


def test_cpu_smoke_writes_rows_with_provenance(tmp_path, monkeypatch):
    """The benchmark times the library's user paths (the adapter's Scorer, mhar.model.inference.generate with the cache)
    beside transformers' Qwen3 of the same shapes, and writes the issue's columns with their ratios."""
    calls, scored = [], []
    real = bench_inference.generate
    monkeypatch.setattr(bench_inference, "generate",
                        lambda *a, **k: calls.append(k.get("use_cache", True)) or real(*a, **k))

    import mhar.model.inference as inf
    orig_score = inf.Scorer.sequence_logprobs
    monkeypatch.setattr(inf.Scorer, "sequence_logprobs", lambda self, *a, **k: scored.append(1) or orig_score(self, *a, **k))
    out = tmp_path / "inference.csv"
    torch.set_num_threads(1)
    assert bench_inference.main(["--sizes", "debug", "--device", "cpu", "--shapes", "2:24:16", "--new", "3",
                                 "--repeats", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["size"], r["variant"], r["batch"]) for r in rows] == [("debug", "hf", "2"), ("debug", "baseline", "2"),
                                                                     ("debug", "mhar", "2")]
    cols = ("score_tok_s", "score_vs_baseline", "decode_ms_per_token", "decode_vs_baseline", "baseline_vs_hf_score",
            "baseline_vs_hf_decode", "peak_mem_gib")
    assert all(c in rows[0] for c in cols)
    for r in rows:
        assert float(r["score_tok_s"]) > 0 and float(r["decode_ms_per_token"]) >= 0 and float(r["prefill_tok_s"]) > 0
        assert r["command"].startswith("PYTHONPATH=. python") and r["git_commit"] is not None and r["torch"]
    hf, base, mhar = rows
    assert float(base["baseline_vs_hf_score"]) == pytest.approx(float(base["score_tok_s"]) / float(hf["score_tok_s"]),
                                                                rel=1e-3)
    assert float(mhar["score_vs_baseline"]) == pytest.approx(float(mhar["score_tok_s"]) / float(base["score_tok_s"]),
                                                             rel=1e-3)
    assert mhar["routing_impl"] == "eager" and mhar["heads"] == "8" and hf["score_vs_baseline"] == ""
    assert calls and all(calls) and len(calls) == 2 * 4  # per variant: 2 first calls + 2 timed generate calls
    assert len(scored) == 2 * 2  # per variant: the first call + one timed repeat


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fused_generation_equals_eager():
    """On the GPU, greedy decoding with fused routing (source groups, the score table of the paper configs)
    follows the eager reference (fp32)."""
    from mhar.model.config import model_config
    from mhar.model.inference import generate
    from mhar.model.transformer import build_model

    outs = []
    for impl in ("eager", "fused", "fused_sg8", "fused_v7_sg8"):
        torch.manual_seed(0)
        model = build_model(model_config("tiny", tie_embeddings=False,
                                         residual={"variant": "mhar", "heads": 4, "routing_impl": impl}))
        with torch.no_grad():
            model.lm_head.weight.mul_(30)  # peaked logits: greedy far from ties between eager and fused rounding
            for name, p in model.residual.named_parameters():
                if "quer" in name:
                    p.normal_(generator=torch.Generator().manual_seed(2))  # routing far from uniform
        model = model.cuda().eval()
        ctx = torch.randint(0, 257, (3, 20), generator=torch.Generator().manual_seed(1)).tolist()
        outs.append((generate(model, ctx, 12), generate(model, ctx, 12, use_cache=False)))
    assert all(o == outs[0][0] for pair in outs for o in pair)
