"""Import a Hugging Face model directory (or hub name) as a harness ``model.pt``.

    python -m mhar import-hf HF_DIR_OR_HUB_NAME --out MODEL_PT [--tokenizer SPEC] [--no-check]
    from mhar.hf import import_hf; report = import_hf("HF_DIR", "out/model.pt")

``config.json``'s ``model_type`` decides (the directory's own Python files are never executed):

* ``mhar``: our own exports; the weights come back identical (and ``extra.run`` with them).
* ``qwen3`` / ``llama``: stock checkpoints (e.g. the CPT arm's base model) as the ``baseline`` variant
  (``qk_norm`` on for Qwen3, off for Llama; tying, RoPE incl. Llama-3 scaling, RMSNorm epsilon as stored).
* ``qwen3_attnres``: the AttnRes authors' checkpoints, converted by :mod:`mhar.hf.authors`: the MHAR
  layout (``full_mh`` -> ``mhar`` with H heads, ``full`` -> ``attnres``, ``block`` -> ``block_attnres`` where
  the blocks match, ``full_hw`` -> ``mhar_hw`` with one head) and the released Open AttnRes layout
  (``block`` -> ``open_attnres``, ``full`` -> ``open_attnres_full``, every gate type); anything else is
  refused naming the field.

Check (on by default): ``qwen3`` / ``llama`` are loaded with transformers' own classes and ``mhar`` with
this package's ``modeling_mhar`` (never the directory's copy), and their fp32 logits on a fixed token
batch are compared with the imported model's (more than ``CHECK_TOL`` x max(1, max |logit|) apart is an
error). The authors' format has no reference to run here (their code is not executed); its conversion is
tested against an independent implementation of their formulas (tests/hf/test_hf_authors.py).

Weights are read from ``*.safetensors`` (single or sharded with ``model.safetensors.index.json``) or, for
older checkpoints, ``pytorch_model*.bin`` with ``torch.load(weights_only=True)`` (tensors only).
A tensor whose shape disagrees with what config.json implies is refused naming the tensor and both shapes; a
tensor holding a NaN or an inf is refused naming it (every model_type, before the conversion); the authors'
config.json fields are checked for type and range before the weights are read (:func:`check_config_fields`).
Provenance (``extra.import_hf`` of ``model.pt``): the source, the requested ``revision``, ``hub_commit`` (the
hub commit hash of the snapshot: a hub download or a folder of the hub cache, ``.../snapshots/<hash>``; None
for any other folder), ``content_sha256`` (one hash over config.json and the weight files, whatever the
source), the sha256 of each weight file, the check, the tokenizer spec and the importer's environment.

The tokenizer spec stored in ``model.pt``: ``--tokenizer``, else ``byte`` for our byte-tokenizer exports,
``hf:<name>`` for a hub download, the directory itself when it holds ``tokenizer.json``.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Optional, Union

import torch
from huggingface_hub import snapshot_download
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor
from transformers import AutoConfig
from transformers.utils import logging as hf_logging

from mhar.atomic import file_sha256
from mhar.runs.checkpoint import MODEL_FILE, non_finite_tensor, save_model
from mhar.model.config import ConfigError, ModelConfig
from mhar.model.transformer import Transformer
from mhar.hf.authors import MODEL_TYPE as AUTHORS_TYPE
from mhar.hf.authors import AuthorsFormatError, check_config_fields, convert_authors
from mhar.hf.export import CHECK_TOL
from mhar.hf.names import from_hf_state_dict, hf_name, model_config_from_mhar_fields
from mhar.hf.modeling_mhar import MharForCausalLM
from mhar.hf.stock import StockCheckpointError, llama_model_config, qwen3_model_config
from mhar.runs.provenance import collect_provenance

SUPPORTED = ("mhar", "qwen3", "llama", AUTHORS_TYPE)


class ImportHFError(RuntimeError):
    """The directory cannot be imported (missing / corrupt files, an unsupported model); names the cause."""


# --- reading ------------------------------------------------------------------------------------------
def resolve_source(src: Union[str, Path], revision: Optional[str] = None) -> tuple[Path, Optional[str]]:
    """(local folder, hub name or None): a directory as is, else a hub snapshot (config, weights, tokenizer)."""
    p = Path(src)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ImportHFError(f"{p} has no config.json: not a Hugging Face model directory")
        return p, None
    if p.exists() or str(src).startswith((".", "/")) or str(src).count("/") != 1:
        raise ImportHFError(f"{src}: no such model directory (a hub name looks like 'org/name')")
    try:
        folder = snapshot_download(str(src), revision=revision, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "tokenizer*", "merges.txt", "vocab.*"])
    except Exception as e:  # network, auth, missing repo
        raise ImportHFError(f"could not download {src!r} from the Hugging Face hub ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}); download it and give the directory") from e
    return Path(folder), str(src)


def read_config(folder: Path) -> dict:
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ImportHFError(f"{folder / 'config.json'} is unreadable or not JSON ({e})") from e
    if not isinstance(cfg, dict):
        raise ImportHFError(f"{folder / 'config.json'} is not a JSON object")
    return cfg


def read_tensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint (safetensors preferred; sharded via the index)."""
    index = folder / "model.safetensors.index.json"
    files: list[Path]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ImportHFError(f"{index} is unreadable ({e})") from e
        files = [folder / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    out: dict[str, Tensor] = {}
    if files:
        for f in files:
            try:
                out.update(load_file(str(f)))
            except (SafetensorError, OSError, ValueError) as e:
                raise ImportHFError(f"{f} is unreadable or corrupt ({e}); download it again") from e
        return out
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise ImportHFError(f"{folder} holds no weights (*.safetensors or pytorch_model*.bin)")
    for f in bins:
        try:
            out.update(torch.load(f, map_location="cpu", weights_only=True))
        except Exception as e:
            raise ImportHFError(f"{f} is not a plain tensor file ({type(e).__name__}); "
                                "convert it to safetensors") from e
    return out


# --- stock Qwen3 / Llama --------------------------------------------------------------------------------
def stock_model_config(folder: Path, model_type: str, tensors: dict[str, Tensor]) -> ModelConfig:
    """ModelConfig of a stock ``qwen3`` / ``llama`` checkpoint (transformers' config class parses it; the
    mapping is :mod:`mhar.hf.stock`'s)."""
    hf = AutoConfig.from_pretrained(str(folder))  # a registered model_type: no remote code
    tied = "lm_head.weight" not in tensors or bool(getattr(hf, "tie_word_embeddings", False))
    try:
        if model_type == "qwen3":
            return qwen3_model_config(hf, tied)
        cfg = llama_model_config(hf, variant="baseline", heads=1)
    except (StockCheckpointError, ConfigError) as e:
        raise ImportHFError(str(e)) from e
    cfg.tie_embeddings = tied
    if cfg.head_dim == cfg.d_model // cfg.n_heads:
        cfg.head_dim = None  # the default, as the harness writes it
    return cfg


# --- check ----------------------------------------------------------------------------------------------
@torch.no_grad()
def check_import(model: Transformer, folder: Path, model_type: str, seed: int = 0) -> Optional[dict]:
    """Max |logits| difference against the directory loaded by a trusted implementation (None: none exists)."""
    if model_type == AUTHORS_TYPE:
        return None

    if model_type == "mhar":
        loader = MharForCausalLM
        name = "mhar.hf.modeling_mhar.MharForCausalLM"
    else:
        from transformers import AutoModelForCausalLM as loader  # the stock loader, only for qwen3 / llama
        name = f"transformers AutoModelForCausalLM ({model_type})"
    hf_logging.disable_progress_bar()
    try:
        hf = loader.from_pretrained(str(folder), dtype=torch.float32).eval()
    finally:
        hf_logging.enable_progress_bar()
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (2, min(32, cfg.max_seq_len)), generator=g)
    ref = hf(input_ids=ids).logits.float()
    diff = float((ref - model(ids).logits.float()).abs().max())
    scale = max(1.0, float(ref.abs().max()))
    if not diff <= CHECK_TOL * scale:
        raise ImportHFError(f"the imported model's logits differ from {name}'s by {diff:.3g} (> {CHECK_TOL} x "
                            f"{scale:.3g}); nothing was written")
    return {"reference": name, "max_abs_diff": diff, "batch": list(ids.shape), "seed": seed, "dtype": "float32"}


# --- the import -----------------------------------------------------------------------------------------
def _out_path(out: Union[str, Path]) -> Path:
    out = Path(out)
    path = out if out.suffix == ".pt" else out / MODEL_FILE
    if path.exists():
        raise ImportHFError(f"{path} already exists; choose a new --out (an import never overwrites)")
    return path


def _tokenizer_spec(hf: dict, folder: Path, hub: Optional[str], given: Optional[str]) -> str:
    if given:
        return given
    meta = hf.get("mhar") if isinstance(hf.get("mhar"), dict) else {}
    if meta.get("tokenizer") == "byte":
        return "byte"
    if hub is not None:
        return f"hf:{hub}"
    if (folder / "tokenizer.json").is_file():
        return str(folder.resolve())
    raise ImportHFError(f"{folder} has no tokenizer.json; name the tokenizer with --tokenizer (byte, a "
                        "tokenizer.json path or hf:<name>)")


def _check_shapes(model: Transformer, state: dict[str, Tensor], folder: Path) -> None:
    """Refuse a tensor whose shape is not the one the config implies (config.json and weights disagree)."""
    for name, want in model.state_dict().items():  # the model's order: the first layer's first mismatch
        t = state.get(name)
        if t is not None and tuple(want.shape) != tuple(t.shape):
            try:
                theirs = hf_name(name)
            except KeyError:
                theirs = name
            raise ImportHFError(f"{folder}: tensor {theirs} has shape {tuple(t.shape)} in the weights, but "
                                f"config.json implies {tuple(want.shape)}; the config and the weights disagree "
                                "(nothing was written)")


_SNAPSHOT = re.compile(r"^[0-9a-f]{40}$")


def hub_commit(folder: Path) -> Optional[str]:
    """The hub commit hash of a hub-cache snapshot folder (``models--org--name/snapshots/<hash>``), else None."""
    folder = Path(folder).resolve()
    if folder.parent.name == "snapshots" and _SNAPSHOT.match(folder.name) \
            and folder.parent.parent.name.startswith("models--"):
        return folder.name
    return None


def content_sha256(folder: Path, weights: dict[str, str]) -> str:
    """One sha256 over config.json and the weight files (name and sha256 of each, sorted): the source's identity
    when it is not a hub snapshot."""
    h = hashlib.sha256()
    for name, digest in sorted({**weights, "config.json": file_sha256(folder / "config.json")}.items()):
        h.update(f"{name}\0{digest}\n".encode())
    return h.hexdigest()


def convert_folder(folder: Path, routing_impl: str = "eager") -> tuple[Transformer, dict, dict]:
    """(model, config.json, report fields) of a local Hugging Face directory."""
    hf = read_config(folder)
    mtype = hf.get("model_type")
    if mtype not in SUPPORTED:
        raise ImportHFError(f"model_type {mtype!r} is not supported (supported: {', '.join(SUPPORTED)})")
    if mtype == AUTHORS_TYPE:
        try:  # the fields first: a lying config.json is refused before the weights are read
            check_config_fields(hf)
        except AuthorsFormatError as e:
            raise ImportHFError(f"{folder}: {e}") from e
    tensors = read_tensors(folder)
    bad = non_finite_tensor(tensors)
    if bad:
        raise ImportHFError(f"{folder}: tensor {bad} is not finite; the checkpoint is damaged (download it again, "
                            "or retrain the model that wrote it); nothing was written")
    notes: list[str] = []
    try:
        if mtype == AUTHORS_TYPE:
            cfg, state, notes = convert_authors(hf, tensors, routing_impl)
        else:
            if mtype == "mhar":
                cfg = model_config_from_mhar_fields(hf)
            else:
                cfg = stock_model_config(folder, mtype, tensors)
            state, unknown = from_hf_state_dict(tensors, cfg.tie_embeddings)
            if unknown:
                raise ImportHFError(f"tensors with no place in a {cfg.residual.variant} model: {unknown[:5]}")
    except (AuthorsFormatError, ConfigError, KeyError) as e:
        raise ImportHFError(f"{folder}: {e}") from e
    trained_impl = cfg.residual.routing_impl
    cfg.residual.routing_impl = "eager"  # the check runs here, on the CPU; the stored config keeps the trained one
    model = Transformer(cfg)
    cfg.residual.routing_impl = trained_impl
    _check_shapes(model, state, folder)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ImportHFError(f"{folder}: weights do not match the config (missing {missing[:5]}, "
                            f"unexpected {unexpected[:5]})")
    return model.eval(), hf, {"model_type": mtype, "attnres_mode": hf.get("attnres_mode"), "notes": notes}


def import_hf(src: Union[str, Path], out: Union[str, Path], *, tokenizer: Optional[str] = None, check: bool = True,
              revision: Optional[str] = None, run: Optional[dict] = None) -> dict:
    """Convert ``src`` (directory or hub name) into ``out`` (a ``.pt`` path, or a folder for ``model.pt``).

    ``run``: the ``extra.run`` block to store (label, residual, size, seed, pairing, identity: how evaluations of the
    model are identified; the workflow's released arms set it; ``residual: None`` is filled with the imported
    model's variant and heads); default: the export's own, if any."""
    t0 = time.time()
    path = _out_path(out)
    folder, hub = resolve_source(src, revision)
    model, hf, fields = convert_folder(folder)
    spec = _tokenizer_spec(hf, folder, hub, tokenizer)
    weights = {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.suffix in (".safetensors", ".bin")}
    report = {"source": str(src), "folder": str(folder.resolve()), "revision": revision,
              "hub_commit": hub_commit(folder), "content_sha256": content_sha256(folder, weights), **fields,
              "variant": model.cfg.residual.variant, "heads": model.cfg.residual.heads, "weights": weights,
              "check": check_import(model, folder, fields["model_type"]) if check else None,
              "tokenizer": spec, "importer": collect_provenance(), "seconds": None}
    report["seconds"] = round(time.time() - t0, 3)
    meta = hf.get("mhar") if isinstance(hf.get("mhar"), dict) else {}
    # plain JSON types only: model.pt loads with torch.load(weights_only=True)
    extra = {"import_hf": json.loads(json.dumps(report, default=str))}
    if run is not None and run.get("residual") is None:
        run = {**run, "residual": {"variant": model.cfg.residual.variant, "heads": model.cfg.residual.heads}}
    if run is not None or meta.get("run"):
        extra["run"] = run if run is not None else meta["run"]
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(path, model, spec, extra=extra)
    report["out"] = str(path)
    return report
