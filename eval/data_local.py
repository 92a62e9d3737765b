"""Where evaluation data come from: the local mirror (``MHAR_DATA_DIR``) or the hub.

With a data directory (layout of ``shared/data``, see its MANIFEST.md) the tasks
are the YAMLs in ``eval/tasks/`` (same names and prompts as lm-eval's stock
tasks, data read from that directory). Without one, lm-eval's stock tasks load
their Hugging Face hub datasets.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mhar import env

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
# The tasks this project evaluates (docs/ARCHITECTURE.md "Evaluation outputs").
STANDARD_TASKS = ("wikitext", "lambada_openai", "hellaswag", "gsm8k", "gpqa_main_zeroshot")


def local_task_names() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


def _task_yaml(task: str) -> dict:
    from lm_eval.tasks._yaml_loader import load_yaml

    path = TASKS_DIR / f"{task}.yaml"
    if not path.is_file():
        raise KeyError(
            f"task {task!r} has no local-mirror YAML in {TASKS_DIR}; local tasks: {', '.join(local_task_names())}"
        )
    return load_yaml(path, resolve_func=False)


def required_files(task: str) -> dict[str, str]:
    """Split -> data file (relative to the data dir) that the local task ``task`` reads."""
    return dict(_task_yaml(task).get("dataset_kwargs", {}).get("data_files", {}))


@dataclass(frozen=True)
class DataSource:
    """``data_dir=None`` means the Hugging Face hub (lm-eval's stock tasks)."""

    data_dir: Optional[Path] = None

    @classmethod
    def from_env(cls, data_dir: Optional[str | os.PathLike] = None) -> "DataSource":
        d = env.data_dir(data_dir)  # the documented default $MHAR_DATA_DIR is read in mhar.env only
        if d is None:
            return cls(None)
        p = d.resolve()
        if not p.is_dir():
            raise FileNotFoundError(
                f"data directory {p} (MHAR_DATA_DIR / data_dir) does not exist; unset it to use the hub"
            )
        return cls(p)

    @property
    def is_local(self) -> bool:
        return self.data_dir is not None

    def describe(self) -> str:
        return f"local:{self.data_dir}" if self.is_local else "hub"

    def missing_files(self, task: str) -> list[Path]:
        """Local files that ``task`` needs and that are absent ([] on the hub)."""
        if not self.is_local:
            return []
        return [self.data_dir / rel for rel in required_files(task).values() if not (self.data_dir / rel).is_file()]

    def file_hashes(self, task: str) -> dict[str, dict]:
        """Provenance of the local files ``task`` read: relative path -> {bytes, sha256}."""
        if not self.is_local:
            return {}
        out = {}
        for rel in required_files(task).values():
            p = self.data_dir / rel
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[rel] = {"bytes": p.stat().st_size, "sha256": h.hexdigest()}
        return out

    def task_manager(self):
        """An lm-eval TaskManager that resolves task names for this source."""
        from lm_eval.tasks import TaskManager

        if self.is_local:
            return TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                               metadata={"data_dir": str(self.data_dir)})
        return TaskManager()
