"""Environment variables read by the library and its CLIs: documented defaults, read here only.

``MHAR_DATA_DIR``
    The local data mirror (layout of ``shared/data``: corpora, evaluation data, tokenizers), used
    only when no data directory is given explicitly: ``data.data_dir`` of a run config (the
    workflow sets it from its ``data_dir:``), ``--data-dir`` of ``python -m eval.run`` and
    ``python -m eval.probe``, ``data_dir=`` of the Python functions. Unset: the Hugging Face hub.

``MHAR_TOKENIZE_WORKERS``
    Processes that tokenize a corpus into token shards (``mhar.data.build_shards``); unset or 0:
    every core this process may use. The shards are the same for any value.

The fused-routing kernel knobs (``MHAR_ROUTING_*``) belong to ``mhar.routing`` (docs/ARCHITECTURE.md);
``torchrun``'s ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` to ``mhar.distributed``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["DATA_DIR_ENV", "TOKENIZE_WORKERS_ENV", "data_dir", "tokenize_workers", "tokenizers_single_threaded"]

DATA_DIR_ENV = "MHAR_DATA_DIR"
TOKENIZE_WORKERS_ENV = "MHAR_TOKENIZE_WORKERS"


def data_dir(explicit: Optional[str | os.PathLike] = None) -> Optional[Path]:
    """The data directory: ``explicit`` when given, else ``$MHAR_DATA_DIR``, else None (the hub).

    Not checked for existence here; the caller says which setting pointed where.
    """
    d = explicit if explicit not in (None, "") else os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(d).expanduser() if d else None


def tokenize_workers() -> int:
    """``$MHAR_TOKENIZE_WORKERS`` (0 when unset: the caller uses every available core)."""
    raw = os.environ.get(TOKENIZE_WORKERS_ENV, "").strip()
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{TOKENIZE_WORKERS_ENV}={raw!r}: expected a number of processes >= 0 (0: all cores)")
    return n


def tokenizers_single_threaded() -> None:
    """Set ``TOKENIZERS_PARALLELISM=false`` in this process (a tokenizer worker process of
    ``mhar.data``: one core each, and no warning about parallelism before a fork)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
