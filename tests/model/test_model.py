"""The Qwen3-style decoder against direct computations of its defining equations."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mhar.model.config import model_config
from mhar.model.presets import PRESETS, QWEN3_VOCAB
from mhar.model.transformer import MLP, Attention, RMSNorm, Rotary, Transformer, build_model
from mhar.model.preset_table import COLUMNS, format_table, main as presets_main, preset_rows


def _debug(**kw) -> Transformer:
    torch.manual_seed(0)
    return build_model(model_config("debug", **kw))


def test_rmsnorm_matches_torch():
    torch.manual_seed(0)
    norm = RMSNorm(48, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(48) + 0.5)
    x = torch.randn(3, 5, 48)
    torch.testing.assert_close(norm(x), F.rms_norm(x, (48,), norm.weight, eps=1e-6))


def test_swiglu_mlp():
    cfg = model_config("debug")
    torch.manual_seed(0)
    mlp = MLP(cfg)
    x = torch.randn(2, 3, cfg.d_model)
    a, b = x @ mlp.gate_proj.weight.T, x @ mlp.up_proj.weight.T
    ref = (a * torch.sigmoid(a) * b) @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(x), ref)


def _naive_heads(attn: Attention, x: torch.Tensor, theta: float) -> torch.Tensor:
    """GQA + per-head q/k RMSNorm + RoPE (pairs i, i+hd/2) + causal softmax, one head at a time.

    Returns the concatenated head outputs (B, T, H*hd), i.e. the input of o_proj."""
    B, T, _ = x.shape
    H, KV, hd = attn.n_heads, attn.n_kv, attn.hd
    q = (x @ attn.q_proj.weight.T).view(B, T, H, hd)
    k = (x @ attn.k_proj.weight.T).view(B, T, KV, hd)
    v = (x @ attn.v_proj.weight.T).view(B, T, KV, hd)

    def rms(z, w):
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
    half = hd // 2
    ang = torch.tensor([[t * theta ** (-2 * i / hd) for i in range(half)] for t in range(T)])  # (T, hd/2)
    c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]

    def rope(z):
        z1, z2 = z[..., :half], z[..., half:]
        return torch.cat([z1 * c - z2 * s, z1 * s + z2 * c], -1)

    q, k = rope(q), rope(k)
    mask = torch.ones(T, T).tril().bool()
    heads = []
    for h in range(H):
        g = h // (H // KV)  # query head h uses KV head h // (H/KV)
        sc = torch.einsum("btd,bsd->bts", q[:, :, h], k[:, :, g]) / math.sqrt(hd)
        p = sc.masked_fill(~mask, float("-inf")).softmax(-1)
        heads.append(p @ v[:, :, g])
    return torch.cat(heads, -1)


@torch.no_grad()
def test_attention_matches_naive_gqa_rope_qknorm():
    cfg = model_config("debug")
    torch.manual_seed(0)
    attn = Attention(cfg)
    for p in attn.parameters():
        p.copy_(torch.randn_like(p) * (0.2 if p.dim() == 2 else 1.0) + (1.0 if p.dim() == 1 else 0.0))
    x = torch.randn(2, 9, cfg.d_model)
    cos, sin = Rotary(cfg)(9, x.device)
    ref = _naive_heads(attn, x, cfg.rope_theta) @ attn.o_proj.weight.T
    torch.testing.assert_close(attn(x, cos, sin), ref, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_attention_grouped_input():
    """(B,T,G,D) input: identical groups == (B,T,D); group g only drives KV group g's heads."""
    cfg = model_config("debug")
    torch.manual_seed(0)
    attn = Attention(cfg)
    G = cfg.n_kv_heads
    x = torch.randn(2, 6, cfg.d_model)
    cos, sin = Rotary(cfg)(6, x.device)
    torch.testing.assert_close(attn(x.unsqueeze(2).expand(2, 6, G, cfg.d_model), cos, sin), attn(x, cos, sin))
    xs = torch.randn(2, 6, G, cfg.d_model)
    ref = torch.zeros(2, 6, cfg.d_model)  # per group: all heads on x_g, keep only group g's heads
    w = cfg.n_heads // G * attn.hd  # width of one KV group's query heads
    for g in range(G):
        heads = _naive_heads(attn, xs[:, :, g], cfg.rope_theta)[..., g * w:(g + 1) * w]
        ref += heads @ attn.o_proj.weight[:, g * w:(g + 1) * w].T
    torch.testing.assert_close(attn(xs, cos, sin), ref, rtol=1e-5, atol=1e-6)


def test_init_and_tied_embeddings():
    torch.manual_seed(0)
    m = build_model(model_config("tiny"))
    assert m.lm_head.weight is m.embed.weight
    for name, p in m.named_parameters():
        if p.dim() == 2:
            assert abs(p.std().item() - 0.02) < 0.002, name
        else:  # every 1-D parameter is an RMSNorm weight
            assert torch.equal(p, torch.ones_like(p)), name
    assert not any(getattr(mod, "bias", None) is not None for mod in m.modules() if isinstance(mod, torch.nn.Linear))


def test_llama_flavour_untied_no_qk_norm():
    m = _debug(qk_norm=False, tie_embeddings=False,
               rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64})
    assert m.lm_head.weight is not m.embed.weight
    assert isinstance(m.layers[0].attn.q_norm, torch.nn.Identity)
    tied = _debug()
    c = m.cfg
    assert m.num_params() - tied.num_params() == c.vocab_size * c.d_model - c.n_layers * 2 * c.resolved_head_dim
    assert torch.isfinite(m(torch.randint(0, 257, (1, 8))).logits).all()


def test_loss_is_mean_next_token_ce_with_ignore():
    m = _debug()
    ids = torch.randint(0, 257, (2, 8))
    labels = torch.randint(0, 257, (2, 8))
    labels[0, :3] = -100
    out = m(ids, labels=labels)
    logp = out.logits.float().log_softmax(-1)
    keep = labels != -100
    ref = -logp[keep].gather(-1, labels[keep][:, None]).mean()
    torch.testing.assert_close(out.loss, ref)


def _expected_params(cfg) -> int:
    """Count from the architecture's definition (tied embedding, q/k norms, two pre-norms per layer)."""
    d, hd = cfg.d_model, cfg.resolved_head_dim
    attn = d * cfg.n_heads * hd * 2 + d * cfg.n_kv_heads * hd * 2 + 2 * hd
    mlp = 3 * d * cfg.d_ff
    return cfg.vocab_size * d + cfg.n_layers * (attn + mlp + 2 * d) + d


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_parameter_counts(preset):
    cfg = model_config(preset)
    with torch.device("meta"):
        n = Transformer(cfg).num_params()
    assert n == _expected_params(cfg)


def test_paper_scale_names():
    """Table 1 shapes with the tied Qwen3 vocabulary: 100M and 1B are total counts, 350M is non-embedding."""
    rows = {r["preset"]: r for r in preset_rows(["100M", "350M", "1B"])}
    assert all(r["vocab"] == QWEN3_VOCAB for r in rows.values())
    assert 100e6 <= rows["100M"]["params (baseline)"] < 130e6
    assert 350e6 <= rows["350M"]["params non-emb (baseline)"] < 400e6
    assert 1.0e9 <= rows["1B"]["params (baseline)"] < 1.1e9
    tiny = preset_rows(["tiny"])[0]["params (baseline)"]
    assert 1e6 <= tiny <= 10e6  # "a few M parameters"


def test_presets_cli(capsys):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "mhar.model.preset_table"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert all(c in out[0] for c in COLUMNS)
    listed = [line.split()[0] for line in out[2:]]  # the built-in presets (a test may have registered more here)
    assert {"debug", "tiny", "100M", "1B"} <= set(listed) and listed == [n for n in PRESETS if n in listed]
    presets_main(["--markdown"])
    md = capsys.readouterr().out.splitlines()
    assert md[0].startswith("| preset |") and len(md) == 2 + len(PRESETS)
    assert "115,136" in format_table(preset_rows(["debug"]))  # the debug count, as in test_preset_parameter_counts
    assert _expected_params(model_config("debug")) == 115_136


def test_debug_step_is_fast():
    m = _debug()
    ids = torch.randint(0, 257, (4, 64))
    best = float("inf")
    for _ in range(4):  # first one warms up; best-of to resist a busy CI machine
        t0 = time.perf_counter()
        m(ids, labels=ids).loss.backward()
        best = min(best, time.perf_counter() - t0)
    assert best < 1.0, f"debug fwd+bwd took {best:.3f}s"


def test_rope_keeps_fp32_frequencies_after_bf16_cast():
    """model.to(bf16) casts buffers; RoPE angles must still come from fp32 frequencies, kept as a fp32 buffer on
    the model's device (not recomputed on the host at every forward)."""
    from mhar.model.transformer import Rotary, rope_frequencies

    cfg = model_config("debug")
    rot = Rotary(cfg)
    ref_cos, ref_sin = rot(300, torch.device("cpu"))
    rot = rot.to(torch.bfloat16)
    assert rot.inv_freq.dtype == torch.float32  # restored by Rotary._apply
    cos, sin = rot(300, torch.device("cpu"))
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    assert torch.equal(rope_frequencies(cfg), Rotary(cfg).inv_freq)
