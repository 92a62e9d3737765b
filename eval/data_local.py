"""Where evaluation data and task definitions come from.

Task names resolve through lm-eval's own registry (``lm_eval.tasks.TaskManager``): the stock tasks
always, plus include paths on top (later folders win a name): ``eval/tasks/`` when a data directory is
set (layout of ``shared/data``, see its MANIFEST.md; same names and prompts as the stock tasks, data read
from that directory), then the user's ``tasks_dir`` (any file names: a task is found by its ``task:``
name). Without a data directory the stock tasks load their Hugging Face hub datasets. ``mhar-lm-eval``
(lm-eval's CLI) sees the same registry (``eval.lm_eval_cli``).
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import yaml

from mhar import env
from mhar.safe_yaml import YAMLRefused, check_yaml_file, yaml_error_line

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
# The tasks this project evaluates (docs/ARCHITECTURE.md "Evaluation outputs").
STANDARD_TASKS = ("wikitext", "lambada_openai", "hellaswag", "gsm8k", "gpqa_main_zeroshot")


class _ExpectedOverrides(logging.Filter):
    """Drops lm-eval's warning that a YAML of ``eval/tasks`` overrides the stock task of the same name: that
    is what the local mirror is for (an override by the user's own folder is still reported)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not ("overrides existing task" in str(record.msg) and len(args) > 1 and args[1] is not None
                    and Path(args[1]).resolve().parent == TASKS_DIR)


def check_task_folders(folders: Sequence[str | os.PathLike]) -> None:
    """Every YAML under the task folders through mhar.safe_yaml's bounds (size, aliases) before lm-eval's own
    loader, which has none, reads it: a refused file is one ValueError line naming it (one lm-eval cannot parse
    is left to lm-eval, as before)."""
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", ".ipynb_checkpoints"))
            for name in sorted(files):
                if not name.endswith((".yaml", ".yml")):
                    continue
                path = Path(root, name)
                try:
                    check_yaml_file(path)
                except YAMLRefused as e:
                    raise ValueError(f"task YAML {path}: {yaml_error_line(e)} (fix it, or move it out of "
                                     f"{folder})") from None
                except (yaml.YAMLError, OSError):
                    pass


def _task_manager(**kwargs):
    from lm_eval.tasks import TaskManager  # lazy: lm-eval (loads torch); this module imports without it

    check_task_folders(kwargs.get("include_path") or ())

    index_log = logging.getLogger("lm_eval.tasks._index")
    quiet = _ExpectedOverrides()
    index_log.addFilter(quiet)
    try:
        return TaskManager(**kwargs)
    finally:
        index_log.removeFilter(quiet)


@functools.lru_cache(maxsize=8)
def _include_index(folders: tuple[str, ...]) -> dict:
    """lm-eval's index (name -> ``Entry``) of the YAMLs in ``folders`` alone (later folders win a name)."""
    return dict(_task_manager(include_path=list(folders), include_defaults=False).task_index) if folders else {}


@functools.lru_cache(maxsize=4)
def _registry(folders: tuple[str, ...], data_dir: Optional[str]):
    """lm-eval's TaskManager: the stock tasks plus ``folders`` as include paths (one per process and setting:
    indexing the stock tasks takes seconds)."""
    return _task_manager(include_path=list(folders) or None, include_defaults=True,
                         metadata={"data_dir": data_dir} if data_dir else None)


def local_task_names() -> list[str]:
    """Names of the local-mirror tasks in ``eval/tasks/`` (their ``task:`` keys)."""
    return sorted(_include_index((str(TASKS_DIR),)))


def _local_entry(task: str, folders: Sequence[str | os.PathLike] = (TASKS_DIR,)):
    """The index entry of ``task`` when one of our local-mirror YAMLs (``eval/tasks/``) defines it among
    ``folders`` (None: another folder's YAML, or a stock task, defines it)."""
    entry = _include_index(tuple(str(f) for f in folders)).get(task)
    path = getattr(entry, "yaml_path", None)
    return entry if path is not None and Path(path).resolve().parent == TASKS_DIR else None


def _task_yaml(task: str) -> dict:
    from lm_eval.tasks._yaml_loader import load_yaml  # lazy: lm-eval (loads torch); this module imports without it

    entry = _local_entry(task)
    if entry is None:
        raise KeyError(
            f"task {task!r} has no local-mirror YAML in {TASKS_DIR}; local tasks: {', '.join(local_task_names())}"
        )
    return load_yaml(entry.yaml_path, resolve_func=False)


def unknown_task_message(task_name: str, known: Sequence[str], include_paths: Sequence[str | os.PathLike] = (),
                         where: Optional[str] = None) -> str:
    """One line: the unknown name (and the config key naming it), where it was looked up, the closest names."""
    looked = "lm-eval's stock tasks" + "".join(f" + {p}" for p in include_paths)
    close = difflib.get_close_matches(task_name, known, n=3, cutoff=0.75)
    hint = f"did you mean {' / '.join(close)}? " if close else ""
    return (f"{where + ': ' if where else ''}unknown task {task_name!r} (looked up in {looked}); {hint}list the names "
            "with `mhar-lm-eval ls tasks`, or put its YAML into a tasks_dir (--tasks-dir)")


def unknown_tasks(names: Sequence[str], tasks_dir: Optional[str | os.PathLike] = None) -> list[str]:
    """The names among ``names`` that lm-eval's registry (stock tasks + ``eval/tasks`` + ``tasks_dir``) does
    not know. Names defined in the include folders are answered from those folders alone (fast); the stock
    index (seconds to build) is read only for the rest. The local-mirror tasks carry stock names, so a name
    they define is known with or without a data directory."""
    folders = tuple(str(f) for f in (TASKS_DIR, tasks_dir) if f)
    rest = [n for n in names if n not in _include_index(folders)]
    if not rest:
        return []
    known = set(_registry(folders, None).all_tasks)
    return [n for n in rest if n not in known]


def registered_names(tasks_dir: Optional[str | os.PathLike] = None) -> list[str]:
    """Every name lm-eval's registry knows with ``eval/tasks`` and ``tasks_dir`` included."""
    return _registry(tuple(str(f) for f in (TASKS_DIR, tasks_dir) if f), None).all_tasks


def required_files(task: str) -> dict[str, str]:
    """Split -> data file (relative to the data dir) that the local task ``task`` reads."""
    return dict(_task_yaml(task).get("dataset_kwargs", {}).get("data_files", {}))


@dataclass(frozen=True)
class DataSource:
    """``data_dir=None`` means the Hugging Face hub for the stock tasks; ``tasks_dir``: the user's own task
    YAMLs (an include path on top of the stock and local-mirror tasks)."""

    data_dir: Optional[Path] = None
    tasks_dir: Optional[Path] = None

    @classmethod
    def from_env(cls, data_dir: Optional[str | os.PathLike] = None,
                 tasks_dir: Optional[str | os.PathLike] = None) -> "DataSource":
        tdir = None
        if tasks_dir not in (None, ""):
            tdir = Path(tasks_dir).expanduser().resolve()
            if not tdir.is_dir():
                raise FileNotFoundError(f"tasks directory {tdir} (--tasks-dir / tasks_dir) does not exist; point it "
                                        "at a folder of lm-eval task YAMLs")
        d = env.data_dir(data_dir)  # the documented default $MHAR_DATA_DIR is read in mhar.env only
        if d is None:
            return cls(None, tdir)
        p = d.resolve()
        if not p.is_dir():
            raise FileNotFoundError(
                f"data directory {p} (MHAR_DATA_DIR / data_dir) does not exist; unset it to use the hub"
            )
        return cls(p, tdir)

    @property
    def is_local(self) -> bool:
        return self.data_dir is not None

    def describe(self) -> str:
        where = f"local:{self.data_dir}" if self.is_local else "hub"
        return where + (f" + tasks:{self.tasks_dir}" if self.tasks_dir else "")

    def include_paths(self) -> list[str]:
        """lm-eval include paths on top of the stock tasks, in precedence order (a later folder wins a name)."""
        return [str(p) for p in ((TASKS_DIR if self.is_local else None), self.tasks_dir) if p is not None]

    def task_yaml(self, task: str) -> Optional[Path]:
        """The YAML of ``task`` when an include path (not the stock registry) defines it."""
        entry = _include_index(tuple(self.include_paths())).get(task)
        return Path(entry.yaml_path) if getattr(entry, "yaml_path", None) is not None else None

    def is_local_task(self, task: str) -> bool:
        """Whether ``task`` resolves to one of our local-mirror YAMLs (which read files of the data dir)."""
        return self.is_local and _local_entry(task, self.include_paths()) is not None

    def missing_files(self, task: str) -> list[Path]:
        """Local files that ``task`` needs and that are absent ([] on the hub and for other tasks)."""
        if not self.is_local_task(task):
            return []
        return [self.data_dir / rel for rel in required_files(task).values() if not (self.data_dir / rel).is_file()]

    def file_hashes(self, task: str) -> dict[str, dict]:
        """Provenance of the local files ``task`` read: relative path -> {bytes, sha256}."""
        if not self.is_local_task(task):
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
        """lm-eval's TaskManager for this source: the stock registry plus :meth:`include_paths` (exactly what
        ``lm_eval --include_path`` builds), with ``data_dir`` in the task metadata for the local loaders."""
        return _registry(tuple(self.include_paths()), str(self.data_dir) if self.is_local else None)
