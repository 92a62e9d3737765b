"""Evaluation of the continued-pretraining arms (workflow/rules/cpt.smk).

:func:`evaluate_cpt_model` evaluates one CPT model (``base`` / ``plain`` / ``mhar``) on one task
with :func:`eval.run.evaluate_model` under the ``cpt.eval`` settings (``mhar.cpt.CPTEvalConfig``);
the CPT gain / total gain / MHAR gain table and its manifest are the analysis stage's
(``analysis.tables.build.write_cpt_table``). The pairing check of the two arms that the table makes (with or without a
manifest) is ``analysis.tables.cpt.check_arms``. The config and run configs of the arms are in ``mhar.cpt``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .run import evaluate_model

if TYPE_CHECKING:  # mhar.cpt's config needs no import at run time (annotation only)
    from mhar.cpt import CPTEvalConfig

__all__ = ["evaluate_cpt_model"]


def evaluate_cpt_model(model_path: str | Path, task: str, out_dir: str | Path, ev: "CPTEvalConfig",
                       data_dir: Optional[str | Path] = None) -> dict:
    """Evaluate one CPT model (an exported model.pt) on one task with eval.run; returns results.json.

    ``data_dir``: local data mirror (default ``$MHAR_DATA_DIR``, ``mhar.env``; unset: the hub)."""
    # lazy: torch and lm-eval, only once a model is evaluated (this module imports without them)
    import torch

    from .adapter import MharLM  # lazy: torch and lm-eval (see above)

    device = ev.device if ev.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    lm = MharLM(pretrained=str(model_path), device=device, batch_size=ev.batch_size, max_length=ev.max_length,
                max_gen_toks=ev.max_gen_toks, dtype=ev.dtype)
    subset = None if ev.subset == "full" else ev.subset
    return evaluate_model(model_path, [task], out_dir, subset=subset, device=device, lm=lm,
                          data_dir=data_dir)[task]
