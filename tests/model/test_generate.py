"""Incremental decoding (KV cache) equals the full-recompute forward for every residual variant."""
from __future__ import annotations

import pytest
import torch

from mhar.model.config import model_config
from mhar.model.inference import generate
from mhar.model.transformer import KVCache, build_model
from mhar.model.residuals import RESIDUALS

torch.set_num_threads(1)
VOCAB = 257
_DEBUG_EXTRA = {"block_attnres": {"blocks": 2}, "mhar_delta": {"delta_block_layers": 1, "heads": 4}}
VARIANTS = [(v, _DEBUG_EXTRA.get(v, {})) for v in sorted(RESIDUALS)] + [
    ("hyper", {"hyper_dynamic": False}), ("mhar", {"heads": 4})]


def _model(variant: str, **residual):
    torch.manual_seed(0)
    model = build_model(model_config("debug", residual={"variant": variant, "routing_impl": "eager", **residual}))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move every variant far from its identity init (routing, gates, HC matrices)
        for name, p in model.residual.named_parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.mark.parametrize("variant,extra", VARIANTS, ids=[f"{v}-{e}" for v, e in VARIANTS])
def test_cached_steps_equal_full_forward(variant, extra):
    """Prefill of ragged right-padded rows + one- and multi-token steps == the full forward per row."""
    model = _model(variant, **extra)
    g = torch.Generator().manual_seed(2)
    full = [torch.randint(0, VOCAB, (n,), generator=g) for n in (13, 9, 11)]
    ctx_len = torch.tensor([7, 4, 6])
    with torch.no_grad():
        ref = [model.hidden(seq[None])[0] for seq in full]  # (n, D) each, no cache
        cache = KVCache(model.cfg.n_layers)
        ids = torch.zeros(3, 7, dtype=torch.long)
        for r, seq in enumerate(full):
            ids[r, : ctx_len[r]] = seq[: ctx_len[r]]
        h = model.hidden(ids, cache, ctx_len)
        for r in range(3):
            torch.testing.assert_close(h[r, : ctx_len[r]], ref[r][: ctx_len[r]], rtol=1e-5, atol=1e-5)
        pos = ctx_len.clone()
        for width in (1, 2, 1):  # a multi-token step needs the causal mask among the new positions
            step = torch.stack([full[r][pos[r]: pos[r] + width] for r in range(3)])
            h = model.hidden(step, cache)
            for r in range(3):
                torch.testing.assert_close(h[r], ref[r][pos[r]: pos[r] + width], rtol=1e-5, atol=1e-5)
            pos += width


@pytest.mark.parametrize("variant,extra", VARIANTS, ids=[f"{v}-{e}" for v, e in VARIANTS])
def test_greedy_generation_cache_equals_recompute(variant, extra):
    model = _model(variant, **extra)
    g = torch.Generator().manual_seed(3)
    contexts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 12, 1, 8)]
    stop = lambda row, toks: row == 1 and len(toks) == 3  # noqa: E731  one row leaves the batch early
    fast = generate(model, contexts, 10, should_stop=stop)
    slow = generate(model, contexts, 10, should_stop=stop, use_cache=False)
    alone = [generate(model, [c], 10, use_cache=False)[0] for c in contexts]
    assert fast == slow
    assert [len(t) for t in fast] == [10, 3, 10, 10]
    assert fast[0] == alone[0] and fast[2:] == alone[2:] and fast[1] == alone[1][:3]


def test_generate_stops_at_stop_token():
    model = _model("baseline")
    ctx = [[3, 4, 5]]
    free = generate(model, ctx, 6)[0]
    assert generate(model, ctx, 6, stop_ids=[free[2]])[0] == free[: free.index(free[2])]
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[1], []], 3)
