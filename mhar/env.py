"""Environment variables read by the library and its CLIs: documented defaults, read here only.

``MHAR_DATA_DIR``
    The local data mirror (layout of ``shared/data``: corpora, evaluation data, tokenizers), used
    only when no data directory is given explicitly: ``data.data_dir`` of a run config (the
    workflow sets it from its ``data_dir:``), ``--data-dir`` of ``python -m eval.run`` and
    ``python -m eval.probe``, ``data_dir=`` of the Python functions. Unset: the Hugging Face hub.

``MHAR_TOKENIZE_WORKERS``
    Processes that tokenize a corpus into token shards (``mhar.data.shards.build_shards``); unset or 0:
    every core this process may use. The shards are the same for any value.
``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, ``TRITON_CACHE_AUTOTUNING``
    Where ``torch.compile`` (inductor: FX graphs, generated kernels, autotuning results) and Triton (compiled
    kernels; with ``TRITON_CACHE_AUTOTUNING=1`` also the autotuner's choices, the fused routing's included)
    keep their caches across processes. ``use_compile_cache(root)`` (called by ``mhar.train`` and the
    lm-eval adapter) sets them to ``root/inductor``, ``root/triton`` and ``1`` unless the user had set them
    when this module was imported: a second run of the same shapes starts warm (no compilation, no
    autotuning). Default root: ``results/cache/compile`` (the trainer: beside ``data.cache_dir``).

The fused-routing kernel knobs (``MHAR_ROUTING_*``) belong to ``mhar.model.routing`` (docs/ARCHITECTURE.md);
``torchrun``'s ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` to ``mhar.training.distributed``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["DATA_DIR_ENV", "TOKENIZE_WORKERS_ENV", "data_dir", "tokenize_workers", "tokenizers_single_threaded",
           "COMPILE_CACHE_ENV", "DEFAULT_COMPILE_CACHE", "use_compile_cache"]

DATA_DIR_ENV = "MHAR_DATA_DIR"
TOKENIZE_WORKERS_ENV = "MHAR_TOKENIZE_WORKERS"
COMPILE_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING")
DEFAULT_COMPILE_CACHE = "results/cache/compile"
# the user's settings (torch writes its default TORCHINDUCTOR_CACHE_DIR into the environment on first use)
_USER_COMPILE_ENV = {k: os.environ.get(k) for k in COMPILE_CACHE_ENV}


WANDB_PROJECT_ENV = "WANDB_PROJECT"  # W&B's own variable; the harness's default project is "mhar"


def wandb_project() -> str:
    """The W&B project of tracked runs: ``$WANDB_PROJECT`` (W&B's own variable), else ``mhar``."""
    return os.environ.get(WANDB_PROJECT_ENV) or "mhar"


def wandb_mode() -> Optional[str]:
    """``$WANDB_MODE`` (W&B's own variable: online | offline | disabled) as this process sees it now, passed to each
    ``wandb.init`` so a run follows it even where wandb's process-wide settings were made earlier."""
    return os.environ.get("WANDB_MODE") or None


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
    ``mhar.data.shards``: one core each, and no warning about parallelism before a fork)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def use_compile_cache(root: Optional[str | os.PathLike] = DEFAULT_COMPILE_CACHE) -> dict:
    """Put the persistent compile / autotuning caches under ``root`` (see the module docstring; variables the
    user set win; ``root=None`` changes nothing). Returns the settings in force and whether a cache directory
    already held files (``warm``: the next compile of known shapes is a cache hit), for the run's records."""
    if root is not None:
        root = Path(root).expanduser().resolve()
        want = {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
                "TRITON_CACHE_AUTOTUNING": "1"}
        for key, value in want.items():
            if _USER_COMPILE_ENV.get(key) is None:
                os.environ[key] = value
    settings = {k: os.environ.get(k) for k in COMPILE_CACHE_ENV}
    warm = False
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        d = Path(settings[key]) if settings[key] else None
        warm = warm or bool(d is not None and d.is_dir() and any(d.iterdir()))
    return {"env": settings, "warm": warm}
