"""The released Open AttnRes checkpoints (``wdlctc/open-attention-residuals``, ``modeling_attnres.py``: the layout
of ``wdlctc/open-attnres-*``) import as ``open_attnres`` / ``open_attnres_full`` with the logits of their equations.

The checkpoints are built here with their tensor names and shapes (``config.json`` + ``model.safetensors``,
random weights, non-zero recency biases and gates). The reference below is a plain float64 loop over their
documented equations, written here; it never calls ``mhar.model``:

    blocks = [e], p = e                                  (e: the token embedding)
    per layer, per sublayer f in (attn, mlp):
        V = stack(blocks + [p]); K = RMSNorm(V) * g_f; z = K q_f; z[-1] += b_f; w = softmax(z over sources)
        r = sum w V;  h = r (bias) | (1 - s) p + s r with s = sigmoid(l_f) | sigmoid(W_f p + c_f) | s = alpha_f
        p = p + f(RMSNorm(h))
        full mode: blocks += [p] after each sublayer; block mode: after the mlp of a layer with (l+1) % P == 0
    logits = RMSNorm(p) @ lm_head^T                       (P = max(1, ceil(L / num_blocks)))
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

from mhar.__main__ import main as mhar_main  # noqa: E402
from mhar.hf import ImportHFError, import_hf  # noqa: E402
from mhar.model.inference import generate  # noqa: E402
from mhar.runs.checkpoint import load_model  # noqa: E402

torch.set_num_threads(1)
V, D, NH, NKV, HD, FF, EPS, THETA = 257, 64, 4, 2, 16, 128, 1e-6, 10000.0
GATES = ("bias", "sigmoid_scalar", "sigmoid_vector", "learnable_alpha")
IDS = torch.randint(0, V, (2, 19), generator=torch.Generator().manual_seed(7))


def released_checkpoint(folder: Path, mode: str = "block", gate: str = "bias", layers: int = 3, num_blocks: int = 2,
                        tie: bool = True, seed: int = 0, extra_config: dict | None = None, drop: tuple = (),
                        add: dict | None = None) -> tuple[Path, dict, dict]:
    """A checkpoint with the names and shapes of their ``Qwen3AttnResForCausalLM`` (random, far from init)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    t = {"model.embed_tokens.weight": rnd(V, D, scale=1.0), "model.norm.weight": 1 + rnd(D, scale=0.1)}
    if not tie:
        t["lm_head.weight"] = rnd(V, D)
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": rnd(NH * HD, D), p + "self_attn.k_proj.weight": rnd(NKV * HD, D),
                  p + "self_attn.v_proj.weight": rnd(NKV * HD, D), p + "self_attn.o_proj.weight": rnd(D, NH * HD),
                  p + "self_attn.q_norm.weight": 1 + rnd(HD, scale=0.1),
                  p + "self_attn.k_norm.weight": 1 + rnd(HD, scale=0.1),
                  p + "mlp.gate_proj.weight": rnd(FF, D), p + "mlp.up_proj.weight": rnd(FF, D),
                  p + "mlp.down_proj.weight": rnd(D, FF), p + "input_layernorm.weight": 1 + rnd(D, scale=0.1),
                  p + "post_attention_layernorm.weight": 1 + rnd(D, scale=0.1)})
        for s in ("attn", "mlp"):
            t[p + f"{s}_res_proj.weight"] = rnd(1, D, scale=0.5)  # trained queries: a peaked depth softmax
            t[p + f"{s}_res_norm.weight"] = 1 + rnd(D, scale=0.2)
            t[p + f"{s}_res_bias"] = rnd((), scale=1.5)
            if gate == "sigmoid_scalar":
                t[p + f"{s}_res_gate_logit"] = rnd((), scale=1.5)
            elif gate == "sigmoid_vector":
                t[p + f"{s}_res_gate_proj.weight"] = rnd(D, D, scale=0.1)
                t[p + f"{s}_res_gate_proj.bias"] = rnd(D, scale=1.0)
            elif gate == "learnable_alpha":
                t[p + f"{s}_res_alpha"] = 0.5 + rnd((), scale=0.4)
    for k in drop:
        t.pop(k)
    t.update(add or {})
    cfg = {"architectures": ["Qwen3AttnResForCausalLM"], "model_type": "qwen3_attnres", "vocab_size": V,
           "hidden_size": D, "intermediate_size": FF, "num_hidden_layers": layers, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HD, "hidden_act": "silu", "max_position_embeddings": 128,
           "rms_norm_eps": EPS, "rope_theta": THETA, "tie_word_embeddings": tie, "attention_bias": False,
           "use_sliding_window": False, "layer_types": ["full_attention"] * layers, "attnres_mode": mode,
           "attnres_num_blocks": num_blocks, "attnres_recency_bias_init": 0.0, "attnres_gate_type": gate,
           "torch_dtype": "float32"}
    cfg.update(extra_config or {})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in t.items()}, str(folder / "model.safetensors"))
    return folder, cfg, t


# --- their equations, float64 -------------------------------------------------------------------------------
def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


def qwen3_attention(x, t, p):
    B, T, _ = x.shape
    q = (x @ t[p + "self_attn.q_proj.weight"].double().T).view(B, T, NH, HD)
    k = (x @ t[p + "self_attn.k_proj.weight"].double().T).view(B, T, NKV, HD)
    v = (x @ t[p + "self_attn.v_proj.weight"].double().T).view(B, T, NKV, HD)
    q, k = rmsnorm(q, t[p + "self_attn.q_norm.weight"]), rmsnorm(k, t[p + "self_attn.k_norm.weight"])
    angle = torch.arange(T).double()[:, None] / THETA ** (torch.arange(0, HD, 2).double() / HD)  # (T, HD/2)
    cos, sin = angle.cos().repeat(1, 2)[:, None], angle.sin().repeat(1, 2)[:, None]  # (T, 1, HD)

    def rotate(u):
        return u * cos + torch.cat([-u[..., HD // 2:], u[..., : HD // 2]], -1) * sin

    q, k = rotate(q), rotate(k)
    out = torch.zeros(B, T, NH, HD, dtype=torch.float64)
    for h in range(NH):  # query head h reads KV head h // (NH / NKV)
        kv = h // (NH // NKV)
        score = torch.einsum("btd,bsd->bts", q[:, :, h], k[:, :, kv]) / math.sqrt(HD)
        score = score.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out[:, :, h] = score.softmax(-1) @ v[:, :, kv]
    return out.reshape(B, T, NH * HD) @ t[p + "self_attn.o_proj.weight"].double().T


def swiglu(x, t, p):
    gate, up, down = (t[p + f"mlp.{n}_proj.weight"].double() for n in ("gate", "up", "down"))
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def depth_read(blocks, partial, t, site):
    values = torch.stack(blocks + [partial])  # (N, B, T, D)
    logits = rmsnorm(values, t[site + "_res_norm.weight"]) @ t[site + "_res_proj.weight"].double().view(D)
    logits[-1] = logits[-1] + t[site + "_res_bias"].double()
    return torch.einsum("nbt,nbtd->btd", logits.softmax(0), values)


def gate_mix(partial, r, t, site, gate):
    if gate == "bias":
        return r
    if gate == "sigmoid_scalar":
        s = torch.sigmoid(t[site + "_res_gate_logit"].double())
    elif gate == "sigmoid_vector":
        w, c = t[site + "_res_gate_proj.weight"].double(), t[site + "_res_gate_proj.bias"].double()
        s = torch.sigmoid(partial @ w.T + c)
    else:
        s = t[site + "_res_alpha"].double()
    return (1 - s) * partial + s * r


@torch.no_grad()
def their_logits(t, cfg, ids):
    mode, gate, L = cfg["attnres_mode"], cfg["attnres_gate_type"], cfg["num_hidden_layers"]
    per_block = max(1, math.ceil(L / cfg["attnres_num_blocks"]))
    e = t["model.embed_tokens.weight"].double()[ids]
    blocks, partial = [e], e
    for i in range(L):
        p = f"model.layers.{i}."
        h = gate_mix(partial, depth_read(blocks, partial, t, p + "attn"), t, p + "attn", gate)
        partial = partial + qwen3_attention(rmsnorm(h, t[p + "input_layernorm.weight"]), t, p)
        if mode == "full":
            blocks = blocks + [partial]
        h = gate_mix(partial, depth_read(blocks, partial, t, p + "mlp"), t, p + "mlp", gate)
        partial = partial + swiglu(rmsnorm(h, t[p + "post_attention_layernorm.weight"]), t, p)
        if mode == "full" or (i + 1) % per_block == 0:
            blocks = blocks + [partial]
    head = t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
    return rmsnorm(partial, t["model.norm.weight"]) @ head.double().T


# --- import == their equations ------------------------------------------------------------------------------
CASES = [(mode, gate) for mode in ("block", "full") for gate in GATES]


@pytest.mark.parametrize("mode,gate", CASES)
def test_released_checkpoint_imports_with_their_logits(tmp_path, mode, gate):
    layers, blocks = (3, 2) if mode == "block" else (2, 8)  # block: P = 2 layers, the last block has 1
    folder, cfg, t = released_checkpoint(tmp_path / "theirs", mode, gate, layers, blocks, tie=gate != "bias")
    rep = import_hf(folder, tmp_path / "model.pt", tokenizer="byte")
    variant = {"block": "open_attnres", "full": "open_attnres_full"}[mode]
    assert (rep["model_type"], rep["attnres_mode"], rep["variant"]) == ("qwen3_attnres", mode, variant)
    model, _, blob = load_model(tmp_path / "model.pt")
    assert model.cfg.residual.gate_type == gate and model.cfg.residual.blocks == (blocks if mode == "block" else 8)
    assert blob["extra"]["import_hf"]["hub_commit"] is None and len(blob["extra"]["import_hf"]["content_sha256"]) == 64
    ref = their_logits(t, cfg, IDS)
    with torch.no_grad():
        got = model(IDS).logits.double()
    scale = ref.abs().max().item()
    assert ref.std() > 0.5  # far from flat logits
    # fp32 model vs the float64 equations: fp32 rounding, relative to the logits' scale
    assert (got - ref).abs().max().item() <= 1e-5 * scale, ((got - ref).abs().max().item(), scale)
    # power: one recency bias (and, for a gated checkpoint, one gate) moved a little moves the reference far more
    moved = {"model.layers.0.mlp_res_bias": t["model.layers.0.mlp_res_bias"] + 0.5}
    gate_key = {"sigmoid_scalar": "model.layers.1.attn_res_gate_logit", "learnable_alpha": "model.layers.1.attn_res_alpha",
                "sigmoid_vector": "model.layers.1.attn_res_gate_proj.bias"}.get(gate)
    if gate_key:
        moved[gate_key] = t[gate_key] + 0.5
    for key, value in moved.items():
        assert (their_logits(dict(t, **{key: value}), cfg, IDS) - ref).abs().max().item() > 1e-3 * scale, key


@pytest.mark.parametrize("layers,num_blocks,sources", [
    (4, 2, [2, 2, 2, 2, 3, 3, 3, 3]),  # P = 2: closed after layers 1 and 3
    (3, 2, [2, 2, 2, 2, 3, 3]),  # P = 2: the last block has one layer and never closes
    (4, 8, [2, 2, 3, 3, 4, 4, 5, 5]),  # P = 1: 8 > L, one layer per block
])
def test_block_boundaries_follow_their_layers_per_block(tmp_path, layers, num_blocks, sources):
    folder, cfg, t = released_checkpoint(tmp_path / "theirs", "block", "bias", layers, num_blocks)
    import_hf(folder, tmp_path / "m.pt", tokenizer="byte")
    model, _, _ = load_model(tmp_path / "m.pt")
    routing = model(IDS, collect_routing=True).routing
    assert [w.shape[-1] for w in routing.values()] == sources
    with torch.no_grad():
        ref, got = their_logits(t, cfg, IDS), model(IDS).logits.double()
    assert (got - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@pytest.mark.parametrize("mode,gate", [("block", "sigmoid_vector"), ("full", "learnable_alpha"), ("block", "bias")])
def test_greedy_generation_with_the_kv_cache_equals_recomputation(tmp_path, mode, gate):
    folder, _, _ = released_checkpoint(tmp_path / "theirs", mode, gate, layers=3, num_blocks=2)
    import_hf(folder, tmp_path / "m.pt", tokenizer="byte")
    model, _, _ = load_model(tmp_path / "m.pt")
    g = torch.Generator().manual_seed(3)
    contexts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (6, 1, 11)]
    cached = generate(model, contexts, 12)
    assert cached == generate(model, contexts, 12, use_cache=False)
    assert all(len(row) == 12 for row in cached) and len({tuple(r) for r in cached}) > 1


# --- refusals: one line, exit 2, nothing written ------------------------------------------------------------
@pytest.mark.parametrize("kw,field", [
    (dict(extra_config={"attnres_gate_type": "tanh"}), "attnres_gate_type 'tanh'"),
    (dict(extra_config={"attnres_mode": "delta"}), "attnres_mode 'delta'"),
    (dict(add={"model.layers.0.attn_res_alpha": torch.tensor(0.3)}), "model.layers.0.attn_res_alpha"),
    (dict(add={"model.layers.1.mlp_res_temperature": torch.tensor(1.0)}), "model.layers.1.mlp_res_temperature"),
    (dict(add={"model.layers.0.attn_null_source": torch.zeros(D)}), "model.layers.0.attn_null_source"),
    (dict(gate="sigmoid_scalar", drop=("model.layers.2.mlp_res_gate_logit",)), "model.layers.2.mlp_res_gate_logit"),
    (dict(drop=("model.layers.1.attn_res_norm.weight",)), "model.layers.1.attn_res_norm.weight is missing"),
    (dict(add={"model.layers.0.attn_res_proj.weight": torch.zeros(2, D)}), "model.layers.0.attn_res_proj.weight"),
    (dict(add={"model.final_res_proj.weight": torch.zeros(1, D)}), "final_res_proj"),
])
def test_unsupported_released_checkpoints_are_one_error_line(tmp_path, capsys, kw, field):
    folder, _, _ = released_checkpoint(tmp_path / "theirs", **kw)
    out = tmp_path / "m.pt"
    assert mhar_main(["import-hf", str(folder), "--out", str(out), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and field in err[0], err
    assert not out.exists()


def _refused_in_one_line(tmp_path: Path, capsys, folder: Path, *needles: str) -> None:
    """``import-hf`` exits 2 with one ``error:`` line holding every needle, no traceback, nothing written."""
    out = tmp_path / "out" / "m.pt"
    assert mhar_main(["import-hf", str(folder), "--out", str(out), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), (needles, lines[0])
    assert not (tmp_path / "out").exists()


DROP = object()  # the field is taken out of config.json


@pytest.mark.parametrize("fields,needle", [
    ({"attnres_num_blocks": 0}, "attnres_num_blocks 0 in config.json is not a whole number >= 1"),  # ZeroDivision
    ({"attnres_num_blocks": 1.5}, "attnres_num_blocks 1.5 in config.json is not a whole number >= 1"),  # read as 1
    ({"attnres_num_blocks": -2}, "attnres_num_blocks -2 in config.json is not a whole number >= 1"),
    ({"attnres_num_blocks": "2"}, 'attnres_num_blocks "2" in config.json is not a whole number'),
    ({"attnres_num_blocks": True}, "attnres_num_blocks true in config.json is not a whole number"),
    ({"attnres_mode": "full", "attnres_num_blocks": 0}, "attnres_num_blocks 0"),  # their full mode divides too
    ({"attnres_recency_bias_init": "abc"}, 'attnres_recency_bias_init "abc" in config.json is not a finite number'),
    ({"attnres_recency_bias_init": float("nan")}, "attnres_recency_bias_init NaN in config.json is not a finite"),
    ({"attnres_recency_bias_init": [3.0]}, "attnres_recency_bias_init [3.0] in config.json is not a finite number"),
    ({"attnres_gate_type": ["bias"]}, 'attnres_gate_type ["bias"] in config.json is not a string'),
    ({"attnres_mode": ["block"]}, 'attnres_mode ["block"] in config.json is not a string'),
    ({"attnres_mode": None}, "attnres_mode null in config.json is not a string"),
    ({"num_hidden_layers": 0}, "num_hidden_layers 0 in config.json is not a whole number >= 1"),
    ({"num_hidden_layers": DROP}, "config.json has no num_hidden_layers (a whole number >= 1)"),
    ({"hidden_size": "64"}, 'hidden_size "64" in config.json is not a whole number >= 1'),
    ({"num_key_value_heads": 3}, "num_key_value_heads 3 in config.json does not divide num_attention_heads 4"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps -1e-06 in config.json is not a finite number > 0"),
    ({"rms_norm_eps": None}, "rms_norm_eps null in config.json is not a finite number > 0"),
    ({"rope_theta": float("inf")}, "rope_theta Infinity in config.json is not a finite number > 0"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "rope_parameters.factor is missing"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "1e4"}}, 'rope_parameters.rope_theta "1e4"'),
    ({"tie_word_embeddings": "yes"}, 'tie_word_embeddings "yes" in config.json is not true or false'),
    ({"layer_types": ["full_attention"]}, "layer_types [\"full_attention\"] in config.json is not a list of "
                                          "num_hidden_layers (3) strings"),
    ({"max_position_embeddings": 0}, "max_position_embeddings 0 in config.json is not a whole number >= 1"),
])
def test_config_field_of_the_wrong_type_or_range_is_one_line_naming_it(tmp_path, capsys, fields, needle):
    """Every field the conversion reads is checked before anything is built: the field as config.json writes it,
    its value and what is allowed; exit 2, no traceback, nothing written."""
    folder, cfg, _ = released_checkpoint(tmp_path / "theirs", layers=3, num_blocks=2)
    cfg.update(fields)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not DROP}))
    _refused_in_one_line(tmp_path, capsys, folder, needle)


@pytest.mark.parametrize("name,value", [("model.layers.1.attn_res_proj.weight", float("nan")),
                                        ("model.embed_tokens.weight", float("inf")),
                                        ("model.layers.0.mlp_res_bias", float("-inf"))])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, capsys, name, value):
    folder, _, t = released_checkpoint(tmp_path / "theirs", layers=3, num_blocks=2)
    bad = t[name].clone()
    bad.view(-1)[0] = value
    save_file({k: v.contiguous() for k, v in dict(t, **{name: bad}).items()}, str(folder / "model.safetensors"))
    kind = "1 NaN, 0 inf" if value != value else "0 NaN, 1 inf"
    _refused_in_one_line(tmp_path, capsys, folder, f"tensor {name} ({kind} of {bad.numel()} values) is not finite",
                         "nothing was written")


def test_config_that_disagrees_with_the_tensors_names_the_tensor_and_both_shapes(tmp_path, capsys):
    folder, _, _ = released_checkpoint(tmp_path / "theirs", "full", "sigmoid_vector", layers=2)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=96)))
    assert mhar_main(["import-hf", str(folder), "--out", str(tmp_path / "m.pt"), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "model.layers.0.mlp.gate_proj.weight" in err[0], err
    assert f"({FF}, {D})" in err[0] and f"(96, {D})" in err[0] and not (tmp_path / "m.pt").exists()


def test_hub_snapshot_records_its_commit_and_every_source_its_content_hash(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "hub" / "models--wdlctc--open-attnres-block" / "snapshots" / commit
    released_checkpoint(snap, "block", "bias", layers=2)
    rep = import_hf(snap, tmp_path / "a.pt", tokenizer="byte")
    assert rep["hub_commit"] == commit
    plain, _, _ = released_checkpoint(tmp_path / "plain", "block", "bias", layers=2)
    rep2 = import_hf(plain, tmp_path / "b.pt", tokenizer="byte")
    assert rep2["hub_commit"] is None and rep2["content_sha256"] == rep["content_sha256"]  # the same files
    cfg = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps(dict(cfg, attnres_recency_bias_init=3.0)))
    assert import_hf(plain, tmp_path / "c.pt", tokenizer="byte")["content_sha256"] != rep2["content_sha256"]
    with pytest.raises(ImportHFError, match="already exists"):
        import_hf(plain, tmp_path / "c.pt", tokenizer="byte")


def test_export_of_the_imported_model_loads_without_mhar_with_their_logits(tmp_path):
    """import-hf, then export-hf: stock transformers (trust_remote_code on the shipped model files) in a process
    where ``mhar`` cannot be imported computes the logits of their equations."""
    from test_hf_export import run_without_mhar

    from mhar.hf import export_hf

    refs, dirs = {}, {}
    for mode, gate in (("block", "sigmoid_vector"), ("full", "learnable_alpha")):
        folder, cfg, t = released_checkpoint(tmp_path / f"theirs_{mode}", mode, gate, layers=3, num_blocks=2)
        import_hf(folder, tmp_path / f"{mode}.pt", tokenizer="byte")
        export_hf(tmp_path / f"{mode}.pt", tmp_path / f"hf_{mode}")
        refs[mode], dirs[mode] = their_logits(t, cfg, IDS), str(tmp_path / f"hf_{mode}")
    torch.save(IDS, tmp_path / "ids.pt")
    code = f"""
    import sys, torch
    from transformers import AutoModelForCausalLM
    ids, out = torch.load("ids.pt"), {{}}
    for mode, d in {dirs!r}.items():
        model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True, dtype=torch.float32).eval()
        with torch.no_grad():
            out[mode] = model(input_ids=ids).logits
    assert not any(m == "mhar" or m.startswith("mhar.") for m in sys.modules)
    torch.save(out, "logits.pt")
    """
    proc = run_without_mhar(code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "logits.pt", weights_only=True)
    for mode, ref in refs.items():
        scale = ref.abs().max().item()
        assert (got[mode].double() - ref).abs().max().item() <= 1e-5 * scale, mode


@pytest.mark.parametrize("layers,num_blocks,note", [(12, 4, None), (28, 8, "gives 7 blocks of up to 4 layers")])
def test_the_published_block_shapes_convert_with_their_block_count(layers, num_blocks, note):
    """wdlctc/open-attnres-block (L 12, 4 blocks) and open-attnres-0.6b-block (L 28, "8 blocks": ceil(28/8) = 4
    layers per block, so 7 closed blocks); config only, tensors on the meta device."""
    from mhar.hf.authors import authors_model_config

    d, heads, kv = (512, 8, 4) if layers == 12 else (1024, 16, 8)
    hf = {"model_type": "qwen3_attnres", "vocab_size": 151936, "hidden_size": d, "intermediate_size": 3 * d,
          "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d // heads,
          "attnres_mode": "block", "attnres_num_blocks": num_blocks, "attnres_gate_type": "bias",
          "attnres_recency_bias_init": 0.0, "tie_word_embeddings": True}
    tensors = {"model.layers.0.self_attn.q_proj.weight": torch.empty(d, d, device="meta"),
               "model.layers.0.self_attn.q_norm.weight": torch.empty(d // heads, device="meta"),
               "model.layers.0.attn_res_bias": torch.empty((), device="meta")}
    cfg, notes = authors_model_config(hf, tensors)
    assert (cfg.residual.variant, cfg.residual.blocks, cfg.residual.gate_type) == ("open_attnres", num_blocks, "bias")
    assert cfg.tie_embeddings and cfg.qk_norm and cfg.residual.recency_bias_init == 0.0
    assert (note is None and not notes) or any(note in n for n in notes), notes
