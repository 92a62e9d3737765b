"""Helpers for the local-mirror task YAMLs in this folder (offline evaluation).

The YAMLs here reproduce lm-eval's stock tasks (``wikitext``, ``lambada_openai``,
``hellaswag``, ``gsm8k``, ``gpqa_main_zeroshot``) prompt for prompt; only the data
source differs. Each YAML names a loader below as its ``custom_dataset``;
lm-eval calls it as ``loader(**task_metadata, **dataset_kwargs)``, so a loader gets
``data_files`` (paths relative to the data directory, layout of ``shared/data``)
and ``data_dir`` (put into the task metadata by ``eval.run``; falls back to
``MHAR_DATA_DIR``).

Prompt-building functions are the stock lm-eval ones, imported rather than
rewritten, so the text the model sees is byte-identical to the hub tasks.

GPQA is distributed as a password-protected zip (the password is published in
the GPQA README to keep the questions out of web crawls). It is decrypted in
memory only: no decrypted byte ever touches the disk (no temp file, no
``datasets`` cache file, since the dataset is built in memory).
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import zipfile
from pathlib import Path
from typing import Any, Optional

import datasets

from mhar import env


class _LocalLoaderAdvice(logging.Filter):
    """Drops lm-eval's advice, printed for every task with a ``custom_dataset``, that custom kwargs go through
    ``--metadata``: these loaders take their only kwarg (the data folder) from MHAR_DATA_DIR or eval.run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed to `--metadata`" not in str(record.msg)


# lm-eval's task module logs it; this module is imported by every task YAML of this folder before the load.
logging.getLogger("lm_eval.api.task").addFilter(_LocalLoaderAdvice())

# Stock lm-eval prompt code, reused verbatim (identical prompts to the hub tasks).
from lm_eval.tasks.gpqa.zeroshot.utils import preprocess as _gpqa_preprocess
from lm_eval.tasks.hellaswag.utils import process_docs as hellaswag_process_docs  # noqa: F401
from lm_eval.tasks.wikitext.preprocess_wikitext import (  # noqa: F401
    process_results as wikitext_process_results,
    wikitext_detokenizer,
)

# Published in https://github.com/idavidrein/gpqa (README), see shared/data/MANIFEST.md.
GPQA_PASSWORD = b"deserted-untie-orchid"


class LocalDataError(FileNotFoundError):
    """A local data file is missing or is not the expected file."""


def resolve_data_dir(data_dir: Optional[str] = None) -> Path:
    d = env.data_dir(data_dir)
    if d is None:
        raise LocalDataError(
            "local task needs a data directory: set MHAR_DATA_DIR (layout of shared/data) "
            "or pass data_dir to eval.run.evaluate_model"
        )
    return d.resolve()


def _resolve_files(data_files: dict[str, str], data_dir: Optional[str]) -> dict[str, str]:
    root = resolve_data_dir(data_dir)
    out = {}
    for split, rel in data_files.items():
        p = root / rel
        if not p.is_file():
            raise LocalDataError(
                f"split {split!r}: data file {p} not found (MHAR_DATA_DIR={root}); "
                f"see shared/data/MANIFEST.md for the expected layout"
            )
        out[split] = str(p)
    return out


def load_local_json(data_files: dict[str, str], data_dir: Optional[str] = None, **_: Any) -> datasets.DatasetDict:
    """JSONL files (one split each, paths relative to the data dir) -> DatasetDict."""
    return datasets.load_dataset("json", data_files=_resolve_files(data_files, data_dir))


def read_gpqa_csv(zip_path: str | os.PathLike, member: str, sha256: Optional[str] = None) -> bytes:
    """Decrypt one CSV member of the GPQA zip into memory (checked against ``sha256``)."""
    try:
        with zipfile.ZipFile(zip_path) as zf:
            raw = zf.read(member, pwd=GPQA_PASSWORD)
    except KeyError as e:
        raise LocalDataError(f"{zip_path}: no member {member!r} (expected the GPQA dataset.zip)") from e
    except RuntimeError as e:  # wrong password / encrypted differently
        raise LocalDataError(f"{zip_path}: cannot decrypt {member!r}: {e}") from e
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise LocalDataError(
            f"{zip_path}:{member}: sha256 {hashlib.sha256(raw).hexdigest()} != expected {sha256} "
            "(not the published GPQA file; see shared/data/MANIFEST.md)"
        )
    return raw


def gpqa_shuffled_choices(doc: dict, rng: random.Random) -> dict:
    """The stock ``gpqa/zeroshot/utils.py::process_docs`` fields for one row, with an explicit RNG."""
    choices = [
        _gpqa_preprocess(doc["Incorrect Answer 1"]),
        _gpqa_preprocess(doc["Incorrect Answer 2"]),
        _gpqa_preprocess(doc["Incorrect Answer 3"]),
        _gpqa_preprocess(doc["Correct Answer"]),
    ]
    rng.shuffle(choices)
    gold = choices.index(_gpqa_preprocess(doc["Correct Answer"]))
    return {"choice1": choices[0], "choice2": choices[1], "choice3": choices[2], "choice4": choices[3],
            "answer": f"({chr(65 + gold)})"}


GPQA_SEED = 0  # lm-eval's default random_seed: the stock order of a freshly seeded run


def _is_stock_gpqa_process_docs(fn: Any) -> bool:
    code = getattr(fn, "__code__", None)
    return (getattr(fn, "__name__", "") == "process_docs" and code is not None
            and Path(code.co_filename).as_posix().endswith("gpqa/zeroshot/utils.py"))


def seed_gpqa_choices(task: Any, seed: int = GPQA_SEED) -> bool:
    """Fix a loaded stock (hub) GPQA zero-shot task's answer order to the seeded stock order.

    The stock ``process_docs`` shuffles with the global RNG at whatever state it has when the docs
    are first read, and the ``datasets`` cache then freezes that order (two machines disagree).
    Here each split is shuffled once, in dataset order, with ``random.Random(seed)`` (the draws of
    a freshly seeded stock run, exactly what the local ``load_gpqa_zip`` does), kept in memory, and
    the task's ``process_docs`` is removed. Returns False (nothing changed) for any other task.
    """
    config = getattr(task, "config", None)
    if config is None or not _is_stock_gpqa_process_docs(getattr(config, "process_docs", None)):
        return False
    for split in list(task.dataset.keys()):
        rng = random.Random(seed)
        task.dataset[split] = task.dataset[split].map(lambda row: gpqa_shuffled_choices(row, rng),
                                                      load_from_cache_file=False, keep_in_memory=True)
    config.process_docs = None
    fewshot_cfg = getattr(task, "fewshot_cfg", None)
    if fewshot_cfg is not None and getattr(fewshot_cfg, "process_docs", None) is not None:
        fewshot_cfg.process_docs = None
    return True


def load_gpqa_zip(data_files: dict[str, str], zip_member: str, sha256: Optional[str] = None,
                  choice_shuffle_seed: int = 0, data_dir: Optional[str] = None, **_: Any) -> datasets.DatasetDict:
    """GPQA from the encrypted zip, in memory, with the answer order fixed once.

    lm-eval's stock ``process_docs`` shuffles the choices with the global RNG every
    time the docs are read; on an in-memory dataset that would reshuffle between
    building requests and scoring them. Here the shuffle is done once, in dataset
    order, with ``random.Random(choice_shuffle_seed)``: the same draws the stock
    code makes when the global RNG is freshly seeded with that seed, and the same
    order for every model (so per-question results pair up).
    """
    import pandas as pd  # the HF csv builder parses with pandas too (same dtypes)

    (split, rel), = data_files.items()
    zip_path = _resolve_files({split: rel}, data_dir)[split]
    frame = pd.read_csv(io.BytesIO(read_gpqa_csv(zip_path, zip_member, sha256)))
    ds = datasets.Dataset.from_pandas(frame, preserve_index=False)  # in memory, NaN -> null
    rng = random.Random(choice_shuffle_seed)
    extra = [gpqa_shuffled_choices(row, rng) for row in ds]
    for col in ("choice1", "choice2", "choice3", "choice4", "answer"):
        ds = ds.add_column(col, [e[col] for e in extra])
    return datasets.DatasetDict({split: ds})
