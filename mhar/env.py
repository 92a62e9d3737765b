"""Environment variables read by the library and its CLIs: documented defaults, read here only.

``MHAR_DATA_DIR``
    The local data mirror (layout of ``shared/data``: corpora, evaluation data, tokenizers), used
    only when no data directory is given explicitly: ``data.data_dir`` of a run config (the
    workflow sets it from its ``data_dir:``), ``--data-dir`` of ``python -m eval.run`` and
    ``python -m eval.probe``, ``data_dir=`` of the Python functions. Unset: the Hugging Face hub.

The fused-routing kernel knobs (``MHAR_ROUTING_*``) belong to ``mhar.routing`` (docs/ARCHITECTURE.md);
``torchrun``'s ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` to ``mhar.distributed``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["DATA_DIR_ENV", "data_dir"]

DATA_DIR_ENV = "MHAR_DATA_DIR"


def data_dir(explicit: Optional[str | os.PathLike] = None) -> Optional[Path]:
    """The data directory: ``explicit`` when given, else ``$MHAR_DATA_DIR``, else None (the hub).

    Not checked for existence here; the caller says which setting pointed where.
    """
    d = explicit if explicit not in (None, "") else os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(d).expanduser() if d else None
