"""The authors' Qwen3-AttnRes checkpoints (their ``modeling_qwen3_attnres.py`` key layout and config fields)
import into our variants with the logits of their formulas.

The reference forward below is written here from their published semantics (a read stacks the
``blocks`` list plus the current ``partial_block``, keys = RMSNorm over the full width, einsum logits,
softmax over sources; ``full*`` modes append the previous partial and make the sublayer output the new
partial; ``block`` closes the running sum at the first layer of each block of ceil(L / num_blocks)
layers; a final read before ``model.norm``), with its own attention (explicit softmax, not SDPA), RoPE
and MLP; it never calls ``mhar.model.transformer``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("safetensors")
from safetensors.torch import save_file  # noqa: E402

from mhar.runs.checkpoint import load_model  # noqa: E402
from mhar.hf import ImportHFError, import_hf  # noqa: E402
from mhar.hf.authors import AuthorsFormatError, convert_authors  # noqa: E402

torch.set_num_threads(1)
V, D, NH, NKV, HD, FF, EPS, THETA = 101, 64, 4, 2, 16, 96, 1e-6, 10000.0


# --- their checkpoint, built from the documented names and shapes ---------------------------------------
def authors_checkpoint(folder: Path, mode: str, layers: int = 4, heads: int = 4, num_blocks: int = 2,
                       tie: bool = False, seed: int = 0, extra_config: dict | None = None,
                       drop: tuple = (), add: dict | None = None, vocab: int = V) -> tuple[Path, dict, dict]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    def norm_w(n):
        return 1.0 + rnd(n, scale=0.1)

    t = {"model.embed_tokens.weight": rnd(vocab, D, scale=1.0), "model.norm.weight": norm_w(D)}
    if not tie:
        t["lm_head.weight"] = rnd(vocab, D)
    groups = NKV if mode == "full_hw" else 1
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": rnd(NH * HD, D), p + "self_attn.k_proj.weight": rnd(NKV * HD, D),
                  p + "self_attn.v_proj.weight": rnd(NKV * HD, D), p + "self_attn.o_proj.weight": rnd(D, NH * HD),
                  p + "self_attn.q_norm.weight": norm_w(HD), p + "self_attn.k_norm.weight": norm_w(HD),
                  p + "mlp.gate_proj.weight": rnd(FF, D), p + "mlp.up_proj.weight": rnd(FF, D),
                  p + "mlp.down_proj.weight": rnd(D, FF), p + "input_layernorm.weight": norm_w(D),
                  p + "post_attention_layernorm.weight": norm_w(D),
                  # trained pseudo-queries are far from their zero init: make the depth softmax peaked
                  p + "attn_res_proj.weight": rnd(groups, D, scale=0.6), p + "attn_res_norm.weight": norm_w(D),
                  p + "mlp_res_proj.weight": rnd(1, D, scale=0.6), p + "mlp_res_norm.weight": norm_w(D)})
    t["model.final_res_proj.weight"] = rnd(1, D, scale=0.6)
    t["model.final_res_norm.weight"] = norm_w(D)
    for k in drop:
        t.pop(k)
    t.update(add or {})
    cfg = {"architectures": ["Qwen3AttnResForCausalLM"], "model_type": "qwen3_attnres", "vocab_size": vocab,
           "hidden_size": D, "intermediate_size": FF, "num_hidden_layers": layers, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HD, "hidden_act": "silu", "max_position_embeddings": 128,
           "rms_norm_eps": EPS, "rope_theta": THETA, "tie_word_embeddings": tie, "attention_bias": False,
           "use_sliding_window": False, "attnres_mode": mode, "attnres_num_heads": heads,
           "attnres_num_blocks": num_blocks, "attnres_gate_type": "bias", "torch_dtype": "float32"}
    cfg.update(extra_config or {})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in t.items()}, str(folder / "model.safetensors"))
    return folder, cfg, t


# --- their formulas ----------------------------------------------------------------------------------------
def rms(x, w, eps=EPS):
    x = x.double()
    return w.double() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def read(sources, proj_w, norm_w, heads):
    """Their (multi-head) depth read: einsum logits over the stacked sources, softmax over sources."""
    Vs = torch.stack(sources, 0)  # (N, B, T, D)
    N, B, T, _ = Vs.shape
    K = rms(Vs, norm_w)
    q = proj_w.double().reshape(heads, D // heads)
    logits = torch.einsum("hk,nbthk->nbth", q, K.view(N, B, T, heads, D // heads))
    w = logits.softmax(0)
    return torch.einsum("nbth,nbthk->bthk", w, Vs.view(N, B, T, heads, D // heads)).reshape(B, T, D)


def read_groups(sources, proj_w, norm_w):
    """full_hw attention read: one full-width query per KV group, one shared key norm -> (B, T, G, D)."""
    Vs = torch.stack(sources, 0)
    logits = torch.einsum("gd,nbtd->nbtg", proj_w.double(), rms(Vs, norm_w))
    return torch.einsum("nbtg,nbtd->btgd", logits.softmax(0), Vs)


def rope(x, T):
    inv = 1.0 / (THETA ** (torch.arange(0, HD, 2).double() / HD))
    ang = torch.arange(T).double()[:, None] * inv[None]  # (T, HD/2)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(x, t, p):
    """Qwen3 attention; x (B, T, D), or (B, T, G, D): group g's query heads, key and value read x[:, :, g]."""
    wq, wk, wv = (t[p + f"self_attn.{n}_proj.weight"].double() for n in "qkv")
    if x.dim() == 4:
        B, T = x.shape[:2]
        q = torch.einsum("ged,btgd->btge", wq.view(NKV, -1, D), x).reshape(B, T, NH, HD)
        k = torch.einsum("ged,btgd->btge", wk.view(NKV, -1, D), x).reshape(B, T, NKV, HD)
        v = torch.einsum("ged,btgd->btge", wv.view(NKV, -1, D), x).reshape(B, T, NKV, HD)
    else:
        B, T = x.shape[:2]
        q, k, v = (x @ w.T for w in (wq, wk, wv))
        q, k, v = q.view(B, T, NH, HD), k.view(B, T, NKV, HD), v.view(B, T, NKV, HD)
    q = rope(rms(q, t[p + "self_attn.q_norm.weight"]).transpose(1, 2), T)
    k = rope(rms(k, t[p + "self_attn.k_norm.weight"]).transpose(1, 2), T)
    v = v.transpose(1, 2)
    k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(HD)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, NH * HD)
    return y @ t[p + "self_attn.o_proj.weight"].double().T


def mlp(x, t, p):
    g, u, d = (t[p + f"mlp.{n}_proj.weight"].double() for n in ("gate", "up", "down"))
    return (F.silu(x @ g.T) * (x @ u.T)) @ d.T


@torch.no_grad()
def their_logits(t, cfg, ids):
    mode, L, H = cfg["attnres_mode"], cfg["num_hidden_layers"], cfg["attnres_num_heads"]
    emb = t["model.embed_tokens.weight"].double()[ids]
    blocks, partial = [], emb
    lpb = max(1, -(-L // cfg["attnres_num_blocks"]))
    for i in range(L):
        p = f"model.layers.{i}."
        heads = 1 if mode in ("full", "block") else H
        if mode == "full_hw":
            h = read_groups(blocks + [partial], t[p + "attn_res_proj.weight"], t[p + "attn_res_norm.weight"])
        else:
            h = read(blocks + [partial], t[p + "attn_res_proj.weight"], t[p + "attn_res_norm.weight"], heads)
        if mode == "block" and i % lpb == 0:
            blocks, partial = blocks + [partial], torch.zeros_like(partial)
        a = attention(rms(h, t[p + "input_layernorm.weight"]), t, p)
        if mode == "block":
            partial = partial + a
        else:
            blocks, partial = blocks + [partial], a
        h = read(blocks + [partial], t[p + "mlp_res_proj.weight"], t[p + "mlp_res_norm.weight"], heads)
        m = mlp(rms(h, t[p + "post_attention_layernorm.weight"]), t, p)
        if mode == "block":
            partial = partial + m
        else:
            blocks, partial = blocks + [partial], m
    heads = 1 if mode in ("full", "block") else H
    final = read(blocks + [partial], t["model.final_res_proj.weight"], t["model.final_res_norm.weight"], heads)
    head = t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
    return rms(final, t["model.norm.weight"]) @ head.double().T


IDS = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("mode,layers,heads,blocks,tie,variant", [
    ("full_mh", 3, 4, 8, False, "mhar"),
    ("full_mh", 2, 8, 8, True, "mhar"),
    ("full", 3, 8, 8, False, "attnres"),
    ("block", 4, 8, 2, False, "block_attnres"),  # 2 blocks of 2 layers
    ("block", 4, 8, 3, True, "block_attnres"),  # ceil(4/3) = 2 layers per block -> 2 blocks
    ("block", 3, 8, 8, False, "block_attnres"),  # 1 layer per block -> 3 blocks
    ("full_hw", 2, 1, 8, False, "mhar_hw"),
])
def test_authors_checkpoint_imports_with_their_logits(tmp_path, mode, layers, heads, blocks, tie, variant):
    folder, cfg, t = authors_checkpoint(tmp_path / "theirs", mode, layers, heads, blocks, tie)
    rep = import_hf(folder, tmp_path / "model.pt", tokenizer="byte")
    assert rep["model_type"] == "qwen3_attnres" and rep["attnres_mode"] == mode and rep["variant"] == variant
    model, _, blob = load_model(tmp_path / "model.pt")
    assert blob["extra"]["import_hf"]["weights"]["model.safetensors"]  # the source's hash is recorded
    if variant == "mhar":
        assert model.cfg.residual.heads == heads
    if variant == "block_attnres":
        assert model.cfg.residual.blocks == layers // max(1, -(-layers // blocks))
    ref = their_logits(t, cfg, IDS)
    with torch.no_grad():
        got = model(IDS).logits.double()
    assert ref.std() > 0.5  # logits far from flat: a wrong mix would show
    # an fp32 model (its norms and routing compute in fp32) against a float64 reference: fp32 rounding,
    # which grows with the logits' scale (measured up to 4e-6 of max |logit| here; the reference itself evaluated
    # in fp32 differs from its float64 values by as much)
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= 1e-5 * scale, ((got - ref).abs().max().item(), scale)
    # the comparison has power: halving one routing query moves the reference far more than the tolerance
    t2 = dict(t, **{"model.final_res_proj.weight": t["model.final_res_proj.weight"] * 0.5})
    assert (their_logits(t2, cfg, IDS) - ref).abs().max().item() > 1e-3 * scale


@pytest.mark.parametrize("kw,field", [
    (dict(mode="delta_block"), "attnres_mode 'delta_block'"),
    (dict(mode="block_mh"), "attnres_mode 'block_mh'"),
    (dict(mode="full_mh", extra_config={"attnres_gate_type": "sigmoid_scalar"}), "attnres_gate_type"),
    (dict(mode="full", extra_config={"attnres_recency_bias_init": 3.0}), "attnres_recency_bias_init"),
    (dict(mode="full", add={"model.layers.0.attn_res_bias": torch.tensor(3.0)}), "_res_bias"),
    (dict(mode="block", layers=3, num_blocks=2), "attnres_num_blocks 2"),  # blocks of 2 layers, last of 1
    (dict(mode="full_hw", heads=8), "attnres_num_heads 8"),
    (dict(mode="full", drop=("model.final_res_proj.weight",)), "final_res_proj"),
    (dict(mode="full_mh", extra_config={"use_sliding_window": True}), "use_sliding_window"),
    (dict(mode="full_mh", extra_config={"attention_bias": True}), "attention_bias"),
    (dict(mode="full_mh", add={"model.layers.0.v_res_proj.weight": torch.zeros(1, D)}), "v_res_proj"),
])
def test_unconvertible_checkpoints_are_refused_naming_the_field(tmp_path, kw, field):
    folder, _, _ = authors_checkpoint(tmp_path / "theirs", **kw)
    with pytest.raises(ImportHFError, match=field.replace("*", r"\*")):
        import_hf(folder, tmp_path / "model.pt", tokenizer="byte")
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize("mode,fields,needle", [
    ("block", {"attnres_num_blocks": 0}, "attnres_num_blocks 0 in config.json is not a whole number >= 1"),
    ("block", {"attnres_num_blocks": 2.5}, "attnres_num_blocks 2.5 in config.json is not a whole number >= 1"),
    ("full_mh", {"attnres_num_heads": 3}, "attnres_num_heads 3 in config.json does not divide hidden_size 64"),
    ("full_mh", {"attnres_num_heads": 0}, "attnres_num_heads 0 in config.json is not a whole number >= 1"),
    ("full_mh", {"attnres_num_heads": 4.0}, "attnres_num_heads 4.0 in config.json is not a whole number >= 1"),
    ("full", {"attnres_use_null_source": "no"}, 'attnres_use_null_source "no" in config.json is not true or false'),
    ("full_mh", {"vocab_size": -5}, "vocab_size -5 in config.json is not a whole number >= 1"),
])
def test_mhar_layout_field_of_the_wrong_type_or_range_is_one_line_naming_it(tmp_path, capsys, mode, fields, needle):
    from mhar.__main__ import main

    folder, _, _ = authors_checkpoint(tmp_path / "theirs", mode, extra_config=fields)
    out = tmp_path / "out" / "m.pt"
    assert main(["import-hf", str(folder), "--out", str(out), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_null_sources_unused_by_full_modes_are_dropped_with_a_note(tmp_path):
    add = {f"model.layers.{i}.{s}_null_source": torch.ones(D) for i in range(2) for s in ("attn", "mlp")}
    folder, cfg, t = authors_checkpoint(tmp_path / "theirs", "full_mh", layers=2, add=add,
                                        extra_config={"attnres_use_null_source": True})
    cfg_ours, state, notes = convert_authors(json.loads((folder / "config.json").read_text()),
                                             {k: v for k, v in t.items()})
    assert any("null_source" in n for n in notes) and not any("null" in k for k in state)


def test_cli_import_prints_one_error_line(tmp_path, capsys):
    from mhar.__main__ import main

    folder, _, _ = authors_checkpoint(tmp_path / "theirs", "delta")
    assert main(["import-hf", str(folder), "--out", str(tmp_path / "m.pt"), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "attnres_mode 'delta'" in err[0]
    with pytest.raises(AuthorsFormatError):
        convert_authors({"model_type": "qwen3"}, {})
