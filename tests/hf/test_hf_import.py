"""``import-hf`` of stock transformers checkpoints (the CPT arm's base model family) and bad inputs.

References are transformers' own ``Qwen3ForCausalLM`` / ``LlamaForCausalLM`` built and saved here."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from mhar.__main__ import main as mhar_main  # noqa: E402
from mhar.runs.checkpoint import load_model  # noqa: E402
from mhar.hf import ImportHFError, import_hf  # noqa: E402

torch.set_num_threads(1)
IDS = torch.randint(0, 120, (2, 30), generator=torch.Generator().manual_seed(1))


def qwen3(**kw):
    cfg = dict(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, head_dim=24, max_position_embeddings=128, rms_norm_eps=1e-6,
               tie_word_embeddings=True, rope_theta=1e6)
    cfg.update(kw)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**cfg)).eval()


def llama(**kw):
    cfg = dict(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
               rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    cfg.update(kw)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


@pytest.mark.parametrize("make,qk_norm", [(qwen3, True), (llama, False)])
def test_stock_checkpoint_imports_with_transformers_logits(tmp_path, make, qk_norm):
    hf = make()
    hf.save_pretrained(tmp_path / "hf")
    rep = import_hf(tmp_path / "hf", tmp_path / "out", tokenizer="byte")
    assert rep["variant"] == "baseline" and rep["check"]["max_abs_diff"] <= 1e-5
    model, _, blob = load_model(tmp_path / "out" / "model.pt")
    assert model.cfg.qk_norm is qk_norm and model.cfg.tie_embeddings == hf.config.tie_word_embeddings
    with torch.no_grad():
        ref, got = hf(input_ids=IDS).logits, model(IDS).logits
    assert (got - ref).abs().max().item() <= 1e-5
    assert blob["extra"]["import_hf"]["model_type"] == hf.config.model_type


def test_sharded_safetensors_are_read_through_the_index(tmp_path):
    hf = qwen3(tie_word_embeddings=False)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) > 2
    import_hf(tmp_path / "hf", tmp_path / "m.pt", tokenizer="byte")
    model, _, _ = load_model(tmp_path / "m.pt")
    with torch.no_grad():
        assert (model(IDS).logits - hf(input_ids=IDS).logits).abs().max().item() <= 1e-5


def test_tokenizer_spec_comes_from_the_directory(tmp_path):
    qwen3().save_pretrained(tmp_path / "hf")
    with pytest.raises(ImportHFError, match="--tokenizer"):
        import_hf(tmp_path / "hf", tmp_path / "a.pt")
    from mhar.hf.tokenizer_files import write_tokenizer

    write_tokenizer("byte", tmp_path / "hf", 128)  # a tokenizer.json in the directory: the directory is the spec
    rep = import_hf(tmp_path / "hf", tmp_path / "b.pt", check=False)
    assert rep["tokenizer"] == str((tmp_path / "hf").resolve()) and rep["check"] is None


@pytest.mark.parametrize("edit,match", [
    (lambda c: c.update(model_type="gpt2"), "model_type 'gpt2' is not supported"),
    (lambda c: c.update(attention_bias=True), "attention_bias"),
    (lambda c: c.update(use_sliding_window=True, sliding_window=16, max_window_layers=0), "use_sliding_window"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
])
def test_unsupported_configs_are_refused_naming_the_field(tmp_path, edit, match):
    qwen3().save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    edit(cfg)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ImportHFError, match=match):
        import_hf(tmp_path / "hf", tmp_path / "m.pt", tokenizer="byte")
    assert not (tmp_path / "m.pt").exists()


def test_damaged_or_missing_inputs_are_one_error_line(tmp_path, capsys):
    qwen3().save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 1000])
    cases = [[str(tmp_path / "hf")], [str(tmp_path / "nowhere")], [str(tmp_path)]]
    msgs = ["unreadable or corrupt", "no such model directory", "no config.json"]
    capsys.readouterr()  # transformers' own progress output while saving
    for args, msg in zip(cases, msgs):
        assert mhar_main(["import-hf", *args, "--out", str(tmp_path / "m.pt"), "--tokenizer", "byte"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and msg in err[0], err
    (tmp_path / "m.pt").write_text("x")
    qwen3().save_pretrained(tmp_path / "ok")
    capsys.readouterr()
    assert mhar_main(["import-hf", str(tmp_path / "ok"), "--out", str(tmp_path / "m.pt"), "--tokenizer", "byte"]) == 2
    assert "already exists" in capsys.readouterr().err and (tmp_path / "m.pt").read_text() == "x"


def test_config_that_disagrees_with_the_weights_is_one_error_line(tmp_path, capsys):
    """config.json says intermediate_size 128, the tensors have 192: the tensor and both shapes, nothing written."""
    qwen3(intermediate_size=192).save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=128)))
    capsys.readouterr()
    assert mhar_main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "m.pt"), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "model.layers.0.mlp.gate_proj.weight" in err[0] and "(192, 64)" in err[0] and "(128, 64)" in err[0]
    assert not (tmp_path / "m.pt").exists()


def _poke(folder, name: str, value: float) -> int:
    """Put ``value`` into the first element of tensor ``name`` of ``folder``'s model.safetensors; its numel."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = value
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return tensors[name].numel()


@pytest.mark.parametrize("source,name,value,check", [
    ("qwen3", "model.layers.1.self_attn.q_proj.weight", float("nan"), True),  # the logits check said only "nan"
    ("llama", "model.embed_tokens.weight", float("inf"), False),
    ("mhar", "model.residual.queries", float("nan"), False),
])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, capsys, source, name, value, check):
    """Stock Qwen3 / Llama checkpoints and our own exports: one error line naming the tensor, exit 2, nothing
    written (checked before the conversion; with or without the logits check)."""
    if source == "mhar":
        from mhar.hf import export_hf
        from mhar.model.config import model_config
        from mhar.model.transformer import Transformer
        from mhar.runs.checkpoint import save_model

        torch.manual_seed(0)
        cfg = model_config("debug", max_seq_len=64, residual={"variant": "mhar", "heads": 2, "routing_impl": "eager"})
        export_hf(save_model(tmp_path / "run" / "model.pt", Transformer(cfg), "byte"), tmp_path / "hf")
    else:
        (qwen3 if source == "qwen3" else llama)().save_pretrained(tmp_path / "hf")
    numel = _poke(tmp_path / "hf", name, value)
    capsys.readouterr()
    args = ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out" / "m.pt"), "--tokenizer", "byte"]
    assert mhar_main(args + ([] if check else ["--no-check"])) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    kind = "1 NaN, 0 inf" if value != value else "0 NaN, 1 inf"
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert f"tensor {name} ({kind} of {numel} values) is not finite" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
