"""mhar_delta: exact identity at init, gradients, an independent naive forward, sources, config errors."""
from __future__ import annotations

import pytest
import torch

from mhar.model.config import ConfigError, model_config
from mhar.model.transformer import Transformer
from mhar.model.residuals.delta import DeltaAttnRes

torch.set_num_threads(1)

# d 32, 4 layers, blocks of 2 layers -> 2 block deltas (3 sources at the final read), 4 routing heads
SHAPE = dict(vocab_size=61, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64)


def _pair(block_layers: int = 2, heads: int = 4, **over):
    """A baseline model and an mhar_delta model carrying the same base weights."""
    torch.manual_seed(0)
    shape = {**SHAPE, **over}
    base = Transformer(model_config(**shape))
    delta = Transformer(model_config(**shape, residual={"variant": "mhar_delta", "heads": heads,
                                                        "delta_block_layers": block_layers}))
    missing, unexpected = delta.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("residual.") for k in missing)
    return base, delta


def _ids(B=2, T=13, V=61, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g)


@pytest.mark.parametrize("block_layers", [1, 2, 4])
def test_identity_at_init_is_exact(block_layers):
    base, delta = _pair(block_layers)
    ids = _ids()
    with torch.no_grad():
        a, b = base(ids).logits, delta(ids).logits
    assert a.dtype == torch.float32
    assert (a - b).abs().max().item() == 0.0
    assert torch.equal(a, b)


def test_identity_holds_for_nonzero_queries_and_null_when_alpha_zero():
    # alpha = 0 gates everything: routing parameters alone must not change the output
    base, delta = _pair()
    with torch.no_grad():
        delta.residual.queries.normal_(0, 1.0)
        delta.residual.null.normal_(0, 1.0)
        delta.residual.key_norms.uniform_(0.5, 1.5)
        ids = _ids()
        assert torch.equal(base(ids).logits, delta(ids).logits)


def test_gradient_reaches_alpha_and_routing_params():
    _, delta = _pair(block_layers=2)
    ids = _ids()
    delta(ids, labels=torch.roll(ids, -1, 1)).loss.backward()
    res = delta.residual
    per_block = 2 * delta.cfg.residual.delta_block_layers
    has_delta = torch.arange(res.alphas.numel()) >= per_block
    # sites that see a block delta get a gradient on alpha; the first block's sites route only the
    # (zero) null source, so their routed value and hence their alpha gradient is exactly 0 at init
    assert (res.alphas.grad[has_delta] != 0).all()
    assert (res.alphas.grad[~has_delta] == 0).all()
    # alpha = 0 gates the routing parameters: no gradient until alpha moves
    for p in (res.null, res.queries):
        assert p.grad is None or p.grad.abs().sum() == 0
    # one step of alpha opens the gate: the null source and queries then receive gradient
    with torch.no_grad():
        res.alphas.fill_(0.1)
    delta.zero_grad()
    delta(ids, labels=torch.roll(ids, -1, 1)).loss.backward()
    assert res.null.grad.abs().sum() > 0 and res.queries.grad[has_delta].abs().sum() > 0


def _naive_route(sources, q, g, H, eps):
    """Per-head loop over a list of (B,T,D) sources, written independently of mhar.model.routing."""
    D = q.numel()
    d = D // H
    outs = []
    for h in range(H):
        sl = slice(h * d, (h + 1) * d)
        scores = []
        for s in sources:
            k = s / torch.sqrt((s * s).mean(-1, keepdim=True) + eps) * g  # full-width key norm
            scores.append((k[..., sl] * q[sl]).sum(-1))  # (B, T)
        w = torch.softmax(torch.stack(scores, -1), -1)  # (B, T, N)
        outs.append(sum(w[..., n: n + 1] * s[..., sl] for n, s in enumerate(sources)))
    return torch.cat(outs, -1)


def _naive_forward(model, ids):
    """The delta model written out directly: blocks of layers, delta sources, gated reads."""
    res, cfg = model.residual, model.cfg
    cos, sin = model.rotary(ids.shape[1], ids.device)
    x = model.embed(ids)
    null = res.null.expand_as(x)
    sources, start = [null], x
    per_block = 2 * cfg.residual.delta_block_layers
    counts = []
    for i in range(cfg.n_sublayers):
        counts.append(len(sources))
        r = _naive_route(sources, res.queries[i], res.key_norms[i], cfg.residual.heads, cfg.residual.routing_eps)
        h = x + res.alphas[i] * r
        blk = model.layers[i // 2]
        out = blk.attn(blk.attn_norm(h), cos, sin) if i % 2 == 0 else blk.mlp(blk.mlp_norm(h))
        x = x + out
        if (i + 1) % per_block == 0:
            sources.append(x - start)
            start = x
    counts.append(len(sources))
    r = _naive_route(sources, res.queries[-1], res.key_norms[-1], cfg.residual.heads, cfg.residual.routing_eps)
    return model.lm_head(model.final_norm(x + res.alphas[-1] * r)), counts


def test_nonzero_gates_differ_from_baseline_and_match_naive():
    base, delta = _pair(block_layers=2, heads=4)
    res = delta.residual
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        res.alphas.copy_(torch.rand(res.alphas.shape, generator=g) + 0.5)
        res.queries.copy_(torch.randn(res.queries.shape, generator=g))
        res.null.copy_(torch.randn(res.null.shape, generator=g) * 0.1)
        res.key_norms.copy_(torch.rand(res.key_norms.shape, generator=g) + 0.5)
        ids = _ids()
        got = delta(ids).logits
        want, counts = _naive_forward(delta, ids)
        assert (got - base(ids).logits).abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # sublayers 0-3 see only null; 4-7 see null + delta of layers 0-1; the final read sees 2 deltas
    assert counts == [1, 1, 1, 1, 2, 2, 2, 2, 3]


def test_source_count_and_routing_log():
    _, delta = _pair(block_layers=1, heads=2)
    res: DeltaAttnRes = delta.residual
    out = delta(_ids(), collect_routing=True)
    L = delta.cfg.n_layers
    for i in range(2 * L):
        site = res.site_name(i, 2 * L)
        assert out.routing[site].shape[-1] == 1 + i // 2 == res.num_sources_at(i)
        assert out.routing[site].shape[-2] == 2  # heads
    assert out.routing["final"].shape[-1] == 1 + L  # null + one delta per completed block
    torch.testing.assert_close(out.routing["final"].sum(-1), torch.ones(2, 13, 2))


def test_block_delta_is_the_stream_change():
    # one block covering all layers: the final read's second source is x_final - embedding
    _, delta = _pair(block_layers=4)
    res = delta.residual
    ids = _ids()
    captured = {}
    orig = res.router.append

    def spy(state, src):
        captured["delta"] = src
        return orig(state, src)

    res.router.append = spy
    with torch.no_grad():
        delta(ids)
        # stream at the end = what the baseline feeds final_norm (alpha = 0 read == x)
        x = delta.embed(ids)
        cos, sin = delta.rotary(ids.shape[1], ids.device)
        for i in range(delta.cfg.n_sublayers):
            x = x + delta.sublayer(i, x, cos, sin)
    torch.testing.assert_close(captured["delta"], x - delta.embed(ids), rtol=0, atol=0)


def test_bad_block_size_is_a_clear_config_error():
    with pytest.raises(ConfigError, match="model.residual.delta_block_layers"):
        Transformer(model_config(**SHAPE, residual={"variant": "mhar_delta", "delta_block_layers": 3}))


def test_heads_must_divide_width():
    with pytest.raises(ConfigError, match="residual.heads"):
        model_config(**SHAPE, residual={"variant": "mhar_delta", "heads": 5})


def test_bf16_identity_at_init():
    base, delta = _pair()
    base, delta = base.to(torch.bfloat16), delta.to(torch.bfloat16)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(base(ids).logits, delta(ids).logits)


def test_naive_route_agrees_with_reference():
    # guards the test's own reference against the package reference (different code paths)
    from mhar.model.routing import route_reference

    g = torch.Generator().manual_seed(5)
    srcs = [torch.randn(2, 3, 16, generator=g) for _ in range(3)]
    q, w = torch.randn(16, generator=g), torch.rand(16, generator=g) + 0.5
    torch.testing.assert_close(_naive_route(srcs, q, w, 4, 1e-6),
                               route_reference(torch.stack(srcs), q, w, 4, 1e-6), rtol=1e-5, atol=1e-6)
