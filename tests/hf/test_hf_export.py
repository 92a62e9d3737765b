"""``python -m mhar export-hf`` / ``import-hf`` for every residual variant, against transformers itself.

Each export is loaded by ``AutoModelForCausalLM.from_pretrained`` in a separate process in which ``mhar``
cannot be imported (a ``sys.meta_path`` blocker): the routed variants through their shipped
``modeling_mhar.py`` (``trust_remote_code=True``), the baseline as transformers' own ``Qwen3ForCausalLM`` /
``LlamaForCausalLM`` with no remote code. Its fp32 logits must equal the harness model's within 1e-5, its
greedy ``generate()`` (KV cache, left-padded batch and a single prompt) must equal
``mhar.model.inference.generate``, ``AutoTokenizer`` must encode as the byte tokenizer; importing the
export back must give identical weights.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Optional
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from mhar import __main__ as cli  # noqa: E402
from mhar.atomic import file_sha256  # noqa: E402
from mhar.runs.checkpoint import read_checkpoint, save_model  # noqa: E402
from mhar.model.config import model_config  # noqa: E402
from mhar.hf import ExportError, export_hf, import_hf, ship  # noqa: E402
from mhar.model.residuals import variant_names  # noqa: E402
from mhar.runs.checkpoint import load_model  # noqa: E402
from mhar.model.inference import generate  # noqa: E402
from mhar.model.transformer import Transformer  # noqa: E402

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
VARIANTS = {  # label -> model_config overrides (debug preset: d 64, 2 layers, 4 heads / 2 KV heads, byte vocab)
    "baseline": dict(residual={"variant": "baseline"}),
    "baseline_llama": dict(residual={"variant": "baseline"}, qk_norm=False, tie_embeddings=False, norm_eps=1e-5,
                           rope_theta=5e5, rope_scaling=LLAMA3),
    "hyper": dict(residual={"variant": "hyper", "hyper_n": 4}),
    "attnres": dict(residual={"variant": "attnres"}),
    "block_attnres": dict(residual={"variant": "block_attnres", "blocks": 3}),
    "mhar": dict(residual={"variant": "mhar", "heads": 4}, tie_embeddings=False),
    "mhar_hw": dict(residual={"variant": "mhar_hw"}),
    "mhar_delta": dict(residual={"variant": "mhar_delta", "heads": 4, "delta_block_layers": 1}),
}
# every other built-in variant the registry knows, with its defaults (a new variant is exported and checked too)
VARIANTS.update({name: dict(residual={"variant": name}) for name in variant_names()
                 if ship.variant_module(name) is None and name not in {v["residual"]["variant"] for v in VARIANTS.values()}})
TOY = "toy_gated"  # tests/toy_variant.py, trained through python -m mhar.train
PROMPTS = ["The cat sat", "Hello, w", "a"]
NEW_TOKENS = 12
IDS = torch.randint(0, 257, (2, 20), generator=torch.Generator().manual_seed(5))


def trained_like(overrides: dict, seed: int) -> Transformer:
    """A debug model whose residual parameters are far from their init (routing, gates and HC not trivial)
    and whose logits are sharp enough that greedy decoding is no tie-break and not one repeated token."""
    torch.manual_seed(seed)
    model = Transformer(model_config("debug", **overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith(("residual.", "embed.")):
                p.mul_(5)
        model.final_norm.weight.mul_(30)
        for name, p in model.residual.named_parameters():
            # the delta variant's null source is a value: keep it at the embeddings' scale
            p.add_(torch.randn_like(p) * (0.02 if name == "null" else 0.05 if p.dim() == 0 else 0.5))
    return model


def fake_run(folder: Path, label: str, model: Transformer, seed: int) -> Path:
    """A run directory as mhar.train leaves it: model.pt (+ run block), summary.json, config.yaml."""
    folder.mkdir(parents=True)
    run = {"label": label, "residual": {"variant": model.cfg.residual.variant}, "size": "debug", "seed": seed,
           "data_seed": seed, "config_hash": "abc123", "identity_hash": "def456"}
    save_model(folder / "model.pt", model, "byte", extra={"run": run, "step": 7})
    (folder / "summary.json").write_text(json.dumps({"run": run, "variant": label, "steps": 7, "tokens": 7168,
                                                     "tail_mean_val_loss": 2.345678, "final_val_loss": 2.3}))
    run_cfg = {"data": {"corpus": "tinyshakespeare", "tokenizer": "byte", "seq_len": 128},
               "train": {"seed": seed, "lr": 2e-3}}
    (folder / "config.yaml").write_text(yaml.safe_dump(run_cfg))
    return folder


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_exports")
    out = {}
    for i, (label, over) in enumerate(VARIANTS.items()):
        model = trained_like(over, seed=i)
        run = fake_run(root / "runs" / label, label, model, seed=i)
        report = export_hf(run, root / "hf" / label)
        out[label] = {"model": model, "run": run, "hf": root / "hf" / label, "report": report}
    run = train_toy(root / "toy")
    out[TOY] = {"model": load_model(run / "model.pt")[0].eval(), "run": run, "hf": root / "hf" / TOY,
                "report": export_hf(run, root / "hf" / TOY)}
    return root, out


def train_toy(root: Path, residual: str = f"{{variant: {TOY}, module: tests.toy_variant}}",
              corpus: Optional[Path] = None) -> Path:
    """A few steps of ``python -m mhar.train`` on tests/toy_variant.py's variant (a module outside mhar)."""
    root.mkdir()
    cfg, run = root / "toy.yaml", root / "run"
    if corpus is None:
        corpus = root / "corpus.txt"
        corpus.write_text("".join(f"line {i} of a small corpus for the toy variant\n" for i in range(400)))
    cfg.write_text(f"model:\n  preset: debug\n  residual: {residual}\n")
    cmd = [sys.executable, "-m", "mhar.train", str(cfg), f"data.corpus={corpus}", "data.seq_len=32",
           f"data.cache_dir={root / 'cache'}", "data.val_tokens=256", "train.steps=4", "train.global_batch=4",
           "train.micro_batch=2", "train.warmup_steps=1", "train.eval_every=2", "train.tail_k=1",
           "train.lr=1e-2", "train.threads=1", "train.device=cpu", "--out", str(run)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return run


BLOCKER = """
import sys
class _NoMhar:
    def find_spec(self, name, path=None, target=None):
        if name == "mhar" or name.startswith("mhar."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, _NoMhar())
sys.path = [p for p in sys.path if p not in ("", ".", %(root)r)]
"""


def run_without_mhar(code: str, tmp: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where ``import mhar`` fails; cwd and module cache in ``tmp``."""
    script = tmp / "child.py"
    script.write_text(BLOCKER % {"root": str(ROOT)} + textwrap.dedent(code))
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp / "hf_modules"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": "", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def loaded(exports, tmp_path_factory):
    """What transformers computes from each export in a process without mhar."""
    root, ex = exports
    tmp = tmp_path_factory.mktemp("child")
    dirs = {label: str(e["hf"]) for label, e in ex.items()}
    torch.save(IDS, tmp / "ids.pt")
    code = f"""
    import json, sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(1)
    dirs, prompts = {dirs!r}, {PROMPTS!r}
    ids = torch.load("ids.pt")
    res, tensors = {{}}, {{}}
    for label, d in dirs.items():
        remote = not label.startswith("baseline")
        model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=remote, dtype=torch.float32).eval()
        with torch.no_grad():
            tensors[label] = model(input_ids=ids).logits
        if label == {TOY!r}:
            res[label] = {{"class": type(model).__name__, "module": type(model).__module__}}
            continue
        tok = AutoTokenizer.from_pretrained(d, trust_remote_code=remote)
        with torch.no_grad():
            out = model(input_ids=ids[:, :5], use_cache=True)
            cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        tok.padding_side = "left"
        batch = tok(prompts, return_tensors="pt", padding=True)
        gen = model.generate(**batch, max_new_tokens={NEW_TOKENS}, do_sample=False)
        single = model.generate(**tok(prompts[0], return_tensors="pt"), max_new_tokens={NEW_TOKENS}, do_sample=False)
        tok.padding_side = "right"
        right = tok(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            padded = model(**right).logits
            alone = [model(**tok(p, return_tensors="pt")).logits[0] for p in prompts]
            holed = right["attention_mask"].clone()
            holed[0, 1] = 0
            try:
                model(input_ids=right["input_ids"], attention_mask=holed)
                refused = ""
            except ValueError as e:
                refused = str(e)
        right_diff = max(((padded[i, :len(a)] - a).abs().max() / a.abs().max()).item() for i, a in enumerate(alone))
        tok.padding_side = "left"
        beams = [model.generate(**batch, max_new_tokens=6, num_beams=3, num_return_sequences=2, use_cache=c)
                 for c in (True, False)]
        res[label] = {{"class": type(model).__name__, "module": type(model).__module__,
                       "beams": [torch.equal(*beams), beams[0].shape[0]], "right": [right_diff, refused],
                       "batch": gen[:, batch["input_ids"].shape[1]:].tolist(),
                       "single": single[0, len(prompts[0].encode()):].tolist(),
                       "encode": [tok(p)["input_ids"] for p in prompts + ["é<|endoftext|>"]],
                       "eos": tok.eos_token_id, "cache": [type(cache).__name__, cache.get_seq_length()]}}
    torch.save(tensors, "logits.pt")
    res["mhar_loaded"] = any(m == "mhar" or m.startswith("mhar.") for m in sys.modules)
    print(json.dumps(res))
    """
    proc = run_without_mhar(code, tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    return res, torch.load(tmp / "logits.pt", weights_only=True)


def until_eos(tokens: list[int], eos: int = 256) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def test_every_variant_loads_without_mhar_with_the_harness_logits(exports, loaded):
    _, ex = exports
    res, logits = loaded
    assert res["mhar_loaded"] is False
    for label, e in ex.items():
        with torch.no_grad():
            ref = e["model"](IDS).logits
        diff = (logits[label] - ref).abs().max().item()
        assert diff <= 1e-5, f"{label}: max |logits diff| {diff:.3g}"
        assert ref.std() > (0.01 if label == TOY else 1.0)  # not a degenerate model (the toy: 4 training steps)
    assert res[TOY]["class"] == "MharForCausalLM" and (ex[TOY]["hf"] / "tests_toy_variant.py").is_file()
    assert ex[TOY]["model"].residual.gates.detach().ne(1.0).any()  # trained: the toy's gates moved


def test_baseline_is_stock_transformers_and_routed_variants_use_the_shipped_file(exports, loaded):
    _, ex = exports
    res, _ = loaded
    assert res["baseline"]["class"] == "Qwen3ForCausalLM"
    assert res["baseline"]["module"].startswith("transformers.models")
    assert res["baseline_llama"]["class"] == "LlamaForCausalLM"
    assert not (ex["baseline"]["hf"] / "modeling_mhar.py").exists()
    for label in VARIANTS:
        if label.startswith("baseline"):
            continue
        assert res[label]["class"] == "MharForCausalLM" and res[label]["module"].startswith("transformers_modules")
        cfg = json.loads((ex[label]["hf"] / "config.json").read_text())
        assert cfg["auto_map"] == {"AutoConfig": "modeling_mhar.MharConfig",
                                   "AutoModelForCausalLM": "modeling_mhar.MharForCausalLM"}
        assert cfg["residual"]["variant"] == ex[label]["model"].cfg.residual.variant


def test_greedy_generation_with_the_kv_cache_equals_the_harness(exports, loaded):
    _, ex = exports
    res, _ = loaded
    for label, e in ex.items():
        if label == TOY:
            continue  # 4 training steps: near-uniform logits, no greedy path worth comparing
        assert res[label]["cache"] == ["DynamicCache", 5], label
        ctx = [list(p.encode()) for p in PROMPTS]
        ours = generate(e["model"], ctx, NEW_TOKENS, stop_ids=[256])
        theirs = [until_eos(row) for row in res[label]["batch"]]
        assert theirs == ours, label
        assert until_eos(res[label]["single"]) == ours[0], label
        assert res[label]["beams"] == [True, 2 * len(PROMPTS)], label  # beam search reorders the cached rows
        diff, refused = res[label]["right"]  # a right-padded batch: each row's logits as alone (relative diff)
        assert diff <= 1e-5, (label, diff)
        assert label.startswith("baseline") or "contiguous" in refused, (label, refused)  # ours refuse a hole
        assert sum(len(set(o)) for o in ours) > 3, label  # generations are not one repeated token


def test_auto_tokenizer_encodes_as_the_byte_tokenizer(loaded):
    res, _ = loaded
    for label in VARIANTS:
        assert res[label]["encode"] == [list(p.encode()) for p in PROMPTS + ["é<|endoftext|>"]], label
        assert res[label]["eos"] == 256


def test_import_of_the_export_gives_identical_weights(exports, tmp_path):
    _, ex = exports
    for label, e in ex.items():
        rep = import_hf(e["hf"], tmp_path / label / "model.pt")
        assert rep["check"]["max_abs_diff"] <= 1e-5
        a, b = read_checkpoint(e["run"] / "model.pt"), read_checkpoint(tmp_path / label / "model.pt")
        assert a["state_dict"].keys() == b["state_dict"].keys(), label
        for k, v in a["state_dict"].items():
            assert torch.equal(v, b["state_dict"][k]), f"{label}: {k}"
        assert b["model_config"] == a["model_config"], label
        assert b["tokenizer"] == "byte" and b["extra"]["run"] == a["extra"]["run"]


def test_model_card_and_report_carry_the_provenance(exports):
    _, ex = exports
    e = ex["mhar"]
    card = (e["hf"] / "README.md").read_text()
    rep = json.loads((e["hf"] / "mhar_export.json").read_text())
    assert rep["weights_sha256"] == file_sha256(e["hf"] / "model.safetensors")
    assert rep["source_sha256"] == file_sha256(e["run"] / "model.pt")
    assert rep["check"]["max_abs_diff"] <= 1e-5 and rep["architecture"] == "MharForCausalLM"
    for text in ("# mhar (mhar, H=4, debug, seed 5)", "trust_remote_code=True", "tinyshakespeare", "2.34568",
                 rep["weights_sha256"], rep["source_sha256"], "abc123", "def456", "| steps | 7 |"):
        assert text in card, text
    assert "trust_remote_code" not in (ex["baseline"]["hf"] / "README.md").read_text()
    gen = json.loads((e["hf"] / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 256 and gen["pad_token_id"] == 256


def test_export_refuses_an_existing_folder_and_a_bad_source(exports, tmp_path, capsys):
    _, ex = exports
    e = ex["attnres"]
    before = sorted(p.name for p in e["hf"].iterdir())
    with pytest.raises(ExportError, match="already exists"):
        export_hf(e["run"], e["hf"])
    assert sorted(p.name for p in e["hf"].iterdir()) == before
    assert cli.main(["export-hf", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not found" in err[0]
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.*"))
    (tmp_path / "empty").mkdir()  # an empty folder (as Snakemake creates for outputs) is fine
    assert cli.main(["export-hf", str(e["run"]), "--out", str(tmp_path / "empty"), "--no-check"]) == 0
    assert (tmp_path / "empty" / "model.safetensors").is_file()


def test_export_check_catches_a_wrong_export(exports, tmp_path, monkeypatch):
    """The reload check compares logits: a mapping that breaks the model is refused, nothing written."""
    from mhar.hf import export as export_mod

    _, ex = exports
    real = export_mod.to_hf_state_dict

    def swapped(state, tied):
        out = real(state, tied)
        a, b = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"
        out[a], out[b] = out[b], out[a]
        return out

    monkeypatch.setattr(export_mod, "to_hf_state_dict", swapped)
    with pytest.raises(ExportError, match="logits differ"):
        export_hf(ex["mhar"]["run"], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_mhar_command_table(capsys, monkeypatch):
    assert cli.COMMANDS["runs"] == "mhar.runs.layout:main"
    assert cli.COMMANDS["export-hf"] == "mhar.hf.cli:export_main"
    assert cli.COMMANDS["import-hf"] == "mhar.hf.cli:import_main"
    assert cli.main(["nope"]) == 2 and "unknown subcommand 'nope'" in capsys.readouterr().err
    monkeypatch.setitem(cli.COMMANDS, "ghost", "mhar.no_such_module:main")
    assert cli.main(["ghost"]) == 2
    assert "needs module mhar.no_such_module" in capsys.readouterr().err
    res = subprocess.run([sys.executable, "-m", "mhar", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "export-hf" in res.stdout and "runs" in res.stdout


@pytest.mark.slow
def test_modeling_file_uses_the_mhar_kernels_when_importable(exports, tmp_path):
    """With mhar importable, routing_impl 'fused' runs mhar.model.routing's fused Triton router (CPU: the Triton
    interpreter), same logits as the shipped PyTorch routing; 'auto' keeps PyTorch on the CPU; without mhar,
    asking for the kernels is a clear ImportError when the model is built."""
    pytest.importorskip("triton")
    _, ex = exports
    d = str(ex["mhar"]["hf"])
    code = f"""
    import json, sys, torch
    sys.path.insert(0, {str(ROOT)!r})
    from transformers import AutoModelForCausalLM
    ids = torch.randint(0, 257, (1, 8), generator=torch.Generator().manual_seed(0))
    out = {{}}
    for impl in ("torch", "auto", "fused"):
        m = AutoModelForCausalLM.from_pretrained({d!r}, trust_remote_code=True, dtype=torch.float32, routing_impl=impl)
        with torch.no_grad():
            out[impl] = (m(input_ids=ids).logits, type(m.model.residual.router).__module__)
    print(json.dumps({{k: v[1] for k, v in out.items()}}))
    print((out["fused"][0] - out["torch"][0]).abs().max().item() / out["torch"][0].abs().max().item())
    """
    (tmp_path / "child.py").write_text(textwrap.dedent(code))
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_MODULES_CACHE": str(tmp_path / "mods"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "child.py")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mods, diff = proc.stdout.strip().splitlines()[-2:]
    mods = json.loads(mods)
    assert mods["fused"] == "mhar.model.routing.fused"
    assert mods["torch"].startswith("transformers_modules") and mods["auto"] == mods["torch"]
    assert float(diff) <= 1e-5  # relative to max |logit| (these logits are sharp: ~100)
    blocked = run_without_mhar(f"""
    import torch
    from transformers import AutoModelForCausalLM
    try:
        AutoModelForCausalLM.from_pretrained({d!r}, trust_remote_code=True, routing_impl="fused")
    except ImportError as e:
        print("ImportError:", e)
    """, tmp_path)
    assert blocked.returncode == 0, blocked.stderr[-3000:]
    assert "routing_impl='fused' needs the mhar package" in blocked.stdout


@pytest.mark.parametrize("stored", ["fused", "fused_v7_sg8"])
def test_a_gpu_trained_routing_impl_survives_the_round_trip_on_the_cpu(tmp_path, stored):
    """A model trained with the fused kernels exports (checked on the CPU with PyTorch routing), records the
    trained implementation under its current name (an older checkpoint's withdrawn fused variant name is fused,
    as load_model runs it) and imports back with it; everything else in the model config round-trips."""
    pytest.importorskip("triton")
    model = trained_like(dict(residual={"variant": "mhar", "heads": 2}), seed=3)
    model.cfg.residual.routing_impl = stored  # as mhar.train saves a GPU run's config (older runs: a withdrawn name)
    run = fake_run(tmp_path / "run", "mhar_h2", model, seed=3)
    rep = export_hf(run, tmp_path / "hf")
    assert rep["check"]["max_abs_diff"] == 0.0
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["routing_impl"] == "auto" and cfg["mhar_routing_impl"] == "fused"
    assert cfg["mhar"]["model_config"]["residual"]["routing_impl"] == "fused"
    import_hf(tmp_path / "hf", tmp_path / "back.pt")
    a, b = read_checkpoint(run / "model.pt"), read_checkpoint(tmp_path / "back.pt")
    assert a["model_config"]["residual"]["routing_impl"] == stored
    expected = json.loads(json.dumps(a["model_config"]))
    expected["residual"]["routing_impl"] = "fused"
    assert b["model_config"] == expected


def test_every_file_of_an_export_has_the_same_mode(exports):
    """model.safetensors is readable as the other files are (safetensors alone writes it 0600)."""
    _, ex = exports
    for label in ("baseline", "mhar"):
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in ex[label]["hf"].iterdir()}
        assert len(set(modes.values())) == 1, f"{label}: {modes}"


def test_the_shipped_files_import_only_each_other_and_installed_packages(exports):
    """An export ships the model package's own modules, flat: every relative import names a shipped file,
    transformers copies every shipped file (its relative-import closure of modeling_mhar.py), the file it
    checks imports nothing missing, and an absolute mhar import remains only for the Triton kernels (not shipped;
    reached where mhar is installed). The harness's model modules are shipped verbatim but for those imports."""
    import ast

    from transformers.dynamic_module_utils import get_imports, get_relative_import_files

    _, ex = exports
    kernels = ship.plan().optional
    assert kernels and all(k.startswith("mhar.model.routing.") for k in kernels)
    for label, e in ex.items():
        if label.startswith("baseline"):
            assert not list(e["hf"].glob("*.py")), label
            continue
        folder, shipped = e["hf"], set(e["report"]["shipped"])
        assert shipped == {p.name for p in folder.glob("*.py")}, label
        assert {Path(f).name for f in get_relative_import_files(str(folder / "modeling_mhar.py"))} | \
            {"modeling_mhar.py"} == shipped, label
        assert set(get_imports(str(folder / "modeling_mhar.py"))) <= {"torch", "transformers", "importlib", "typing",
                                                                       "__future__"}, label
        for name in shipped:
            for node in ast.walk(ast.parse((folder / name).read_text())):
                if isinstance(node, ast.ImportFrom) and node.level:
                    assert node.level == 1 and f"{node.module}.py" in shipped, f"{label}/{name}: .{node.module}"
                elif isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "mhar":
                    assert node.module in kernels, f"{label}/{name}: from {node.module}"
                elif isinstance(node, ast.Import):
                    assert all(a.name.split(".")[0] != "mhar" for a in node.names), f"{label}/{name}"
    for theirs, ours in (("mhar_model_transformer.py", "mhar/model/transformer.py"),
                         ("tests_toy_variant.py", "tests/toy_variant.py")):
        shipped_lines = (ex[TOY]["hf"] / theirs).read_text().splitlines()
        original = (ROOT / ours).read_text().splitlines()
        assert len(shipped_lines) == len(original), theirs
        for a, b in zip(shipped_lines, original):  # verbatim, but `from mhar.x.y import` -> `from .mhar_x_y import`
            if a != b:
                module = b.split()[1]
                assert module.startswith("mhar.") and a == b.replace(f"from {module} ", f"from .{module.replace('.', '_')} ")
    assert "tests_toy_variant.py" in ex[TOY]["report"]["shipped"]
    assert "tests_toy_variant.py" not in ex["mhar"]["report"]["shipped"]


def test_an_unshippable_import_is_refused_naming_it(tmp_path, monkeypatch):
    """A variant module whose imports cannot become flat relative imports is refused with the line to change."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "shipme_a.py").write_text("import mhar.model.config\n")
    (tmp_path / "shipme_b.py").write_text("from mhar.model import config\n")
    with pytest.raises(ship.ShipError, match=r"shipme_a \(line 1\): `import mhar.model.config`"):
        ship.plan("shipme_a")
    with pytest.raises(ship.ShipError, match=r"imports a module.*mhar.model.config instead"):
        ship.plan("shipme_b")


def test_toy_variant_is_tabulated_under_its_own_display_name(tmp_path):
    """The toy variant (a module outside mhar; nothing else edited), trained by python -m mhar.train as for the
    export tests above, appears in Table 1 under the display name its class declares, paired with a baseline."""
    from analysis.tables.build import make_table
    from tests.toy_variant import GatedResidual

    corpus = tmp_path / "corpus.txt"  # one config but the residual: the same corpus, hence the same data order
    corpus.write_text("".join(f"line {i} of a small corpus for the toy variant\n" for i in range(400)))
    base = train_toy(tmp_path / "base", residual="{variant: baseline}", corpus=corpus)
    toy = train_toy(tmp_path / "toy", corpus=corpus)
    assert json.loads((toy / "summary.json").read_text())["display"]["display"] == GatedResidual.display_name
    make_table("table1", [base / "summary.json", toy / "summary.json"], tmp_path / "t1")
    rows = (tmp_path / "t1.md").read_text()
    assert f"| {GatedResidual.display_name}" in rows or f" {GatedResidual.display_name} " in rows, rows
