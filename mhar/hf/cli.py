"""``python -m mhar export-hf`` / ``python -m mhar import-hf`` (see :mod:`mhar.hf`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from mhar.runs.checkpoint import CheckpointError
from mhar.model.config import ConfigError
from mhar.hf.export import ExportError, export_hf
from mhar.hf.importer import ImportHFError, import_hf


def _fail(err: BaseException) -> int:
    print(f"error: {err}", file=sys.stderr)
    return 2


def _run_below(src: str) -> Optional[str]:
    """The error for a folder that holds no model.pt but run folders below it (results/runs/LABEL/SIZE/seedK is
    the folder above the runs' ``<identity>/`` folders): names them. None when ``src`` is not such a folder."""
    d = Path(src)
    if not d.is_dir() or (d / "model.pt").exists():
        return None
    runs = sorted(p.parent for p in d.glob("*/model.pt"))
    if not runs:
        return None
    if len(runs) == 1:
        return f"{d} holds no model.pt; the run below it is {runs[0]} (export that folder)"
    return (f"{d} holds no model.pt; it holds {len(runs)} runs ({', '.join(p.name for p in runs)}): "
            f"export one of them, e.g. {runs[0]}")


def export_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="mhar export-hf", description="Export a run's model as a Hugging Face directory (safetensors, config, "
        "tokenizer, model card); the baseline loads as stock Qwen3/Llama, routed variants with trust_remote_code.")
    p.add_argument("src", help="a run directory (holding model.pt) or a model.pt file")
    p.add_argument("--out", required=True, help="new output directory (refused if it exists and is not empty)")
    p.add_argument("--tokenizer", default=None, help="tokenizer spec to write (default: the one stored in model.pt)")
    p.add_argument("--no-check", action="store_true", help="skip reloading the export and comparing its logits")
    a = p.parse_args(argv)
    hint = _run_below(a.src)
    if hint:
        return _fail(hint)
    try:
        rep = export_hf(a.src, a.out, tokenizer=a.tokenizer, check=not a.no_check)
    except (ExportError, CheckpointError, ConfigError, OSError, ValueError) as e:
        return _fail(e)
    chk = rep["check"]
    print(f"exported {rep['variant']} as {rep['architecture']} -> {a.out}"
          + (f" (reloaded: max |logits diff| {chk['max_abs_diff']:.3g})" if chk else " (not checked)"))
    return 0


def import_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="mhar import-hf", description="Import a Hugging Face model (our exports, stock Qwen3/Llama, the "
        "authors' Qwen3-AttnRes checkpoints) as a harness model.pt.")
    p.add_argument("src", help="a local Hugging Face model directory, or a hub name org/name")
    p.add_argument("--out", required=True,
                   help="output model.pt path (or a folder to hold model.pt); never overwritten")
    p.add_argument("--tokenizer", default=None, help="tokenizer spec to store (default: from the directory)")
    p.add_argument("--revision", default=None, help="hub revision (hub names only)")
    p.add_argument("--no-check", action="store_true", help="skip the logits comparison with transformers' model")
    a = p.parse_args(argv)
    try:
        rep = import_hf(a.src, a.out, tokenizer=a.tokenizer, check=not a.no_check, revision=a.revision)
    except (ImportHFError, CheckpointError, ConfigError, OSError, ValueError) as e:
        return _fail(e)
    chk = rep["check"]
    mode = f" (attnres_mode {rep['attnres_mode']})" if rep.get("attnres_mode") else ""
    print(f"imported {rep['model_type']}{mode} as {rep['variant']} -> {rep['out']}"
          + (f" (max |logits diff| vs {chk['reference']}: {chk['max_abs_diff']:.3g})" if chk else ""))
    for note in rep.get("notes") or []:
        print(f"note: {note}")
    return 0
