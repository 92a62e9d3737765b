"""Continued pretraining: exact Llama -> mhar_delta conversion, refusal, paired arms, CPT table."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from analysis.tables.build import write_cpt_table  # noqa: E402
from mhar import cpt
from mhar.training import optim  # noqa: E402
from mhar.runs.checkpoint import load_model  # noqa: E402
from mhar.model.config import model_config  # noqa: E402
from mhar.model.transformer import Transformer  # noqa: E402

torch.set_num_threads(1)

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def tiny_llama(tied=False, rope=LLAMA3_ROPE, head_dim=None, seed=0, **over) -> LlamaForCausalLM:
    """A random Llama-3-style model (norm weights randomised too, so a swapped norm is caught)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=128, rms_norm_eps=1e-5,
              rope_parameters=dict(rope), tie_word_embeddings=tied)
    kw.update(over)
    hf = LlamaForCausalLM(LlamaConfig(**kw)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.2)
    return hf


# (tied embeddings, RoPE, head_dim): untied Llama-3.1 style, tied with default RoPE, head_dim != d/heads
CASES = [(False, LLAMA3_ROPE, None), (True, {"rope_type": "default", "rope_theta": 10000.0}, None),
         (False, LLAMA3_ROPE, 32)]


@pytest.mark.parametrize("tied,rope,head_dim", CASES)
def test_conversion_is_exact(tied, rope, head_dim):
    hf = tiny_llama(tied, rope, head_dim)
    model, report = cpt.convert_hf_llama(hf, heads=4, delta_block_layers=2, check_seq_len=100)
    assert report.exact and report.max_abs_diff == 0.0
    assert model.cfg.residual.variant == "mhar_delta" and model.cfg.tie_embeddings == tied
    assert report.n_sources_final == 1 + 4 // 2
    # independent re-check on other tokens (long enough to reach the llama3-scaled frequencies)
    ids = torch.randint(0, 101, (3, 120), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(hf(input_ids=ids).logits, model(ids).logits)
    # added parameters: null (D) + per site (2L+1) an alpha, a query (D) and a key norm (D)
    D, S = 64, 2 * 4 + 1
    assert report.params_added == D + S * (1 + 2 * D)


def test_baseline_arm_conversion_is_exact_and_identical_to_delta():
    hf = tiny_llama()
    plain, rep = cpt.convert_hf_llama(hf, variant="baseline")
    delta, _ = cpt.convert_hf_llama(hf, heads=8, delta_block_layers=4)  # paper setting: 1 block of 4 layers
    ids = cpt.check_tokens(101, 2, 50, seed=3)
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, delta(ids).logits)
    assert rep.params_added == 0


def test_corrupted_conversion_is_refused(monkeypatch):
    hf = tiny_llama()
    real = cpt.convert.map_llama_state_dict

    def corrupt(*args, **kw):
        sd = real(*args, **kw)
        w = sd["layers.2.mlp.up_proj.weight"] = sd["layers.2.mlp.up_proj.weight"].clone()  # not the source's
        w[3, 5] += 1e-3  # one wrong number
        return sd

    monkeypatch.setattr(cpt.convert, "map_llama_state_dict", corrupt)
    with pytest.raises(cpt.CPTConversionError, match=r"not exact: max \|logits - original\| = .* refusing"):
        cpt.convert_hf_llama(hf, heads=4, delta_block_layers=2)


def test_swapped_norms_are_refused(monkeypatch):
    # a plausible mapping bug: attn/mlp norms swapped
    hf = tiny_llama()
    real = cpt.convert.map_llama_state_dict

    def swapped(*args, **kw):
        sd = real(*args, **kw)
        sd["layers.0.attn_norm.weight"], sd["layers.0.mlp_norm.weight"] = (
            sd["layers.0.mlp_norm.weight"], sd["layers.0.attn_norm.weight"])
        return sd

    monkeypatch.setattr(cpt.convert, "map_llama_state_dict", swapped)
    with pytest.raises(cpt.CPTConversionError, match="refusing"):
        cpt.convert_hf_llama(hf)


def test_unsupported_checkpoints_are_refused():
    with pytest.raises(cpt.CPTConversionError, match="attention_bias"):
        cpt.convert_hf_llama(tiny_llama(attention_bias=True))
    with pytest.raises(cpt.CPTConversionError, match="RoPE type 'linear'"):
        cpt.convert_hf_llama(tiny_llama(rope={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}))
    with pytest.raises(cpt.CPTConversionError, match="delta_block_layers"):
        cpt.convert_hf_llama(tiny_llama(), delta_block_layers=3)  # 4 layers are not blocks of 3
    with pytest.raises(cpt.CPTConversionError, match="could not load"):
        cpt.convert_hf_llama("/nonexistent/llama-dir")


def test_export_roundtrip_and_saved_checkpoint(tmp_path):
    # a Llama-shaped baseline model -> HF directory -> converted from that directory, exactly
    torch.manual_seed(1)
    ours = Transformer(model_config(vocab_size=101, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                                    max_seq_len=64, qk_norm=False, tie_embeddings=False, norm_eps=1e-5,
                                    rope_theta=5e5, rope_scaling={k: v for k, v in LLAMA3_ROPE.items()
                                                                  if k not in ("rope_type", "rope_theta")}))
    hf_dir = cpt.export_hf_llama(ours, tmp_path / "hf")
    model, report = cpt.convert_hf_llama(str(hf_dir), heads=4, delta_block_layers=1)
    ids = cpt.check_tokens(101, 2, 40, seed=9)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, model(ids).logits)
    path = cpt.save_converted(model, report, tmp_path / "conv", tokenizer="byte")
    loaded, _, blob = load_model(path)
    assert blob["extra"]["conversion"]["max_abs_diff"] == 0.0
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    saved = json.loads((tmp_path / "conv" / "conversion.json").read_text())
    assert saved["report"]["exact"] is True and saved["provenance"]["packages"]["torch"]


# --- training arms -------------------------------------------------------------------------------
def _arm_configs(tmp_path, steps=4, **train_over):
    """Convert one tiny Llama to both forms and build the two arms' run configs (synthetic data)."""
    from mhar.cpt import CPTConfig, arm_run_config, cpt_config_from_dict

    hf = tiny_llama(num_hidden_layers=2)
    cfg = cpt_config_from_dict({
        "base": {"hf": "unused-in-this-test"}, "heads": 4, "delta_block_layers": 1,
        "train": {"data": {"corpus": "synthetic:20000", "seq_len": 16, "val_tokens": 64,
                           "cache_dir": str(tmp_path / "cache")},
                  "train": {"steps": steps, "global_batch": 4, "micro_batch": 2, "lr": 1e-3, "warmup_steps": 1,
                            "min_lr_ratio": 0.01, "weight_decay": 0.05, "decay_filter": "matrices",
                            "z_loss": 1e-4, "eval_every": steps, "checkpoint_every": steps, "device": "cpu",
                            **train_over}}})
    out = {}
    for arm in CPTConfig.ARMS:
        model, rep = cpt.convert_hf_llama(hf, cfg.heads, cfg.delta_block_layers, variant=CPTConfig.VARIANT[arm])
        init = cpt.save_converted(model, rep, tmp_path / "init" / arm, "byte")
        out[arm] = arm_run_config(cfg, arm, rep.model_config, str(init))
    return out


def _train(run_cfg: dict, out, **kw):
    from mhar.runs.config import run_config_from_dict
    from mhar.training.train import train

    return train(run_config_from_dict(run_cfg), out, **kw)


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_arms_see_identical_batches_and_start_identical(tmp_path):
    from mhar.data.batches import load_data
    from mhar.runs.config import run_config_from_dict

    cfgs = _arm_configs(tmp_path)
    assert cfgs["plain"]["data"] == cfgs["mhar"]["data"]
    assert {k: v for k, v in cfgs["plain"]["train"].items() if k != "init_from"} == \
           {k: v for k, v in cfgs["mhar"]["train"].items() if k != "init_from"}
    runs = {arm: tmp_path / "runs" / arm for arm in cfgs}
    for arm, rc in cfgs.items():
        _train(rc, runs[arm])
    report = cpt.compare_batch_logs(runs["plain"], runs["mhar"])
    assert report["identical"] and report["steps"] == 4
    plain, mhar = _rows(runs["plain"]), _rows(runs["mhar"])
    # step 1 runs the same function on the same batch (alpha = 0): the losses are bitwise equal
    assert plain[0]["loss"] == mhar[0]["loss"]
    # the logged hash is the sha256 of the tokens the step used, recomputed here from the data order
    rc = run_config_from_dict(cfgs["plain"])
    data = load_data(rc.data, rc.model.vocab_size, rc.train.global_batch, rc.data_seed, log=lambda m: None)
    h = hashlib.sha256()
    for x, y in data.micro_batches(2, micro=2):  # step index 2 = logged step 3
        for t in (x, y):
            h.update(str(tuple(t.shape)).encode())
            h.update(np.ascontiguousarray(t.numpy(), dtype=np.int64).tobytes())
    assert plain[2]["batch_sha256"] == h.hexdigest()
    # an arm with another data order is caught
    other = json.loads(json.dumps(cfgs["mhar"]))
    other["data"]["seed"] = 123
    _train(other, tmp_path / "runs" / "shuffled")
    with pytest.raises(ValueError, match="different batches at .* first at step 1"):
        cpt.compare_batch_logs(runs["plain"], tmp_path / "runs" / "shuffled")


def test_ema_run_resumes_exactly_and_exports_ema(tmp_path):
    from mhar.runs.checkpoint import read_checkpoint

    rc = _arm_configs(tmp_path, steps=4, ema_decay=0.5)["mhar"]
    full, part = tmp_path / "full", tmp_path / "part"
    _train(rc, full)
    assert _train(rc, part, stop_after=2) is None
    _train(rc, part)  # resumes from step 2, EMA state included
    a, b = read_checkpoint(full / "model.pt"), read_checkpoint(part / "model.pt")
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    # model.pt holds the EMA, model_raw.pt the last iterate: they differ, and the gates moved
    raw = read_checkpoint(full / "model_raw.pt")["state_dict"]
    assert not torch.equal(raw["layers.0.mlp.up_proj.weight"], a["state_dict"]["layers.0.mlp.up_proj.weight"])
    assert raw["residual.alphas"].abs().max() > 0
    assert a["extra"]["weights"] == "ema0.5"


def test_init_from_with_another_shape_is_refused(tmp_path):
    from mhar.model.config import ConfigError

    rc = _arm_configs(tmp_path)["mhar"]
    rc["model"]["d_ff"] = 64  # the converted checkpoint has 96
    with pytest.raises(ConfigError, match=r"train.init_from=.*d_ff: checkpoint 96 vs run 64"):
        _train(rc, tmp_path / "bad")


# --- CPT optimizer / loss pieces ---------------------------------------------------------------------
def test_weight_decay_excludes_embeddings_norms_and_routing():
    for tied in (False, True):
        model, _ = cpt.convert_hf_llama(tiny_llama(tied=tied, num_hidden_layers=2), heads=4, delta_block_layers=1)
        groups = optim.param_groups(model, 0.05, "matrices")
        names = {id(p): n for n, p in model.named_parameters()}
        decayed = {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}
        want = {n for n, _ in model.named_parameters() if n.endswith("_proj.weight")}
        if not tied:
            want.add("lm_head.weight")
        assert decayed == want
        n_all = sum(len(g["params"]) for g in groups)
        assert n_all == len(list(model.parameters()))  # every parameter trained exactly once
    (only,) = optim.param_groups(model, 0.1, "all")
    assert only["weight_decay"] == 0.1 and len(only["params"]) == len(list(model.parameters()))


def test_z_loss_matches_definition():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g) * 3
    labels = torch.randint(0, 11, (2, 5), generator=g)
    labels[0, :2] = -100
    keep = labels != -100
    want = np.mean([np.log(np.exp(row.double().numpy()).sum()) ** 2 for row in logits[keep]])
    assert abs(optim.z_loss(logits, labels).item() - want) < 1e-4


def test_ema_update_matches_closed_form():
    lin = torch.nn.Linear(3, 2, bias=False)
    w0 = lin.weight.detach().clone()
    ema = optim.EMA(lin, 0.9)
    steps = [torch.randn(2, 3, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    want = w0.clone()
    for s in steps:
        with torch.no_grad():
            lin.weight.copy_(s)
        ema.update()
        want = 0.9 * want + 0.1 * s
    torch.testing.assert_close(ema.shadow[0], want)
    with ema.applied():
        assert torch.equal(lin.weight, ema.shadow[0])
    assert torch.equal(lin.weight, steps[-1])


# --- config block and table -----------------------------------------------------------------------------
def test_cpt_block_errors_name_the_key():
    from mhar.model.config import ConfigError
    from mhar.cpt import base_run_config, cpt_config_from_dict

    with pytest.raises(ConfigError, match="exactly one of cpt.base.hf"):
        cpt_config_from_dict({"base": {"hf": "x", "pretrain": {}}})
    with pytest.raises(ConfigError, match="cpt.train.train.init_from"):
        cpt_config_from_dict({"base": {"hf": "x"}, "train": {"train": {"init_from": "a.pt"}}})
    with pytest.raises(ConfigError, match="cpt.train.data.tokenizer"):
        cpt_config_from_dict({"base": {"hf": "x"}, "train": {"data": {"tokenizer": "hf:gpt2"}}})
    with pytest.raises(ConfigError, match="cpt.train.model"):
        cpt_config_from_dict({"base": {"hf": "x"}, "train": {"model": {}}})
    with pytest.raises(ConfigError, match="unknown config key"):
        cpt_config_from_dict({"base": {"hf": "x"}, "head": 8})
    with pytest.raises(ConfigError, match="qk_norm must be False"):
        base_run_config(cpt_config_from_dict({"base": {"pretrain": {"model": {"qk_norm": True}}}}))


def _write_eval(root, task, scores):
    d = root / task
    d.mkdir(parents=True)
    lines = [json.dumps({"doc_id": i, "prompt_hash": f"h{i}", "target": "t", "metrics": {"acc": float(s)}})
             for i, s in enumerate(scores)]
    (d / "samples.jsonl").write_text("\n".join(lines) + "\n")
    (d / "results.json").write_text(json.dumps({"task": task, "n": len(scores), "metrics": {"acc": np.mean(scores)}}))


def test_cpt_table_has_three_gains_and_mcnemar(tmp_path):
    from scipy.stats import binomtest

    rng = np.random.default_rng(0)
    n = 120
    base = (rng.random(n) < 0.25).astype(int)
    plain = np.where(rng.random(n) < 0.5, 1, base)  # CPT helps a lot
    mhar = plain.copy()
    flip = rng.choice(n, 30, replace=False)
    mhar[flip[:22]] = 1  # MHAR right where plain may be wrong ...
    mhar[flip[22:]] = 0  # ... and wrong on a few others
    for name, s in (("base", base), ("plain", plain), ("mhar", mhar)):
        _write_eval(tmp_path / name, "gpqa_main_zeroshot", s)
    paths = write_cpt_table(tmp_path / "base", tmp_path / "plain", tmp_path / "mhar", tmp_path / "rep" / "cpt_table",
                                "tiny", {"identical": True, "steps": 4}, n_resamples=199)
    assert sorted(p.suffix for p in paths) == [".csv", ".md", ".tex"]
    import pandas as pd

    row = pd.read_csv(tmp_path / "rep" / "cpt_table.csv").iloc[0]
    assert row["cpt_gain"] == pytest.approx(plain.mean() - base.mean())
    assert row["total_gain"] == pytest.approx(mhar.mean() - base.mean())
    assert row["delta"] == pytest.approx(mhar.mean() - plain.mean())
    b = int(((mhar == 1) & (plain == 0)).sum())
    c = int(((mhar == 0) & (plain == 1)).sum())
    assert (row["discordant_mhar_better"], row["discordant_plain_better"]) == (b, c)
    assert row["p"] == pytest.approx(binomtest(b, b + c, 0.5).pvalue)
    assert "MHAR gain" in (tmp_path / "rep" / "cpt_table.md").read_text()
    # the manifest names the arms relative to itself: the same bytes wherever the tree lies
    manifest = (tmp_path / "rep" / "cpt_table.manifest.yaml").read_text()
    assert str(tmp_path) not in manifest and "../base" in manifest
