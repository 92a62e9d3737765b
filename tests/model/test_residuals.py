"""Residual variants: registry, exactness at init, and independent naive references.

The naive references below are written from the papers' equations, one token
at a time in float64 Python arithmetic, and share nothing with mhar.model.routing or
mhar.model.residuals except the model's sublayer modules (attention / MLP with their
pre-norms), which they call as black boxes.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mhar.model.config import ConfigError, model_config
from mhar.model.transformer import Transformer, build_model
from mhar.model.residuals import RESIDUALS, build_residual, register, variant_names

# Variants registered from test modules join every registry-wide test below, as a user's variant would: a
# non-routed one (toy_gated) and a routed one (toy_routed). The tests choose by class property, never by name.
import tests.toy_routed  # noqa: F401
import tests.toy_variant  # noqa: F401

B, T = 2, 7  # T odd on purpose
VOCAB = 257

# (variant, extra residual config) for every registered variant; hyper in both forms; a variant whose head
# count shows in its name (``shows_heads``) also with H=4. `debug` has 2 layers (4 sublayers): the defaults
# blocks=8 and delta_block_layers=4 do not fit it.
_DEBUG_EXTRA = {"block_attnres": {"blocks": 2}, "mhar_delta": {"delta_block_layers": 1, "heads": 4}}
ALL_VARIANTS = [(v, _DEBUG_EXTRA.get(v, {})) for v in sorted(RESIDUALS)] + [("hyper", {"hyper_dynamic": False})] + [
    (v, {**_DEBUG_EXTRA.get(v, {}), "heads": 4}) for v in sorted(RESIDUALS)
    if RESIDUALS[v].shows_heads and "heads" not in _DEBUG_EXTRA.get(v, {})]
ROUTED_VARIANTS = [(v, e) for v, e in ALL_VARIANTS if RESIDUALS[v].routed]
UNROUTED_VARIANTS = [(v, e) for v, e in ALL_VARIANTS if not RESIDUALS[v].routed]


def _ids(seed: int = 0, b: int = B, t: int = T) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _model(variant: str, seed: int = 0, **residual) -> Transformer:
    torch.manual_seed(seed)
    return build_model(model_config("debug", residual={"variant": variant, **residual}))


def _randomize_routing(model: Transformer, seed: int = 1) -> None:
    """Non-zero queries (scale 1: far from uniform) and non-trivial key-norm weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.residual.named_parameters():
            if "quer" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif "key_norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))


def _shared_state(src: Transformer, dst: Transformer) -> None:
    """Copy every non-residual parameter (embedding, sublayers, norms) from src to dst."""
    sd = {k: v for k, v in src.state_dict().items() if not k.startswith("residual.")}
    missing, unexpected = dst.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.startswith("residual.") for k in missing)


# --- naive depth routing, written from the equations -------------------------------
def naive_route(sources: list[torch.Tensor], q: torch.Tensor, g: torch.Tensor, H: int, eps: float) -> torch.Tensor:
    """out[b,t] per token: k_i = RMSNorm(s_i) g over full D; per head h softmax_i <q_h, k_i[h]>; mix s_i[h]."""
    Bn, Tn, D = sources[0].shape
    dh = D // H
    out = torch.empty(Bn, Tn, D, dtype=torch.float64)
    q, g = q.double().tolist(), g.double().tolist()
    for b in range(Bn):
        for t in range(Tn):
            vals = [s[b, t].double().tolist() for s in sources]
            keys = []
            for v in vals:
                r = 1.0 / math.sqrt(sum(x * x for x in v) / D + eps)
                keys.append([x * r * gi for x, gi in zip(v, g)])
            for h in range(H):
                lo, hi = h * dh, (h + 1) * dh
                scores = [sum(q[j] * k[j] for j in range(lo, hi)) for k in keys]
                m = max(scores)
                e = [math.exp(s - m) for s in scores]
                z = sum(e)
                for j in range(lo, hi):
                    out[b, t, j] = sum(ei / z * v[j] for ei, v in zip(e, vals))
    return out.float()


def naive_routed_logits(model: Transformer, ids: torch.Tensor, H: int) -> torch.Tensor:
    """AttnRes (H=1) / MHAR forward: replacement routing over embedding + all sublayer outputs."""
    res, eps = model.residual, model.cfg.residual.routing_eps
    cos, sin = model.rotary(ids.shape[1], ids.device)
    sources = [model.embed(ids)]
    for i in range(model.cfg.n_sublayers):
        h = naive_route(sources, res.queries[i], res.key_norms[i], H, eps)
        sources.append(model.sublayer(i, h, cos, sin))
    h = naive_route(sources, res.queries[-1], res.key_norms[-1], H, eps)
    return model.lm_head(model.final_norm(h))


def naive_block_logits(model: Transformer, ids: torch.Tensor, blocks: int) -> torch.Tensor:
    """Block AttnRes: sources b_0 = emb, completed block sums, + the open block's partial sum."""
    res, eps, S = model.residual, model.cfg.residual.routing_eps, model.cfg.n_sublayers
    cos, sin = model.rotary(ids.shape[1], ids.device)
    size = [0] * blocks
    for i in range(S):  # block sizes: floor(i * blocks / S) assigns sublayer i
        size[i * blocks // S] += 1
    done, partial, i = [model.embed(ids)], None, 0
    for n_in_block in size:
        partial = None
        for _ in range(n_in_block):
            srcs = done + ([partial] if partial is not None else [])
            out = model.sublayer(i, naive_route(srcs, res.queries[i], res.key_norms[i], 1, eps), cos, sin)
            partial = out if partial is None else partial + out
            i += 1
        done.append(partial)
    h = naive_route(done, res.queries[-1], res.key_norms[-1], 1, eps)
    return model.lm_head(model.final_norm(h))


def naive_headwise_logits(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """MHAR-HW: attention gets one single-head mixture per KV group, stacked (B, T, G, D)."""
    res, eps, L = model.residual, model.cfg.residual.routing_eps, model.cfg.n_layers
    cos, sin = model.rotary(ids.shape[1], ids.device)
    sources = [model.embed(ids)]
    for layer in range(L):
        G = model.cfg.n_kv_heads
        h = torch.stack([naive_route(sources, res.attn_queries[layer, g], res.attn_key_norms[layer, g], 1, eps)
                         for g in range(G)], dim=2)
        sources.append(model.sublayer(2 * layer, h, cos, sin))
        h = naive_route(sources, res.queries[layer], res.key_norms[layer], 1, eps)
        sources.append(model.sublayer(2 * layer + 1, h, cos, sin))
    h = naive_route(sources, res.queries[L], res.key_norms[L], 1, eps)
    return model.lm_head(model.final_norm(h))


def naive_hyper_logits(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """Hyper-connections per the paper, explicit loops over streams; dynamic parts when present."""
    cfg = model.cfg
    n = cfg.residual.hyper_n
    cos, sin = model.rotary(ids.shape[1], ids.device)
    emb = model.embed(ids)
    Hs = [emb.clone() for _ in range(n)]  # n copies of the embedding, each (B, T, D)
    for k, hc in enumerate(model.residual.connections):
        A_m = hc.static_alpha[:, 0].expand(B, T, n)  # (B, T, n)
        A_r = hc.static_alpha[:, 1:].expand(B, T, n, n)
        Bv = hc.static_beta.expand(B, T, n)
        if hc.dynamic:
            def norm(x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * hc.norm_weight
            nh = [norm(x) for x in Hs]  # per stream
            A_m = A_m + hc.dynamic_alpha_scale * torch.stack(
                [torch.tanh(x @ hc.dynamic_alpha_fn[:, 0]) for x in nh], -1)
            A_r = A_r + hc.dynamic_alpha_scale * torch.stack(
                [torch.tanh(x @ hc.dynamic_alpha_fn[:, 1:]) for x in nh], -2)  # row j from stream j
            Bv = Bv + hc.dynamic_beta_scale * torch.stack([torch.tanh(x @ hc.dynamic_beta_fn) for x in nh], -1)
        h0 = sum(A_m[..., j, None] * Hs[j] for j in range(n))  # A_m^T H
        out = model.sublayer(k, h0, cos, sin)
        Hs = [sum(A_r[..., j, i, None] * Hs[j] for j in range(n)) + Bv[..., i, None] * out for i in range(n)]
    return model.lm_head(model.final_norm(sum(Hs) / n))


# --- registry ------------------------------------------------------------------------
PAPER_VARIANTS = {"baseline", "hyper", "attnres", "block_attnres", "mhar", "mhar_hw", "mhar_delta"}
REPO = Path(__file__).resolve().parents[2]


def test_package_modules_register_themselves():
    """Importing mhar.model.residuals imports every module of the package (no import list to edit), and each
    registered built-in class comes from one of them."""
    code = ("import sys, mhar.model.residuals as R\n"
            "print(sorted(m for m in sys.modules if m.startswith('mhar.model.residuals.')))\n"
            "print(sorted({c.__module__ for c in R.RESIDUALS.values()}))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    loaded, defining = (eval(line) for line in res.stdout.splitlines()[-2:])
    files = sorted(f"mhar.model.residuals.{p.stem}" for p in (REPO / "mhar" / "model" / "residuals").glob("*.py")
                   if not p.name.startswith("_"))
    assert loaded == files and set(defining) <= set(files)
    assert PAPER_VARIANTS <= set(variant_names())


def test_config_validation_uses_the_registry():
    with pytest.raises(ConfigError, match="model.residual.variant: unknown variant 'nope'") as e:
        model_config("debug", residual={"variant": "nope"})
    assert all(v in str(e.value) for v in variant_names())  # lists what is registered, nothing else


def test_registering_a_taken_name_fails():
    with pytest.raises(ValueError, match="registered twice"):
        @register("mhar")
        class Other(RESIDUALS["baseline"]):
            pass
    assert RESIDUALS["mhar"].__name__ == "MultiHeadAttnRes"
    with pytest.raises(ValueError, match="variant name"):
        register("bad name")


@pytest.mark.parametrize("module,message", [
    ("tests.no_such_module", "cannot import 'tests.no_such_module'"),
    ("tests/toy_variant.py", "not a Python module name"),
    ("tests.fixtures_analysis", "does not register it"),  # importable, registers nothing
])
def test_bad_variant_module_is_a_config_error(module, message):
    with pytest.raises(ConfigError, match=message):
        model_config("debug", residual={"variant": "toy_missing", "module": module})


def test_user_variant_from_its_own_module_is_its_definition():
    """The toy variant (tests/toy_variant.py) is found through model.residual.module; at init it is the
    baseline exactly (every gate 1), and with every gate 0 the sublayers contribute nothing."""
    model = _model("toy_gated", module="tests.toy_variant")
    assert type(model.residual).__module__ == "tests.toy_variant" and "toy_gated" in variant_names()
    base = _model("baseline")
    _shared_state(model, base)
    ids = _ids()
    torch.testing.assert_close(model(ids).logits, base(ids).logits, rtol=0, atol=0)
    with torch.no_grad():
        model.residual.gates.zero_()
    want = model.lm_head(model.final_norm(model.embed(ids)))
    torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="toy_gated has no routing heads"):
        model_config("debug", residual={"variant": "toy_gated", "module": "tests.toy_variant", "heads": 2})


def test_user_variant_trains_through_mhar_train(tmp_path):
    """`python -m mhar.train` trains a variant that only its own module (outside mhar/) defines, and the
    checkpoint loads again (the config names the module)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a small corpus for the toy variant\n" for i in range(400)))
    run, cfg = tmp_path / "run", tmp_path / "toy.yaml"
    cfg.write_text("model:\n  preset: debug\n  residual: {variant: toy_gated, module: tests.toy_variant}\n")
    cmd = [sys.executable, "-m", "mhar.train", str(cfg), f"data.corpus={corpus}", "data.seq_len=32",
           f"data.cache_dir={tmp_path / 'cache'}", "data.val_tokens=256", "train.steps=4", "train.global_batch=4",
           "train.micro_batch=2", "train.warmup_steps=1", "train.eval_every=2", "train.tail_k=1",
           "train.lr=1e-2", "train.threads=1", "train.device=cpu", "--out", str(run)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run"]["residual"]["variant"] == "toy_gated"
    assert summary["run"]["residual"]["module"] == "tests.toy_variant"
    assert math.isfinite(summary["tail_mean_val_loss"])
    # a fresh process (nothing registered but the built-ins) loads the checkpoint: its config names the module
    code = ("import sys; from mhar.runs.checkpoint import load_model; m = load_model(sys.argv[1])[0]; "
            "print(m.residual.name, m.residual.gates.tolist())")
    res = subprocess.run([sys.executable, "-c", code, str(run / "model.pt")], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    name, gates = res.stdout.split(" ", 1)
    assert name == "toy_gated" and len(eval(gates)) == 4 and eval(gates) != [1.0] * 4  # the gates trained


def test_unregistered_variant_is_a_config_error():
    cfg = model_config("debug")
    cfg.residual.variant = "nope"  # bypasses validate(): build_residual must still refuse
    with pytest.raises(ConfigError, match="residual.variant"):
        build_residual(cfg)


@pytest.mark.parametrize("variant,extra", ALL_VARIANTS, ids=lambda x: str(x) if not isinstance(x, dict) else "")
def test_forward_backward_every_variant(variant, extra):
    model = _model(variant, **extra)
    ids = _ids()
    out = model(ids, labels=_ids(1))
    assert out.logits.shape == (B, T, VOCAB)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{variant}: no gradient for {name}"
        assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("variant,extra", ALL_VARIANTS, ids=lambda x: str(x) if not isinstance(x, dict) else "")
def test_causal_every_variant(variant, extra):
    """Changing the last token never changes earlier logits (no leak through the residual)."""
    model = _model(variant, **extra)
    _randomize_routing(model)
    a, b = _ids(), _ids()
    b[:, -1] = (b[:, -1] + 1) % VOCAB
    with torch.no_grad():
        la, lb = model(a).logits, model(b).logits
    assert torch.equal(la[:, :-1], lb[:, :-1])
    assert not torch.equal(la[:, -1], lb[:, -1])


# --- routed variants -----------------------------------------------------------------
@pytest.mark.parametrize("variant,extra", ROUTED_VARIANTS, ids=lambda x: str(x) if not isinstance(x, dict) else "")
def test_zero_init_routing_is_exactly_uniform(variant, extra):
    model = _model(variant, **extra)
    out = model(_ids(), collect_routing=True)
    assert out.routing, f"{variant} logged no routing weights"
    for site, w in out.routing.items():  # (B, T, H, N)
        assert w.shape[:2] == (B, T), site
        assert torch.equal(w, torch.full_like(w, 1.0 / w.shape[-1])), site


@pytest.mark.parametrize("variant,extra", UNROUTED_VARIANTS, ids=lambda x: str(x) if not isinstance(x, dict) else "")
def test_unrouted_variants_log_nothing(variant, extra):
    assert _model(variant, **extra)(_ids(), collect_routing=True).routing == {}


def test_routing_log_sites_and_shapes():
    model = _model("mhar", heads=4)
    out = model(_ids(), collect_routing=True)
    S = model.cfg.n_sublayers
    expect = [f"L{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}" for i in range(S)] + ["final"]
    assert list(out.routing) == expect
    for n, site in enumerate(expect):
        assert out.routing[site].shape == (B, T, 4, n + 1)
    assert model(_ids()).routing is None


def test_mhar_h1_equals_attnres_on_same_weights():
    a = _model("attnres")
    _randomize_routing(a)
    m = _model("mhar", seed=5, heads=1)
    m.load_state_dict(a.state_dict())
    ids = _ids()
    assert (m(ids).logits - a(ids).logits).abs().max().item() <= 1e-6


@pytest.mark.parametrize("variant,heads", [("attnres", 1), ("mhar", 1), ("mhar", 4), ("mhar", 64)])
@torch.no_grad()
def test_routed_matches_naive_per_token_reference(variant, heads):
    model = _model(variant, heads=heads)
    _randomize_routing(model)
    ids = _ids()
    ref = naive_routed_logits(model, ids, heads)
    torch.testing.assert_close(model(ids).logits, ref, rtol=1e-4, atol=1e-5)
    # the routing is far from uniform, so this comparison is not trivially satisfied
    w = model(ids, collect_routing=True).routing["final"]
    assert (w - 1.0 / w.shape[-1]).abs().max() > 0.05


@pytest.mark.parametrize("blocks", [1, 2, 3])
@torch.no_grad()
def test_block_attnres_matches_naive_reference(blocks):
    model = _model("block_attnres", blocks=blocks)
    _randomize_routing(model)
    ids = _ids()
    torch.testing.assert_close(model(ids).logits, naive_block_logits(model, ids, blocks), rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_block_attnres_with_one_sublayer_per_block_is_attnres():
    blk = _model("block_attnres", blocks=4)  # debug: 2 layers -> 4 sublayers
    _randomize_routing(blk)
    att = _model("attnres", seed=3)
    att.load_state_dict(blk.state_dict())
    ids = _ids()
    assert torch.equal(blk(ids).logits, att(ids).logits)


def test_block_attnres_routing_sources_count():
    model = _model("block_attnres", blocks=2)  # blocks {0,1} {2,3}
    r = model(_ids(), collect_routing=True).routing
    # N = completed blocks (incl. b_0) + partial-if-open
    assert {k: v.shape[-1] for k, v in r.items()} == {"L0.attn": 1, "L0.mlp": 2, "L1.attn": 2, "L1.mlp": 3,
                                                       "final": 3}


@torch.no_grad()
def test_headwise_matches_naive_reference():
    model = _model("mhar_hw")
    _randomize_routing(model)
    ids = _ids()
    torch.testing.assert_close(model(ids).logits, naive_headwise_logits(model, ids), rtol=1e-4, atol=1e-5)
    r = model(ids, collect_routing=True).routing
    G = model.cfg.n_kv_heads
    assert r["L0.attn"].shape == (B, T, G, 1) and r["L1.attn"].shape == (B, T, G, 3)
    assert r["L0.mlp"].shape == (B, T, 1, 2) and r["final"].shape == (B, T, 1, 5)


@pytest.mark.parametrize("variant,extra,reads", [
    ("attnres", {}, lambda c: 2 * c.n_layers + 1),
    ("mhar", {"heads": 4}, lambda c: 2 * c.n_layers + 1),
    ("block_attnres", {"blocks": 2}, lambda c: 2 * c.n_layers + 1),
    ("mhar_hw", {}, lambda c: c.n_layers * (c.n_kv_heads + 1) + 1),
])
def test_routed_variants_use_the_router(variant, extra, reads):
    """Every routed read goes through the Router (so eager/compile/fused are interchangeable)."""
    model = _model(variant, **extra)
    inner, calls = model.residual.router, []

    class Spy:
        def __getattr__(self, name):
            return getattr(inner, name)

        def read(self, *a, **k):
            calls.append(a[3])  # num_heads
            return inner.read(*a, **k)

    ids = _ids()
    ref = model(ids).logits
    model.residual.router = Spy()
    assert torch.equal(model(ids).logits, ref)
    assert len(calls) == reads(model.cfg)


# --- hyper-connections ---------------------------------------------------------------
def _final_norm_input(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    seen = []
    hook = model.final_norm.register_forward_hook(lambda m, inp, out: seen.append(inp[0]))
    try:
        model(ids)
    finally:
        hook.remove()
    return seen[0]


@pytest.mark.parametrize("dynamic", [False, True])
@torch.no_grad()
def test_hyper_equals_prenorm_at_init(dynamic):
    base = _model("baseline")
    for p in base.parameters():  # non-trivial norm weights too
        p.add_(0.01 * torch.randn_like(p))
    hyp = _model("hyper", seed=9, hyper_dynamic=dynamic)
    _shared_state(base, hyp)
    n, ids = hyp.cfg.residual.hyper_n, _ids()
    assert n == 4
    # streams are exact copies of the pre-norm stream: the (mean) readout is x itself
    torch.testing.assert_close(_final_norm_input(hyp, ids), _final_norm_input(base, ids), rtol=1e-6, atol=0)
    # hence the same logits as pre-norm with the same sublayer weights
    torch.testing.assert_close(hyp(ids).logits, base(ids).logits, rtol=1e-6, atol=1e-7)


@torch.no_grad()
def test_hyper_single_stream_is_bit_identical_to_prenorm():
    base = _model("baseline")
    hyp = _model("hyper", seed=9, hyper_n=1, hyper_dynamic=True)
    _shared_state(base, hyp)
    ids = _ids()
    assert torch.equal(hyp(ids).logits, base(ids).logits)


@pytest.mark.parametrize("dynamic", [False, True])
@torch.no_grad()
def test_hyper_matches_naive_reference_off_init(dynamic):
    model = _model("hyper", hyper_dynamic=dynamic)
    g = torch.Generator().manual_seed(3)
    for p in model.residual.parameters():
        p.add_(0.3 * torch.randn(p.shape, generator=g))
    ids = _ids()
    torch.testing.assert_close(model(ids).logits, naive_hyper_logits(model, ids), rtol=1e-4, atol=1e-5)


def test_hyper_init_values():
    res = _model("hyper", hyper_n=4, hyper_dynamic=True).residual
    n = 4
    for k, hc in enumerate(res.connections):
        assert torch.equal(hc.static_alpha[:, 0], torch.eye(n)[k % n])  # A_m = e_{k mod n}
        assert torch.equal(hc.static_alpha[:, 1:], torch.eye(n))  # A_r = I
        assert torch.equal(hc.static_beta, torch.ones(n))  # B = 1
        assert not hc.dynamic_alpha_fn.any() and not hc.dynamic_beta_fn.any()  # W = 0
        assert hc.dynamic_alpha_scale.item() == pytest.approx(0.01)
        assert hc.dynamic_beta_scale.item() == pytest.approx(0.01)


# --- parameter counts --------------------------------------------------------------
@pytest.mark.parametrize("preset,extra", [("350M", 100_352), ("1B", 186_880)])
def test_mhar_parameter_overhead(preset, extra):
    def count(variant, **kw):
        with torch.device("meta"):
            return Transformer(model_config(preset, residual={"variant": variant, **kw})).num_params()

    cfg = model_config(preset)
    base = count("baseline")
    assert count("mhar", heads=8) - base == 2 * cfg.d_model * (2 * cfg.n_layers + 1) == extra
    assert count("attnres") == count("mhar", heads=16)  # zero extra parameters over AttnRes
    assert count("block_attnres") - base == extra
    G = cfg.n_kv_heads
    assert count("mhar_hw") - base == 2 * cfg.d_model * (cfg.n_layers * G + cfg.n_layers + 1)


def test_module_key_leaves_the_hashes_of_runs_without_it_unchanged():
    """model.residual.module (and open_attnres' gate_type / recency_bias_init) came after runs were recorded:
    unset, they are not hashed (identity and pairing hashes equal those of the config without the keys); set,
    they are part of the run identity."""
    from mhar.model.config import config_hash
    from mhar.runs.config import IDENTITY_EXCLUDE, identity_hash, load_run_config, pairing_hash

    cfg = load_run_config(REPO / "config" / "train" / "debug.yaml")
    old = cfg.to_dict()
    for key in ("module", "gate_type", "recency_bias_init"):
        del old["model"]["residual"][key]  # the dict a config had before the keys existed
    old["data"]["seed"] = cfg.data_seed
    for key in IDENTITY_EXCLUDE:
        *parents, leaf = key.split(".")
        node = old
        for part in parents:
            node = node.get(part, {})
        node.pop(leaf, None)
    assert identity_hash(cfg) == config_hash(old, 16)
    user = load_run_config(REPO / "config" / "train" / "debug.yaml",
                           ["model.residual.variant=toy_gated", "model.residual.heads=1",
                            "model.residual.module=tests.toy_variant"])
    plain = load_run_config(REPO / "config" / "train" / "debug.yaml",
                            ["model.residual.variant=toy_gated", "model.residual.heads=1"])
    assert identity_hash(user) != identity_hash(plain)
    assert pairing_hash(user) == pairing_hash(cfg)  # pairing ignores the residual section, module included
    open_default = load_run_config(REPO / "config" / "train" / "debug.yaml", ["model.residual.variant=open_attnres"])
    for knob in ("model.residual.gate_type=sigmoid_scalar", "model.residual.recency_bias_init=3.0"):
        set_ = load_run_config(REPO / "config" / "train" / "debug.yaml", ["model.residual.variant=open_attnres", knob])
        assert identity_hash(set_) != identity_hash(open_default), knob


# --- open_attnres (the released Open AttnRes layout) -----------------------------------------------------------
@pytest.mark.parametrize("variant", ["open_attnres", "open_attnres_full"])
@torch.no_grad()
def test_open_attnres_with_a_large_recency_bias_is_the_prenorm_baseline(variant):
    """Its defining property: the residual stream is kept, and a recency bias far above the query logits puts all
    the depth softmax on the current state, so every read is the stream x itself (the baseline's input)."""
    base = _model("baseline")
    ids = _ids()
    ref = base(ids).logits
    big = _model(variant, seed=4, recency_bias_init=60.0)
    _shared_state(base, big)
    _randomize_routing(big)  # |<q, k>| stays far below 60 at d=64
    torch.testing.assert_close(big(ids).logits, ref, rtol=1e-5, atol=1e-5)
    small = _model(variant, seed=4, recency_bias_init=0.0)
    _shared_state(base, small)
    _randomize_routing(small)
    assert (small(ids).logits - ref).abs().max() > 1e-2  # without the bias the read mixes earlier states


# --- a variant's knobs (Residual.knobs): what a variant override may drop -------------------------------------
# A value other than the default of every variant knob, valid on `debug` (2 layers, 4 sublayers) over _DEBUG_EXTRA.
_OTHER_KNOB = {"heads": 2, "hyper_n": 2, "hyper_dynamic": False, "blocks": 1, "delta_block_layers": 2,
               "gate_type": "sigmoid_scalar", "recency_bias_init": 2.0}


def test_variant_knobs_name_residual_config_fields():
    import dataclasses

    from mhar.model.config import VARIANT_KNOBS, ResidualConfig

    assert set(_OTHER_KNOB) == set(VARIANT_KNOBS) <= {f.name for f in dataclasses.fields(ResidualConfig)}
    for name in variant_names():
        knobs = RESIDUALS[name].knobs
        assert knobs is None or set(knobs) <= set(VARIANT_KNOBS), name
    assert all(RESIDUALS[v].knobs is not None for v in PAPER_VARIANTS)  # every built-in variant declares its knobs


def _randomized(model: Transformer, seed: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.state_dict()


@pytest.mark.parametrize("variant", sorted(v for v in RESIDUALS if RESIDUALS[v].knobs is not None))
@torch.no_grad()
def test_a_knob_a_variant_does_not_declare_changes_nothing_it_computes(variant):
    """The fact a variant override drops knobs by: a knob outside the class's `knobs` leaves the parameters and,
    with the same (randomised) weights, the logits bit-identical; each declared knob changes one of them."""
    from mhar.model.config import VARIANT_KNOBS

    base = _DEBUG_EXTRA.get(variant, {})
    ref = _model(variant, **base)
    weights = _randomized(ref)
    ids = _ids()
    want = ref(ids).logits
    for knob in VARIANT_KNOBS:
        other = _model(variant, **{**base, knob: _OTHER_KNOB[knob]})
        fresh = other(ids).logits
        same_shapes = {k: v.shape for k, v in other.state_dict().items()} == {k: v.shape for k, v in weights.items()}
        if knob not in RESIDUALS[variant].knobs:
            assert same_shapes, knob
            other.load_state_dict(weights)
            assert torch.equal(other(ids).logits, want), knob
        else:
            init_same = torch.equal(fresh, _model(variant, **base)(ids).logits)
            if same_shapes:
                other.load_state_dict(weights)
            assert not (same_shapes and init_same and torch.equal(other(ids).logits, want)), knob
