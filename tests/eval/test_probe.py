"""eval.probe: slice softmaxes against the routing reference, the source collection against the
model's own forward pass, KL/cosine against direct computations, and the CLI end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from analysis import figures
from eval import probe
from mhar.runs.checkpoint import save_model
from mhar.model.config import model_config
from mhar.model.transformer import build_model
from mhar.model.residuals import RESIDUALS, routed_variants
from mhar.model.routing.reference import route_reference

torch.set_num_threads(1)


def _model(variant: str, heads: int = 1, seed: int = 0):
    torch.manual_seed(seed)
    m = build_model(model_config("debug", residual={"variant": variant, "heads": heads}))
    if variant in routed_variants():
        with torch.no_grad():  # stand-in for trained queries (zero-init queries give uniform routing)
            m.residual.queries.normal_(0, 0.5)
            m.residual.key_norms.uniform_(0.5, 1.5)
    return m.eval()


def _ids(B=2, T=24, seed=0):
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("slices", [1, 4, 8])
def test_slice_softmaxes_equal_route_reference_weights(slices):
    g = torch.Generator().manual_seed(1)
    N, B, T, D = 5, 2, 7, 48  # awkward T
    src = torch.randn(N, B, T, D, generator=g)
    q, w = torch.randn(D, generator=g), torch.rand(D, generator=g) + 0.5
    shared, per = probe.slice_softmaxes(src, q, w, slices)
    _, ref1 = route_reference(src, q, w, 1, return_weights=True)  # (B, T, 1, N): single head
    _, refS = route_reference(src, q, w, slices, return_weights=True)  # (B, T, S, N): one softmax per slice
    torch.testing.assert_close(shared, ref1[:, :, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(per, refS, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="divide"):
        probe.slice_softmaxes(src, q, w, 5)


def test_slice_kl_matches_direct_kl_and_is_zero_for_zero_query():
    g = torch.Generator().manual_seed(2)
    src = torch.randn(6, 2, 9, 32, generator=g)
    q, w = torch.randn(32, generator=g) * 3, torch.ones(32)
    shared, per = probe.slice_softmaxes(src, q, w, 4)
    # F.kl_div(input=log q, target=p) = sum p (log p - log q) = KL(p || q)
    direct = torch.stack([F.kl_div(shared.log(), per[:, :, s], reduction="none").sum(-1).mean() for s in range(4)])
    torch.testing.assert_close(probe.slice_kl(src, q, w, 4), direct, rtol=1e-4, atol=1e-6)
    assert probe.slice_kl(src, torch.zeros(32), w, 4).abs().max() < 1e-7
    assert probe.slice_kl(src, q, w, 1).abs().max() < 1e-6  # one slice is the shared softmax


def test_planted_multihead_query_beats_matched_norm_null():
    """Slice s of the query aims at source s (each source stands out along one direction per slice):
    the slices' own softmaxes disagree with the shared one far more than for a random query of equal norm."""
    g = torch.Generator().manual_seed(3)
    N, S, D = 4, 4, 64
    v = torch.randn(S, D // S, generator=g)
    base = torch.stack([torch.cat([v[s] if i == s else -v[s] / (N - 1) for s in range(S)]) for i in range(N)])
    src = base[:, None, None] + 0.1 * torch.randn(N, 2, 16, D, generator=g)  # (N, B, T, D)
    q = torch.cat([v[s] / v[s].norm() for s in range(S)]) * 0.5
    kl = float(probe.slice_kl(src, q, torch.ones(D), S).mean())
    nulls = [float(probe.slice_kl(src, probe.matched_norm_random(q, g), torch.ones(D), S).mean())
             for _ in range(8)]
    assert kl > 3 * np.mean(nulls)


def test_matched_norm_random():
    # q from its own generator: from the global one, after any test's torch.manual_seed(0), q would be 7x the
    # very draw the probe's seed-0 generator makes, and r == q exactly
    q = torch.randn(40, generator=torch.Generator().manual_seed(1)) * 7
    r = probe.matched_norm_random(q, torch.Generator().manual_seed(0))
    assert torch.isclose(r.norm(), q.norm()) and not torch.allclose(r, q)


def test_mean_pairwise_cosine_matches_loop():
    g = torch.Generator().manual_seed(4)
    src = torch.randn(5, 2, 3, 16, generator=g)
    src[1] = src[0] * 2 + 0.1 * src[1]  # one near-duplicate pair
    vals = [F.cosine_similarity(src[i], src[j], dim=-1).mean() for i in range(5) for j in range(i + 1, 5)]
    assert probe.mean_pairwise_cosine(src) == pytest.approx(float(torch.stack(vals).mean()), rel=1e-5)


def test_routing_deviation_properties():
    w = np.random.default_rng(0).dirichlet(np.ones(6), size=4)  # (H, N)
    dev = figures.routing_deviation(w)
    assert dev.shape == (4,) and np.all((dev >= 0) & (dev <= 1))
    assert np.allclose(figures.routing_deviation(np.tile(w[:1], (4, 1))), 0)  # identical heads
    assert np.allclose(figures.routing_deviation(np.full((3, 5), 0.2), "uniform"), 0)
    one_hot = np.eye(5)[:2]
    assert figures.routing_deviation(one_hot, "uniform") == pytest.approx([0.8, 0.8])
    with pytest.raises(ValueError, match="reference"):
        figures.routing_deviation(w, "median")


def test_routed_variants_are_the_registry_classes_with_full_depth_routing():
    assert routed_variants() == tuple(sorted(n for n, c in RESIDUALS.items() if c.routes_full_depth))
    assert {"attnres", "mhar"} <= set(routed_variants())
    assert not {"baseline", "hyper", "block_attnres", "mhar_delta", "mhar_hw"} & set(routed_variants())


@pytest.mark.parametrize("variant,heads", [(v, 4) for v in routed_variants()])  # attnres keeps 1 head
def test_collected_sources_reproduce_model_routing_and_logits(variant, heads):
    """What ``routes_full_depth`` promises, for every variant that sets it: the probe's sources and each
    site's query reproduce the model's own routing weights and logits."""
    m = _model(variant, heads)
    heads = m.residual.heads
    ids = _ids()
    with torch.no_grad():
        srcs = probe.collect_sources(m, ids)
        out = m(ids, collect_routing=True)
    L2 = m.cfg.n_sublayers
    assert len(srcs) == L2 + 1
    for site in range(L2 + 1):
        n = min(site + 1, len(srcs))
        h, wts = route_reference(torch.stack(srcs[:n]), m.residual.queries[site], m.residual.key_norms[site],
                                 heads, return_weights=True)
        name = m.residual.site_name(site, L2)
        torch.testing.assert_close(wts, out.routing[name], rtol=1e-5, atol=1e-6)
    logits = m.lm_head(m.final_norm(h))
    torch.testing.assert_close(logits, out.logits, rtol=1e-5, atol=1e-5)


def test_probe_model_fields_and_null():
    m = _model("attnres")
    res = probe.probe_model(m, _ids(), slices=4, null_draws=3, seed=0)
    assert res.routing_heads == 1 and res.slices == 4
    assert len(res.per_site) == m.cfg.n_sublayers  # site 0 reads a single source and is skipped
    assert res.kl_trained == pytest.approx(np.mean([s["kl_trained"] for s in res.per_site]))
    assert res.kl_null > 0 and np.isfinite(res.mean_pairwise_cosine)
    assert set(res.routing_mean) == {"L0.attn", "L0.mlp", "L1.attn", "L1.mlp", "final"}
    assert np.allclose(np.asarray(res.routing_mean["final"]).sum(-1), 1, atol=1e-5)


def test_probe_cli_end_to_end(tmp_path):
    path = save_model(tmp_path / "model.pt", _model("attnres"), "byte")
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "probe.json"
    assert probe.main(["--model", str(path), "--out", str(out), "--slices", "4", "--batch", "2",
                       "--seq-len", "32", "--text", str(text), "--null-draws", "2"]) == 0
    d = json.loads(out.read_text())
    assert d["token_source"] == f"text:{text}" and d["n_tokens"] == 64
    assert {"kl_trained", "kl_null", "mean_pairwise_cosine", "per_site", "routing_mean", "provenance"} <= set(d)
    assert d["provenance"]["inputs"][0] == str(path)


def test_probe_rejects_non_routed_model(tmp_path, capsys):
    path = save_model(tmp_path / "model.pt", _model("baseline"), "byte")
    assert probe.main(["--model", str(path), "--out", str(tmp_path / "p.json"), "--seq-len", "16"]) == 2
    err = capsys.readouterr().err
    assert "(attnres, mhar" in err and "'baseline'" in err


def test_probe_refuses_a_vocabulary_smaller_than_the_tokenizer(tmp_path, capsys):
    """Token ids past the embedding (here the bytes of '\u20ac', >= 200) are refused before the probe runs,
    with one error line naming the model and both sizes, not an IndexError in the middle of it."""
    torch.manual_seed(0)
    small = build_model(model_config("debug", vocab_size=200, residual={"variant": "attnres"}))
    path = save_model(tmp_path / "model.pt", small, "byte")
    text = tmp_path / "text.txt"
    text.write_text("The price is 5 \u20ac. " * 40)
    out = tmp_path / "probe.json"
    assert probe.main(["--model", str(path), "--out", str(out), "--batch", "1", "--seq-len", "32",
                       "--text", str(text), "--null-draws", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --model {path}: ") and "Traceback" not in err, err
    assert "vocabulary (200 ids) is smaller than its tokenizer's (byte: 257 ids)" in err and "re-export" in err
    assert not out.exists()
