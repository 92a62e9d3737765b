"""Export a harness model (``model.pt`` or a run directory) as a Hugging Face model directory.

    python -m mhar export-hf RUN_DIR --out HF_DIR            # or RUN_DIR/model.pt
    from mhar.hf import export_hf; report = export_hf("RUN_DIR", "HF_DIR")

Writes ``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer files
(``AutoTokenizer.from_pretrained(HF_DIR)`` works, the byte tokenizer too), ``README.md`` (a model card
with the run's provenance: label, variant, size, seed, data, steps, metrics from ``summary.json``, the
resolved run config, weight hashes) and ``mhar_export.json`` (the same as data, plus the check).

* ``residual.variant: baseline`` is a stock ``Qwen3ForCausalLM`` (``qk_norm`` true) or ``LlamaForCausalLM``
  (``qk_norm`` false): ``AutoModelForCausalLM.from_pretrained(HF_DIR)`` needs no remote code.
* every other variant ships ``modeling_mhar.py`` (:mod:`mhar.hf.modeling_mhar`, referenced by ``auto_map``:
  ``AutoConfig`` / ``AutoModelForCausalLM``) with the model package's own modules, flattened beside it
  (:mod:`mhar.hf.ship`; the variant's module too when it lives outside ``mhar``):
  ``from_pretrained(HF_DIR, trust_remote_code=True)`` works where ``mhar`` is not installed.

Before anything is moved into place, the directory is loaded back as a user loads it (the stock class, or
``trust_remote_code`` on the shipped files) and its fp32 logits on a fixed token batch are compared
with the harness model's; more than ``CHECK_TOL`` x max(1, max |logit|) apart is an :class:`ExportError`
(``check=False`` skips it). The directory appears atomically (built in a temporary sibling, then renamed); an existing
non-empty ``--out`` is refused, never overwritten.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional, Union

import torch
import yaml
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen3Config
from transformers.utils import HF_MODULES_CACHE
from transformers.utils import logging as hf_logging

from mhar.atomic import file_sha256, pid_alive, read_json
from mhar.runs.checkpoint import MODEL_FILE, CheckpointError, load_model, read_checkpoint
from mhar.model.config import ModelConfig, stored_routing_impl, to_dict
from mhar.model.residuals import display_record
from mhar.model.transformer import Transformer
from mhar.hf.ship import ENTRY_FILE, ShipError, write_shipped
from mhar.safe_yaml import read_yaml_file
from mhar.hf.modeling_mhar import MharConfig
from mhar.hf.names import hf_common_fields, mhar_config_fields, to_hf_state_dict
from mhar.hf.tokenizer_files import write_tokenizer
from mhar.runs.provenance import collect_provenance

FORMAT = "mhar-hf-v1"
WEIGHTS_FILE = "model.safetensors"
MODELING_FILE = ENTRY_FILE + ".py"
CHECK_TOL = 1e-5  # accepted max |logits difference| / max(1, max |logit|) in fp32 (measured: 0 for the same ops)
AUTO_MAP = {"AutoConfig": "modeling_mhar.MharConfig", "AutoModelForCausalLM": "modeling_mhar.MharForCausalLM"}


class ExportError(RuntimeError):
    """The model cannot be exported, or the exported directory does not reproduce it."""


def architecture(cfg: ModelConfig) -> str:
    """The transformers class an export of ``cfg`` loads as."""
    if cfg.residual.variant == "baseline":
        return "Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM"
    return "MharForCausalLM"


# --- provenance of the source ------------------------------------------------------------------------
def source_info(src: Path) -> dict:
    """Run-directory records next to ``src`` (a run dir or a model.pt): summary, run config, provenance."""
    run_dir = src if src.is_dir() else src.parent
    info: dict[str, Any] = {"run_dir": str(run_dir.resolve())}
    summary = read_json(run_dir / "summary.json")
    if summary is not None:
        info["summary"] = summary
    if (run_dir / "config.yaml").is_file():
        try:
            info["run_config"] = read_yaml_file(run_dir / "config.yaml")
        except yaml.YAMLError:
            info["run_config"] = None
    prov = read_json(run_dir / "provenance.json")
    if prov is not None:
        info["provenance"] = {k: prov.get(k) for k in ("git", "packages", "hardware", "identity", "pairing",
                                                       "config_hash") if k in prov}
    return info


# --- config files ------------------------------------------------------------------------------------
def _hf_config(cfg: ModelConfig, tok: dict, meta: dict):
    ids = {"bos_token_id": tok.get("bos_token_id"), "eos_token_id": tok.get("eos_token_id"),
           "pad_token_id": tok.get("eos_token_id")}
    arch = architecture(cfg)
    if arch == "MharForCausalLM":
        hf_cfg = MharConfig(**mhar_config_fields(cfg), **ids, mhar=meta, dtype="float32")
        hf_cfg.auto_map = dict(AUTO_MAP)
    else:
        scaling = {"rope_type": "llama3", **cfg.rope_scaling} if cfg.rope_scaling else None
        # legacy keywords rope_theta / rope_scaling: understood by transformers 4.x and 5.x alike
        kw = dict(hf_common_fields(cfg), rope_theta=cfg.rope_theta, rope_scaling=scaling, attention_bias=False,
                  **ids, mhar=meta, dtype="float32")
        hf_cfg = (Qwen3Config(**kw, use_sliding_window=False) if arch == "Qwen3ForCausalLM"
                  else LlamaConfig(**kw, mlp_bias=False))
    hf_cfg.architectures = [arch]
    return hf_cfg


def _generation_config(tok: dict):
    kw = {k: tok[k] for k in ("bos_token_id", "eos_token_id") if tok.get(k) is not None}
    if tok.get("eos_token_id") is not None:
        kw["pad_token_id"] = tok["eos_token_id"]
    return GenerationConfig(**kw)


# --- model card --------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else str(v)


def model_card(cfg: ModelConfig, report: dict) -> str:
    """README.md: what the model is, how to load it, where it came from."""
    src = report["source"]
    summary = src.get("summary") or {}
    run = summary.get("run") or report.get("run") or {}
    run_cfg = src.get("run_config") or {}
    data = run_cfg.get("data") or {}
    train = run_cfg.get("train") or {}
    arch = report["architecture"]
    remote = arch == "MharForCausalLM"
    label = run.get("label") or cfg.residual.variant
    r = cfg.residual
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             "tags:", "- mhar", f"- residual-{r.variant}", "---", "",
             f"# {label} ({r.variant}{f', H={r.heads}' if display_record(r.variant)['shows_heads'] else ''}"
             f"{', ' + str(run['size']) if run.get('size') else ''}"
             f"{', seed ' + str(run['seed']) if run.get('seed') is not None else ''})", "",
             "Exported by the MHAR harness (`python -m mhar export-hf`), a reproduction of \"Multi-Head Attention "
             "Residuals\" (arXiv:2607.27230). "
             + ("A plain pre-norm decoder: it loads as the stock "
                f"`{arch}`, no remote code." if not remote else
                f"`{MODELING_FILE}` and the `mhar_*.py` files beside it are the harness's own model modules (pure "
                f"PyTorch; the residual variant `{r.variant}` among them); on a GPU with the `mhar` package "
                "installed the routing uses its fused kernels."), "",
             "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             f"model = AutoModelForCausalLM.from_pretrained(PATH{', trust_remote_code=True' if remote else ''})",
             f"tok = AutoTokenizer.from_pretrained(PATH{', trust_remote_code=True' if remote else ''})",
             "out = model.generate(**tok(\"The cat\", return_tensors=\"pt\"), max_new_tokens=20, do_sample=False)",
             "```", "",
             "lm-eval: `lm_eval --model hf --model_args pretrained=PATH"
             f"{',trust_remote_code=True' if remote else ''},dtype=float32 --tasks ...`; back into the harness: "
             "`python -m mhar import-hf PATH --out model.pt` (identical weights).", "",
             "## Architecture", "", "| field | value |", "|---|---|"]
    arch_rows = [("class", arch), ("residual", json.dumps(to_dict(r))), ("d_model", cfg.d_model),
                 ("layers", cfg.n_layers), ("heads / KV heads", f"{cfg.n_heads} / {cfg.n_kv_heads}"),
                 ("head_dim", cfg.resolved_head_dim), ("d_ff", cfg.d_ff), ("vocab", cfg.vocab_size),
                 ("context (max_position_embeddings)", cfg.max_seq_len), ("RoPE theta", cfg.rope_theta),
                 ("RoPE scaling", cfg.rope_scaling or "none"), ("qk_norm", cfg.qk_norm), ("tied embeddings", cfg.tie_embeddings),
                 ("parameters", report["params"]), ("tokenizer", report["tokenizer"]["spec"])]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in arch_rows]
    lines += ["", "## Training run", "", "| field | value |", "|---|---|"]
    run_rows = [("label", run.get("label")), ("variant", summary.get("variant") or r.variant),
                ("size", run.get("size")), ("seed", run.get("seed")), ("data seed", run.get("data_seed")),
                ("corpus", data.get("corpus")), ("tokenizer", data.get("tokenizer")), ("seq_len", data.get("seq_len")),
                ("steps", summary.get("steps")), ("tokens", summary.get("tokens")),
                ("global batch", train.get("global_batch")), ("peak lr", train.get("lr")),
                ("pairing", run.get("pairing") or run.get("config_hash")),
                ("run identity", run.get("identity") or run.get("identity_hash")), ("run directory", src.get("run_dir"))]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in run_rows if v is not None]
    metrics = [(k, summary.get(k)) for k in ("tail_mean_val_loss", "tail_k", "final_val_loss", "final_val_loss_ema",
                                             "params", "tokens_per_s", "wall_s") if summary.get(k) is not None]
    if metrics:
        lines += ["", "## Metrics (summary.json)", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in metrics]
    else:
        lines += ["", "No `summary.json` next to the source: no training metrics recorded here."]
    prov = src.get("provenance") or {}
    git = prov.get("git") or {}
    lines += ["", "## Provenance", "", "| field | value |", "|---|---|",
              f"| source | `{report['source_path']}` |", f"| source sha256 | `{report['source_sha256']}` |",
              f"| {WEIGHTS_FILE} sha256 | `{report['weights_sha256']}` |",
              f"| training commit | {_fmt(git.get('commit'))}{' (dirty)' if git.get('dirty') else ''} |",
              f"| export commit | {_fmt((report['exporter'].get('git') or {}).get('commit'))} |",
              f"| exported | {report['exporter'].get('time_utc')} with transformers "
              f"{report['exporter']['packages'].get('transformers')}, "
              f"torch {report['exporter']['packages'].get('torch')} |"]
    chk = report.get("check")
    lines += ["", "## Export check", ""]
    if chk:
        lines.append(f"Reloaded with `{chk['loader']}`: max |logits - harness logits| = {chk['max_abs_diff']:.3g} "
                     f"in fp32 on a {chk['batch'][0]} x {chk['batch'][1]} token batch (seed {chk['seed']}).")
    else:
        lines.append("Not checked (`--no-check`).")
    if run_cfg:
        lines += ["", "<details><summary>Resolved run config</summary>", "", "```yaml",
                  yaml.safe_dump(run_cfg, sort_keys=False).rstrip(), "```", "", "</details>"]
    return "\n".join(lines) + "\n"


# --- the export ----------------------------------------------------------------------------------------
def _clean_stale(out: Path) -> None:
    for tmp in out.parent.glob(f".{out.name}.*.tmp"):
        pid = tmp.name[len(out.name) + 2: -len(".tmp")]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _remove_module_copy(module: str) -> None:
    """Remove the folder transformers copied a remote-code module into (under its modules cache)."""
    folder = Path(sys.modules[module].__file__).parent
    cache = Path(HF_MODULES_CACHE).resolve()
    if cache in folder.resolve().parents:
        shutil.rmtree(folder, ignore_errors=True)
        if {p.name for p in folder.parent.iterdir()} <= {"__init__.py", "__pycache__"}:
            shutil.rmtree(folder.parent, ignore_errors=True)  # the temporary folder's name: nothing else under it


@torch.no_grad()
def check_export(model: Transformer, folder: Path, seed: int = 0) -> dict:
    """Load ``folder`` back with transformers and compare its fp32 logits with ``model``'s."""
    cfg = model.cfg
    remote = architecture(cfg) == "MharForCausalLM"
    name = (f"{MODELING_FILE} (AutoModelForCausalLM, trust_remote_code)" if remote
            else f"transformers.{architecture(cfg)} (AutoModelForCausalLM)")
    hf_logging.disable_progress_bar()
    try:  # the shipped files are this package's own (mhar.hf.ship): trusted
        kw = {"trust_remote_code": True, "routing_impl": "torch"} if remote else {}
        hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kw).eval()
    finally:
        hf_logging.enable_progress_bar()
    if remote:  # the copy transformers made of the temporary folder's files: no one loads it again
        _remove_module_copy(type(hf).__module__)
    if type(hf).__name__ != architecture(cfg):
        raise ExportError(f"the export loads as {type(hf).__name__}, expected {architecture(cfg)}")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (2, min(32, cfg.max_seq_len)), generator=g)
    ref = model.float()(ids).logits
    got = hf(input_ids=ids).logits.float()
    diff = float((got - ref).abs().max())
    scale = max(1.0, float(ref.abs().max()))
    if not diff <= CHECK_TOL * scale:  # NaN fails too
        raise ExportError(f"the exported model's logits differ from the harness model's by {diff:.3g} (> {CHECK_TOL} x "
                          f"{scale:.3g}) when loaded with {name}; nothing was written")
    return {"loader": name, "max_abs_diff": diff, "batch": list(ids.shape), "seed": seed, "dtype": "float32"}


def export_model(model: Transformer, out: Union[str, Path], tokenizer: Optional[str] = None, *,
                 check: bool = True, source: Optional[dict] = None, extra: Optional[dict] = None) -> dict:
    """Write ``model`` (a ``mhar.model.transformer.Transformer``) as a Hugging Face directory ``out``; returns the report.

    ``tokenizer``: the harness tokenizer spec (``byte``, a tokenizer.json path, ``hf:<name>``); None writes
    no tokenizer files. ``source``: provenance of where the model came from (``export_hf`` fills it)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists and is not empty; choose a new --out (an export never overwrites)")
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out)
    cfg = model.cfg
    model = model.float().eval()
    source = source or {}
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.time()
    try:
        try:
            tok = write_tokenizer(tokenizer, tmp, cfg.max_seq_len)
        except (ValueError, OSError) as e:
            raise ExportError(f"tokenizer {tokenizer!r}: {e}") from e
        tensors = to_hf_state_dict(model.state_dict(), cfg.tie_embeddings)
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "mhar_format": FORMAT})
        meta = {"format": FORMAT, "tokenizer": tokenizer, "model_config": to_dict(cfg),
                "source_sha256": source.get("source_sha256"), "run": (extra or {}).get("run")}
        _hf_config(cfg, tok, meta).save_pretrained(str(tmp))
        if tok.get("eos_token_id") is not None:
            _generation_config(tok).save_pretrained(str(tmp))
        shipped = []
        if architecture(cfg) == "MharForCausalLM":
            try:
                shipped = write_shipped(tmp, cfg.residual.variant)
            except ShipError as e:
                raise ExportError(str(e)) from e
        report = {"format": FORMAT, "architecture": architecture(cfg), "variant": cfg.residual.variant,
                  "model_config": to_dict(cfg), "params": model.num_params(), "tokenizer": tok,
                  "source_path": source.get("source_path"), "source_sha256": source.get("source_sha256"),
                  "source": source.get("info") or {}, "run": (extra or {}).get("run"),
                  "weights_sha256": file_sha256(tmp / WEIGHTS_FILE), "shipped": shipped,
                  "check": check_export(model, tmp) if check else None,
                  "exporter": collect_provenance(), "seconds": None}
        report["seconds"] = round(time.time() - t0, 3)
        (tmp / "README.md").write_text(model_card(cfg, report), encoding="utf-8")
        (tmp / "mhar_export.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        # safetensors writes its file readable by the owner only: give it the mode the other files have
        os.chmod(tmp / WEIGHTS_FILE, (tmp / "config.json").stat().st_mode & 0o777)
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def export_hf(src: Union[str, Path], out: Union[str, Path], *, tokenizer: Optional[str] = None,
              check: bool = True) -> dict:
    """Export ``src`` (a run directory or a ``model.pt``) to ``out``; returns the report (``mhar_export.json``)."""
    src = Path(src)
    path = src / MODEL_FILE if src.is_dir() else src
    try:
        blob = read_checkpoint(path)
        model, _, blob = load_model(path, routing_impl="eager")  # the check runs on the CPU
    except CheckpointError as e:
        raise ExportError(str(e)) from e
    # the export records the routing the model was trained with, under its current name (a withdrawn fused
    # variant's name, as older checkpoints store it, is recorded as fused: what load_model runs for it)
    trained_impl = stored_routing_impl((blob.get("model_config") or {}).get("residual", {}).get("routing_impl", "eager"))
    model.cfg.residual.routing_impl = trained_impl
    source = {"source_path": str(path.resolve()), "source_sha256": file_sha256(path), "info": source_info(src)}
    return export_model(model, out, tokenizer if tokenizer is not None else blob.get("tokenizer"), check=check,
                        source=source, extra=blob.get("extra") or {})
