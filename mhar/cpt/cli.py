"""CLI: ``python -m mhar.cpt {convert,export-hf,check-batches}`` (see ``mhar.cpt``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from mhar.runs.checkpoint import CheckpointError
from mhar.model.config import ConfigError
from mhar.hf.export import ExportError, export_hf
from mhar.cpt.convert import CPTConversionError, convert_hf_llama, save_converted
from mhar.cpt.batches import compare_batch_logs
from mhar.atomic import os_error_line


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mhar.cpt", description="Continued pretraining: exact Llama -> mhar conversion and checks")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="Hugging Face Llama -> mhar checkpoint, refusing anything not exact")
    c.add_argument("--src", required=True, help="local directory or hub name (e.g. marin-community/marin-8b-base)")
    c.add_argument("--out", required=True, help="output directory: model.pt + conversion.json")
    c.add_argument("--variant", default="mhar_delta", choices=["mhar_delta", "baseline"])
    c.add_argument("--heads", type=int, default=8)
    c.add_argument("--block-layers", type=int, default=4, help="layers per delta source")
    c.add_argument("--tokenizer", default=None, help="tokenizer spec to store (default: hf:<src>)")
    c.add_argument("--revision", default=None)
    c.add_argument("--device", default="cpu", help="device of the fp32 exactness check")
    e = sub.add_parser("export-hf", help="model.pt -> Hugging Face directory (= python -m mhar export-hf)")
    e.add_argument("--model", required=True, help="model.pt or run directory")
    e.add_argument("--out", required=True)
    b = sub.add_parser("check-batches", help="verify two CPT arms saw byte-identical batches")
    b.add_argument("run_a")
    b.add_argument("run_b")
    a = p.parse_args(argv)
    try:
        if a.cmd == "convert":
            model, report = convert_hf_llama(a.src, a.heads, a.block_layers, variant=a.variant,
                                             revision=a.revision, device=a.device)
            path = save_converted(model, report, a.out, a.tokenizer or f"hf:{a.src}")
            print(f"exact conversion (max |diff| = {report.max_abs_diff}) -> {path}")
        elif a.cmd == "export-hf":
            rep = export_hf(a.model, a.out)
            print(f"exported {rep['variant']} as {rep['architecture']} -> {a.out}")
        else:
            print(json.dumps(compare_batch_logs(a.run_a, a.run_b), indent=1))
    except (CPTConversionError, ExportError, ConfigError, CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # disk full, read-only or forbidden --out
        print("error: " + os_error_line(err, a.cmd), file=sys.stderr)
        return 2
    return 0
