"""mhar.model.inference: the compiled / graph-captured / static-cache paths compute what the eager full forward computes,
for every residual variant (CPU fp32, the exact code path; `gpu` tests: the compiled kernels and CUDA graphs)."""
from __future__ import annotations

import pytest
import torch

from mhar.model.config import model_config
from mhar.model.inference import Decoder, Scorer, batch_bucket, generate, score_length_bucket, use_router
from mhar.model.transformer import KVCache, build_model
from mhar.model.residuals import RESIDUALS
from mhar.model.routing import DecodeRouter, route_reference, routing_traceable

torch.set_num_threads(1)
VOCAB = 257
_DEBUG_EXTRA = {"block_attnres": {"blocks": 2}, "mhar_delta": {"delta_block_layers": 1, "heads": 4},
                "mhar": {"heads": 4}}
VARIANTS = sorted(RESIDUALS)
assert set(VARIANTS) >= {"baseline", "hyper", "attnres", "block_attnres", "mhar", "mhar_hw", "mhar_delta"}


def _model(variant: str, device="cpu", dtype=torch.float32, preset="debug", **residual):
    torch.manual_seed(0)
    res = {"variant": variant, "routing_impl": "eager", **_DEBUG_EXTRA.get(variant, {}), **residual}
    model = build_model(model_config(preset, tie_embeddings=False, residual=res))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move every variant far from its identity init (routing, gates, HC matrices)
        for _, p in model.residual.named_parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
        model.lm_head.weight.mul_(20)  # peaked logits: greedy choices far from ties
    return model.to(device=device, dtype=dtype).eval()


def _contexts(seed: int, lengths=(5, 12, 1, 8, 3)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


# --- the routing of the decode steps ---------------------------------------------------------------------
@pytest.mark.parametrize("H,null,extra,dtype", [(1, False, False, torch.float32), (4, True, True, torch.float32),
                                                (8, False, True, torch.float32), (4, True, False, torch.bfloat16)])
def test_decode_router_equals_reference(H, null, extra, dtype):
    g = torch.Generator().manual_seed(H)
    B, T, D, N = 3, 2, 32, 5
    srcs = [torch.randn(B, T, D, generator=g).to(dtype) * (1 + i) for i in range(N)]
    if null:
        srcs[0] = torch.randn(D, generator=g).to(dtype).expand(B, T, D)
    ex = torch.randn(B, T, D, generator=g).to(dtype) if extra else None
    q, w = torch.randn(D, generator=g), torch.rand(D, generator=g) + 0.5
    ref, ref_w = route_reference(torch.stack(srcs + ([ex] if extra else [])), q, w, H, 1e-6, return_weights=True)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for kernel in (False, True):  # the PyTorch expression; the Triton decode kernel (interpreter on CPU)
        r = DecodeRouter(kernel=kernel)
        st = r.init(srcs[0], capacity=N + 2)
        for s in srcs[1:]:
            st = r.append(st, s)
        assert r.num_sources(st) == N and st.pending is srcs[-1]  # the newest is written by the next read
        out = r.read(st, q, w, H, 1e-6, extra=ex)
        assert st.n == N and st.pending is None
        torch.testing.assert_close(out, ref, **tol)
        torch.testing.assert_close(r.read(st, q, w, H, 1e-6, extra=ex), out, **tol)  # written once, read again
        out_w, weights = r.read(st, q, w, H, 1e-6, extra=ex, return_weights=True)
        torch.testing.assert_close(out_w, ref, **tol)
        torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(st.ms[:N, ..., 0], torch.stack(srcs).float().pow(2).mean(-1), rtol=1e-6, atol=0)
        assert out.dtype == dtype


# --- static cache + decode state -------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_state_equals_full_forward(variant):
    """Prefill of ragged right-padded rows, then steps through the static cache with the decode router
    (DecodeRouter: this position's sources only) == the full forward of each row at those positions."""
    model = _model(variant)
    g = torch.Generator().manual_seed(2)
    full = [torch.randint(0, VOCAB, (n,), generator=g) for n in (13, 9, 11)]
    ctx_len = torch.tensor([7, 4, 6])
    with torch.no_grad():
        ref = [model.hidden(seq[None])[0] for seq in full]
        cache = KVCache(model.cfg.n_layers, capacity=16)
        ids = torch.zeros(3, 7, dtype=torch.long)
        for r, seq in enumerate(full):
            ids[r, : ctx_len[r]] = seq[: ctx_len[r]]
        model.hidden(ids, cache, ctx_len)
        assert cache.k[0].shape[2] == 16 and cache.pos.tolist() == ctx_len.tolist()
        pos = ctx_len.clone()
        with use_router(model, DecodeRouter()):
            for width in (1, 1, 2):
                step = torch.stack([full[r][pos[r]: pos[r] + width] for r in range(3)])
                h = model.hidden(step, cache)
                for r in range(3):
                    torch.testing.assert_close(h[r], ref[r][pos[r]: pos[r] + width], rtol=1e-4, atol=1e-4)
                pos += width
    assert cache.pos.tolist() == pos.tolist()


def test_static_cache_grows_in_eager_calls():
    model = _model("mhar")
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model.hidden(ids)
        cache = KVCache(model.cfg.n_layers, capacity=4)
        h = [model.hidden(ids[:, :4], cache)] + [model.hidden(ids[:, t: t + 1], cache) for t in range(4, 10)]
    assert cache.k[0].shape[2] >= 10
    torch.testing.assert_close(torch.cat(h, 1), ref, rtol=1e-5, atol=1e-5)


# --- greedy decoding: eager / compiled / graph path ---------------------------------------------------
def _decoders(model):
    return {"eager": Decoder(model, compile=False, cuda_graphs=False),
            "regional": Decoder(model, compile="regional", cuda_graphs=False, backend="aot_eager"),
            "whole": Decoder(model, compile="whole", cuda_graphs=False, backend="aot_eager"),
            "graph_path": Decoder(model, compile="regional", cuda_graphs="emulate", backend="aot_eager")}


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generation_every_path_equals_recompute(variant):
    """The recompute reference (no cache), the eager static-cache decoder, the compiled decode step (regional:
    sublayer graphs + the router's append / read graphs; whole: one graph, fullgraph, no graph break) and the
    CUDA-graph bookkeeping (batch bucket 8 for 5 rows, all rows stepping,
    tokens read one step behind) give identical greedy tokens; a row that stops early keeps its prefix."""
    model = _model(variant)
    contexts = _contexts(3)
    stop = lambda row, toks: row == 1 and len(toks) == 3  # noqa: E731
    ref = generate(model, contexts, 9, should_stop=stop, use_cache=False)
    assert [len(t) for t in ref] == [9, 3, 9, 9, 9]
    for name, dec in _decoders(model).items():
        assert dec.generate(contexts, 9, should_stop=stop) == ref, name
    alone = [generate(model, [c], 9, use_cache=False)[0] for c in contexts]
    assert ref[0] == alone[0] and ref[2:] == alone[2:] and ref[1] == alone[1][:3]


@pytest.mark.parametrize("variant", ["mhar", "block_attnres", "mhar_delta", "mhar_hw"])
def test_decode_kernel_generation_equals_recompute(variant):
    """The Triton decode read (one launch per read, the pending source written by it; the interpreter on CPU),
    eagerly and inside a whole-step compiled graph (the custom op mhar::decode_read: no graph break), gives the
    recompute reference's tokens: single- and multi-head reads, Block AttnRes' extra source, the delta
    variant's broadcast null source, MHAR-HW's several reads of one state."""
    model = _model(variant)
    contexts = _contexts(21, (4, 9, 2))
    ref = generate(model, contexts, 5, use_cache=False)
    assert Decoder(model, compile=False, cuda_graphs=False, kernel=True).generate(contexts, 5) == ref
    dec = Decoder(model, compile="whole", cuda_graphs="emulate", backend="aot_eager", kernel=True)
    assert dec.generate(contexts, 5) == ref and dec.router.kernel


def test_graph_path_reuses_its_cache_and_stops():
    model = _model("mhar")
    dec = Decoder(model, compile=False, cuda_graphs="emulate")
    a = dec.generate(_contexts(5, (4, 6, 2)), 6)
    cache = dec._caches[4]
    b = dec.generate(_contexts(6, (3, 9)), 5)  # bucket 2: its own cache
    c = dec.generate(_contexts(5, (4, 6, 2)), 6)
    assert a == c and dec._caches[4] is cache and set(dec._caches) == {2, 4} and len(b) == 2
    free = dec.generate([[3, 4, 5]], 6)[0]
    assert dec.generate([[3, 4, 5]], 6, stop_ids=[free[2]])[0] == free[: free.index(free[2])]
    assert dec.generate([[3, 4, 5]], 0) == [[]]
    with pytest.raises(ValueError, match="at least one token"):
        dec.generate([[1], []], 3)
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    assert [score_length_bucket(t) for t in (1, 64, 65, 500, 513, 1024, 1025, 2048, 2049)] == \
        [64, 64, 128, 512, 640, 1024, 1280, 2048, 2304]


def test_generate_uses_the_decoder_and_its_settings():
    from mhar.model.inference import decoder_for
    model = _model("baseline")
    assert decoder_for(model) is decoder_for(model)
    dec = decoder_for(model, cuda_graphs="emulate")
    assert dec.graphs() and not dec.compiled()  # CPU: compile off by default
    generate(model, _contexts(7, (3, 4)), 4)
    assert set(dec._caches) == {2}
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        Decoder(model, cuda_graphs=True).graphs()


# --- scoring ------------------------------------------------------------------------------------------
def _reference_logprobs(model, ids, lengths):
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits.float(), -1)
    out = []
    for r, n in enumerate(lengths.tolist()):
        out.append(lp[r, : n - 1].gather(-1, ids[r, 1:n, None]).sum())
    return torch.stack(out)


@pytest.mark.parametrize("variant", VARIANTS)
def test_scoring_compiled_equals_eager(variant):
    """Per-sample log-likelihoods of right-padded rows: eager Scorer == compiled Scorer (regional / whole; batch
    bucket 4 for 3 rows, length bucket 64) == the graph path's bucket bookkeeping (one captured forward per
    bucket, reused) == log_softmax of model(ids).logits; the greedy flags agree."""
    model = _model(variant)
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(0, VOCAB, (3, 37), generator=g)
    lengths = torch.tensor([37, 20, 29])
    ref = _reference_logprobs(model, ids, lengths)
    eager = Scorer(model, compile=False).sequence_logprobs(ids, lengths)
    torch.testing.assert_close(eager, ref, rtol=1e-5, atol=1e-4)
    ref2 = _reference_logprobs(model, ids[:2, :30], torch.tensor([30, 20]))
    for mode in ("regional", "whole"):
        comp = Scorer(model, compile=mode, backend="aot_eager")
        assert comp.mode() == mode
        torch.testing.assert_close(comp.sequence_logprobs(ids, lengths), ref, rtol=1e-5, atol=1e-4)
        got2 = comp.sequence_logprobs(ids[:2, :30], torch.tensor([30, 20]))  # another batch bucket and length
        torch.testing.assert_close(got2, ref2, rtol=1e-5, atol=1e-4)
    graphed = Scorer(model, compile="regional", cuda_graphs="emulate", backend="aot_eager")
    torch.testing.assert_close(graphed.sequence_logprobs(ids, lengths), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(graphed.sequence_logprobs(ids[:2, :30], torch.tensor([30, 20])), ref2,
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(graphed.sequence_logprobs(ids[:, :33], torch.tensor([33, 20, 29])),
                               _reference_logprobs(model, ids[:, :33], torch.tensor([33, 20, 29])), rtol=1e-5, atol=1e-4)
    assert set(graphed._graphs) == {(4, 64), (2, 64)}  # (3, 37) and (3, 33) share the bucket (4, 64)
    h = model.hidden(ids).detach()[0]
    tgt = torch.cat([ids[0, 1:], ids[0, :1]])
    lp_e, gr_e = Scorer(model, compile=False).token_logprobs(h, tgt)
    lp_c, gr_c = comp.token_logprobs(h, tgt)
    torch.testing.assert_close(lp_c, lp_e, rtol=1e-5, atol=1e-5)
    assert torch.equal(gr_c, gr_e) and torch.equal(gr_e, model.lm_head(h).argmax(-1) == tgt)


@pytest.mark.parametrize("variant", VARIANTS)
def test_whole_model_traces_without_graph_breaks(variant):
    """Every variant (eager routing) compiles as one graph: the scoring forward and the decode step."""
    model = _model(variant)
    assert routing_traceable(model, torch.device("cpu"))
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ex = torch._dynamo.explain(model.hidden)(ids)
    assert ex.graph_break_count == 0 and ex.graph_count == 1, ex.break_reasons
    torch._dynamo.reset()


@pytest.mark.parametrize("variant", ["mhar", "block_attnres", "mhar_delta"])
def test_whole_model_scoring_with_the_fused_router_traces_through_the_custom_op(variant, monkeypatch):
    """A router dynamo cannot trace (the fused one; here a stand-in that fails when traced) is replaced in a
    `whole` compile by DecodeRouter with the custom op mhar::decode_read (Triton interpreter on CPU):
    fullgraph (no graph break), the eager per-sample log-likelihoods."""
    import mhar.model.inference.scoring as scoring
    model = _model(variant)
    ids = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(23))
    ref = Scorer(model, compile=False).sequence_logprobs(ids)
    monkeypatch.setattr(scoring, "routing_traceable", lambda m, dev: False)  # as for routing_impl fused
    sc = Scorer(model, compile="whole", backend="aot_eager")
    assert sc._whole_router() is not None
    torch.testing.assert_close(sc.sequence_logprobs(ids), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_inductor_cpu_decode_and_scoring_equal_eager():
    """The default backend (inductor, C++ on CPU) on a routed variant: same tokens, same log-likelihoods."""
    model = _model("mhar")
    contexts = _contexts(11, (6, 2, 9))
    ref = Decoder(model, compile=False, cuda_graphs=False).generate(contexts, 6)
    assert Decoder(model, compile=True, cuda_graphs=False).generate(contexts, 6) == ref
    ids = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(12))
    torch.testing.assert_close(Scorer(model, compile=True).sequence_logprobs(ids),
                               Scorer(model, compile=False).sequence_logprobs(ids), rtol=1e-5, atol=1e-4)


# --- GPU: compiled kernels and CUDA graphs (the lead runs these on the H200) ----------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_graph_decoding_equals_eager(variant):
    """fp32 on CUDA: compiled (inductor) decode steps replayed as CUDA graphs give the eager recompute's
    greedy tokens; a second call of the same bucket replays the captured graph (no new capture)."""
    model = _model(variant, device="cuda")
    contexts = _contexts(13)
    ref = generate(model, contexts, 10, use_cache=False)
    dec = Decoder(model)  # defaults on CUDA: compile + graphs
    assert dec.compiled() and dec.graphs()
    assert dec.generate(contexts, 10) == ref
    assert dec.generate(contexts, 10) == ref and dec.captures == 1


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_graph_scoring_equals_eager(variant):
    """fp32 on CUDA: the default scorer (regional compile, one CUDA graph per (batch, length) bucket, shared
    pool) gives the eager per-sample log-likelihoods; a second shape in the same bucket replays its graph."""
    model = _model(variant, device="cuda")
    ids = torch.randint(0, VOCAB, (3, 90), generator=torch.Generator().manual_seed(17)).cuda()
    lengths = torch.tensor([90, 61, 77])
    sc = Scorer(model)
    assert sc.compiled() and sc.graphs()
    ref = Scorer(model, compile=False, cuda_graphs=False).sequence_logprobs(ids, lengths)
    torch.testing.assert_close(sc.sequence_logprobs(ids, lengths), ref, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(sc.sequence_logprobs(ids[:, :70], torch.tensor([70, 61, 70])),
                               Scorer(model, compile=False, cuda_graphs=False).sequence_logprobs(
                                   ids[:, :70], torch.tensor([70, 61, 70])), rtol=1e-4, atol=1e-3)
    assert sc.captures == 1 and set(sc._graphs) == {(4, 128)}  # lengths 90 and 70: one bucket


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_bf16_scoring_and_decoding_within_tolerance(variant):
    """bf16 on CUDA (the benchmark's setting): per-sample log-likelihood sums of the compiled scorer within
    1e-2 (absolute) of the eager scorer's; the decode path's first-step logits argmax agrees with the
    full forward's on this peaked model."""
    model = _model(variant, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, VOCAB, (4, 70), generator=torch.Generator().manual_seed(14)).cuda()
    lengths = torch.tensor([70, 50, 64, 33])
    eager = Scorer(model, compile=False, cuda_graphs=False).sequence_logprobs(ids, lengths)
    comp = Scorer(model).sequence_logprobs(ids, lengths)  # compiled + CUDA graphs
    diff = (comp - eager).abs().max().item()
    print(f"bf16 {variant}: per-sample sums {eager.tolist()}, max |compiled - eager| {diff:.2e}")
    assert diff <= 1e-2, (comp, eager)
    contexts = _contexts(15)
    out = Decoder(model).generate(contexts, 1 + 4)
    assert [o[0] for o in out] == [t[0] for t in generate(model, contexts, 1, use_cache=False)]


@pytest.mark.gpu
@gpu
def test_gpu_fused_prefill_graph_decode_equals_eager():
    """MHAR H=8 with the fused routing (the paper configs): fused prefill, graph-captured decode == eager."""
    from mhar.model.routing import ROUTERS
    impls = [i for i in ("fused", "auto") if i in ROUTERS or i == "fused"]
    outs = []
    for impl in ["eager"] + impls[:1]:
        model = _model("mhar", device="cuda", heads=8, routing_impl=impl)
        outs.append(generate(model, _contexts(16), 10))
    assert outs[0] == outs[1]


DECODE_COPY = """
import gc, importlib.util, sys, torch
from mhar.model.routing import decode
spec = importlib.util.spec_from_file_location("shipped_copy_of_decode", decode.__file__)
copy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copy)   # what loading a Hugging Face export does in a process that imported mhar
buf = torch.randn(4, 1, 1, 8)
ms = buf.pow(2).mean(-1)
a = copy.decode_read(buf.clone(), ms.clone(), 3, torch.ones(8), torch.ones(8), 2, 1e-6)
del copy
gc.collect()                    # transformers drops the export's modules again
b = decode.decode_read(buf.clone(), ms.clone(), 3, torch.ones(8), torch.ones(8), 2, 1e-6)
print(bool(torch.equal(a, b)))
"""


def test_a_shipped_copy_of_the_decode_op_leaves_the_package_op_working():
    """An export ships routing/decode.py; loading it where mhar is imported must not define the custom op a second
    time (that corrupts the dispatcher: a later decode read crashed the process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-c", DECODE_COPY], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.split()[-1] == "True", (res.returncode, res.stderr[-2000:])
