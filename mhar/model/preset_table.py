"""List the named model presets (``mhar.model.presets``) with their parameter counts.

    python -m mhar.model.preset_table            # aligned text table (= mhar presets)
    python -m mhar.model.preset_table --markdown # the same as a Markdown table

Models are built on the meta device, so even the 1B preset is counted instantly
without allocating memory. ``params (mhar)`` is the same model with MHAR
routing (2 d (2L+1) extra parameters; AttnRes has the same count).
"""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

import torch

from mhar.model.config import model_config
from mhar.model.presets import PRESETS, size_key
from mhar.model.transformer import Transformer

COLUMNS = ("preset", "d", "layers", "heads", "kv heads", "ffn", "vocab", "params (baseline)",
           "params non-emb (baseline)", "params (mhar)")


def count_params(preset: str, variant: str = "baseline", **residual: Any) -> int:
    """Parameter count of ``preset`` with residual ``variant`` (tied weights counted once)."""
    cfg = model_config(preset, residual={"variant": variant, **residual})
    with torch.device("meta"):
        return Transformer(cfg).num_params()


def preset_rows(presets: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    """One dict per preset with the shape and parameter counts (keys = ``COLUMNS``)."""
    rows = []
    for name in presets or sorted(PRESETS, key=size_key):
        cfg = model_config(name)
        base = count_params(name, "baseline")
        rows.append({
            "preset": name, "d": cfg.d_model, "layers": cfg.n_layers, "heads": cfg.n_heads,
            "kv heads": cfg.n_kv_heads, "ffn": cfg.d_ff, "vocab": cfg.vocab_size,
            "params (baseline)": base,
            "params non-emb (baseline)": base - cfg.vocab_size * cfg.d_model,
            "params (mhar)": count_params(name, "mhar"),
        })
    return rows


def format_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    cells = [[f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in COLUMNS] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])
    widths = [max(len(h), *(len(c[j]) for c in cells)) for j, h in enumerate(COLUMNS)]
    fmt = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([fmt(COLUMNS), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells])


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="mhar presets", description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    print(format_table(preset_rows(), markdown=args.markdown))


if __name__ == "__main__":
    main()
