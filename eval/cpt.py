"""Evaluation and table of the continued-pretraining arms (workflow/rules/cpt.smk).

:func:`evaluate_cpt_model` evaluates one CPT model (``base`` / ``plain`` / ``mhar``) on one task
with :func:`eval.run.evaluate_model` under the ``cpt.eval`` settings (``mhar.cpt.CPTEvalConfig``);
:func:`write_cpt_table` writes the CPT gain / total gain / MHAR gain table (``eval.tables`` kind
``cpt``) and its manifest. The pairing check of the two arms that the table makes (with or without a
manifest) is ``eval.tables.cpt.check_arms``. The config and run configs of the arms are in ``mhar.cpt``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .run import evaluate_model

if TYPE_CHECKING:  # the table needs no torch: the analysis environment (workflow/envs/analysis.yaml) has none
    from mhar.cpt import CPTEvalConfig

__all__ = ["evaluate_cpt_model", "write_cpt_table"]


def evaluate_cpt_model(model_path: str | Path, task: str, out_dir: str | Path, ev: "CPTEvalConfig",
                       data_dir: Optional[str | Path] = None) -> dict:
    """Evaluate one CPT model (an exported model.pt) on one task with eval.run; returns results.json.

    ``data_dir``: local data mirror (default ``$MHAR_DATA_DIR``, ``mhar.env``; unset: the hub)."""
    # lazy: torch and lm-eval are in the eval environment only; write_cpt_table runs in the analysis one
    import torch

    from .adapter import MharLM  # lazy: torch and lm-eval (see above)

    device = ev.device if ev.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    lm = MharLM(pretrained=str(model_path), device=device, batch_size=ev.batch_size, max_length=ev.max_length,
                max_gen_toks=ev.max_gen_toks, dtype=ev.dtype)
    subset = None if ev.subset == "full" else ev.subset
    return evaluate_model(model_path, [task], out_dir, subset=subset, device=device, lm=lm,
                          data_dir=data_dir)[task]


def write_cpt_table(base_eval: str | Path, plain_eval: str | Path, mhar_eval: str | Path, out_prefix: str | Path,
                    scale: str, batch_check: Optional[dict] = None, n_resamples: int = 4999,
                    published: Optional[dict] = None) -> list[Path]:
    """CPT gain / total gain / MHAR gain table (eval.tables cpt) from three eval dirs.

    Writes ``<out_prefix>.manifest.yaml`` (inputs + the batch-identity check) next to the table. ``published``:
    {table kind: source id} of the published numbers quoted (the config's ``published`` block).
    """
    import yaml

    # lazy: the table's statistics (scipy, pandas) are in the analysis environment only; evaluate_cpt_model
    # runs in the eval one
    from .tables.build import make_table

    out_prefix = Path(out_prefix)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    # relative to the manifest's folder (as eval.tables reads them): the same file wherever the tree lies
    here = out_prefix.parent.resolve()
    rel = lambda p: os.path.relpath(Path(p).resolve(), here)  # noqa: E731
    manifest = {"base": rel(base_eval), "plain": rel(plain_eval), "mhar": rel(mhar_eval), "scale": scale}
    if batch_check is not None:
        manifest["batch_check"] = batch_check
    mpath = out_prefix.with_name(out_prefix.name + ".manifest.yaml")
    mpath.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return make_table("cpt", [mpath], out_prefix, n_resamples=n_resamples, published=published)
