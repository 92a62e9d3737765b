"""benchmarks/bench_inference.py: CPU smoke run with the debug preset (the GPU run is the lead's)."""
from __future__ import annotations

import csv

import pytest
import torch

from benchmarks import bench_inference


def test_cpu_smoke_writes_rows_with_provenance(tmp_path, monkeypatch):
    calls = []
    real = bench_inference.build_model

    def spy(cfg):  # the benchmark must go through the library's generate (KV cache) path
        model = real(cfg)
        orig = model.generate
        model.generate = lambda *a, **k: calls.append(k.get("use_cache", True)) or orig(*a, **k)
        return model

    monkeypatch.setattr(bench_inference, "build_model", spy)
    out = tmp_path / "inference.csv"
    torch.set_num_threads(1)
    assert bench_inference.main(["--sizes", "debug", "--device", "cpu", "--mhar-impl", "eager", "--batch", "2",
                                 "--prompt", "16", "--new", "3", "--repeats", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["size"], r["variant"]) for r in rows] == [("debug", "baseline"), ("debug", "mhar")]
    for r in rows:
        assert float(r["prefill_tok_s"]) > 0 and float(r["decode_ms_per_token"]) >= 0
        assert r["command"].startswith("PYTHONPATH=. python") and r["git_commit"] is not None and r["torch"]
    assert rows[1]["routing_impl"] == "eager" and float(rows[1]["prefill_vs_baseline"]) > 0
    assert calls and all(calls)  # 2 variants x (warm-up + timed) calls, all with the cache
    assert len(calls) == 2 * 4  # per variant: two warm-up calls, then one timed prefill and one timed decode


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fused_generation_equals_eager():
    """On the GPU, greedy decoding with fused routing (v6, source groups, the v7 table of the paper configs)
    follows the eager reference (fp32)."""
    from mhar.config import model_config
    from mhar.model import build_model

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
        outs.append((model.generate(ctx, 12), model.generate(ctx, 12, use_cache=False)))
    assert all(o == outs[0][0] for pair in outs for o in pair)
