"""The vocabulary check of a model against its tokenizer: the one check of eval.run, the ``mhar`` lm-eval
adapter and eval.probe (pure Python: imported by all three)."""
from __future__ import annotations

from typing import Any


def check_vocab(model: Any, tok: Any, label: str) -> None:
    """ValueError when ``model``'s vocabulary is smaller than ``tok``'s (ids past the embedding would fail in
    the middle of an evaluation): checked once, before any document is evaluated. ``label`` names the model
    as the user gave it (``--model PATH``); models without ``cfg.vocab_size`` (Hugging Face) are not checked
    here."""
    cfg = getattr(model, "cfg", None)
    mv, tv = getattr(cfg, "vocab_size", None), getattr(tok, "vocab_size", None)
    if isinstance(mv, int) and isinstance(tv, int) and mv < tv:
        raise ValueError(f"{label}: the model's vocabulary ({mv} ids) is smaller than its tokenizer's "
                         f"({getattr(tok, 'name', '?')}: {tv} ids), so some tokens have no embedding; evaluate it "
                         "with the tokenizer it was trained with (the one stored in the export), or re-export it")
