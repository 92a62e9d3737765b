"""``mhar-lm-eval``: lm-eval's own command line with the ``mhar`` model and our local task YAMLs.

    mhar-lm-eval --model mhar --model_args pretrained=RUN_DIR/model.pt,max_length=2048 \\
        --tasks lambada_openai,hellaswag --device cpu --batch_size 8 [--limit N] [--num_fewshot K] ...
    python -m eval.lm_eval_cli ...          # the same without the installed console script

Every flag and subcommand is lm-eval's (``lm_eval --help``; ``run`` is implied as in ``lm_eval``);
this wrapper only (1) registers ``--model mhar`` (``eval.adapter.MharLM``; lm-eval 0.4 does not
discover model plugins, so plain ``lm_eval --model mhar`` fails), and (2) when ``MHAR_DATA_DIR``
is set, adds ``eval/tasks`` as an include path: lm-eval's stock tasks stay registered, and the
local-mirror YAMLs win the five names they define (same prompts, data from that directory).
Your own folder(s) go in ``--include_path`` (several joined by ``:``, as lm-eval's help documents;
lm-eval 0.4.13's TaskManager does not split them, this wrapper does) and win over both: the same
registry ``python -m eval.run --tasks-dir`` uses. ``--output_path DIR --log_samples`` writes lm-eval's
``results_<date>.json`` / ``samples_<task>_<date>.jsonl``, the files ``eval.run`` also writes.
Without ``MHAR_DATA_DIR`` the stock hub tasks run. ``--model hf`` and every other lm-eval model work as in
``lm_eval``. Bad ``mhar`` model arguments, a missing checkpoint, a model whose vocabulary is smaller than its
tokenizer's, ``--device cuda`` where no GPU is visible (without ``--device`` the ``mhar`` model runs on the
GPU when one is visible, else on the CPU), ``--num_fewshot N`` for a local task without a few-shot split
(hellaswag, lambada_openai, wikitext, gpqa zero-shot; gsm8k has one), a task YAML of an ``--include_path`` folder
that ``mhar.safe_yaml`` refuses (over its size limit, aliases that expand) and, with ``--output_path``, a model path
whose lm-eval folder name (the whole path, '/' -> '__') exceeds the file-name limit give one ``error:`` line,
exit 2, before anything is evaluated.
For per-document files in our format (samples.jsonl / results.json) use ``python -m eval.run``.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from mhar.env import data_dir as _data_dir
from mhar.atomic import name_max

from .data_local import TASKS_DIR, _local_entry, _task_yaml, check_task_folders

_SUBCOMMANDS = ("run", "ls", "validate")


def cli_argv(argv: Sequence[str], data_dir: Optional[str]) -> list[str]:
    """lm-eval argv with the local task folder as the first include path when a data directory is set."""
    argv = list(argv)
    if not data_dir or not (not argv or argv[0] in _SUBCOMMANDS or argv[0].startswith("-")):
        return argv
    for i, a in enumerate(argv):  # the user's folders come after ours: theirs win a name
        if a == "--include_path" and i + 1 < len(argv):
            argv[i + 1] = os.pathsep.join([str(TASKS_DIR), argv[i + 1]])
            return argv
        if a.startswith("--include_path="):
            argv[i] = "--include_path=" + os.pathsep.join([str(TASKS_DIR), a.split("=", 1)[1]])
            return argv
    return argv + ["--include_path", str(TASKS_DIR)]


def split_include_paths() -> None:
    """Make lm-eval's TaskManager read ``--include_path a:b`` as two folders (the form lm-eval's ``ls`` and
    ``validate`` help documents; its 0.4.13 TaskManager takes the string as one path)."""
    import lm_eval.tasks  # lazy: lm-eval, once the command runs (not when imported)

    base = lm_eval.tasks.TaskManager
    if getattr(base, "_splits_include_path", False):
        return

    class TaskManager(base):
        _splits_include_path = True

        def __init__(self, *args, include_path=None, **kwargs):
            if isinstance(include_path, str) and os.pathsep in include_path:
                include_path = [p for p in include_path.split(os.pathsep) if p]
            super().__init__(*args, include_path=include_path, **kwargs)

    lm_eval.tasks.TaskManager = TaskManager


def _flag(argv: Sequence[str], *names: str) -> Optional[str]:
    """Value of the last ``--name V`` / ``--name=V`` among ``names`` in argv (None: absent)."""
    value = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(n + "="):
                value = a.split("=", 1)[1]
    return value


def mhar_device_argv(argv: Sequence[str]) -> tuple[list[str], Optional[str]]:
    """``--model mhar`` where no GPU is visible: (argv, None) with ``--device cpu`` added when no device is given
    (lm-eval's default ``cuda:0`` names a device that is not there), or (argv, the error line) for an explicit
    ``--device cuda...``: a GPU run asked for is refused, never run on the CPU."""
    from mhar.training.distributed import cuda_missing  # lazy: torch, as below (this module imports without it)

    argv = list(argv)
    if _flag(argv, "--model", "-M") != "mhar":
        return argv, None
    device = _flag(argv, "--device")
    if device is None:
        import torch  # lazy: torch, only to see whether a GPU is visible

        if _flag(argv, "--config", "-C") is None and not torch.cuda.is_available():  # a --config file may name one
            argv += ["--device", "cpu"]
        return argv, None
    return argv, cuda_missing(device, f"--device {device}", "--device cpu (or leave --device out)")


def local_fewshot_error(argv: Sequence[str]) -> Optional[str]:
    """Why ``--num_fewshot`` cannot be honoured by a requested local task (None: it can, or not asked)."""
    shots, tasks = _flag(argv, "--num_fewshot", "-f"), _flag(argv, "--tasks", "-t")
    include = _flag(argv, "--include_path")
    folders = [p for p in include.split(os.pathsep) if p] if include else [TASKS_DIR]
    try:
        if shots is None or int(shots) <= 0 or not tasks:
            return None
    except ValueError:
        return None  # lm-eval's parser reports it
    for task in (t.strip() for t in tasks.split(",")):
        if _local_entry(task, folders) is None:  # not one of our YAMLs (another folder's, or stock)
            continue
        cfg = _task_yaml(task)
        if cfg.get("output_type") == "loglikelihood_rolling" or cfg.get("num_fewshot") == 0 \
                or not (cfg.get("fewshot_split") or cfg.get("training_split")):
            return (f"task {task}: the local mirror has no few-shot split for it (or it is zero-shot / a "
                    f"perplexity task); --num_fewshot {shots} cannot be honoured. Drop --num_fewshot or unset "
                    "MHAR_DATA_DIR to use the hub task")
    return None


def _model_args(argv: Sequence[str]) -> dict:
    """``--model_args`` / ``-a`` as lm-eval reads them: ``key=val,key2=val2`` or several ``key=val`` words."""
    out: dict = {}
    for i, a in enumerate(argv):
        words = []
        if a in ("--model_args", "-a"):
            for w in argv[i + 1:]:
                if w.startswith("-"):
                    break
                words.append(w)
        elif a.startswith("--model_args="):
            words = [a.split("=", 1)[1]]
        for part in ",".join(words).split(","):
            key, sep, value = part.partition("=")
            if sep:
                out[key.strip()] = value.strip()
    return out


def output_name_error(argv: Sequence[str]) -> Optional[str]:
    """Why lm-eval could not write its files under ``--output_path`` (None: it can, or none is written): it names
    a folder after the whole model path ('/' -> '__'), and a name over the file system's limit fails only after
    the whole evaluation (lm-eval logs the failed write and goes on)."""
    out = _flag(argv, "--output_path", "-o")
    if not out:
        return None
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker  # lazy: lm-eval (as in main)
    from lm_eval.utils import sanitize_model_name

    name = GeneralConfigTracker._get_model_name(_model_args(argv))  # lm-eval's own rule (pretrained, path, ...)
    if not name:
        return None
    folder, limit = sanitize_model_name(name), name_max(out)
    n = len(folder.encode("utf-8", "surrogateescape"))
    if n <= limit:
        return None
    return (f"--model_args: lm-eval names its output folder after the whole model path ({n} bytes: "
            f"{folder[:40]}...), over the file system's limit of {limit} bytes for a file name under "
            f"--output_path, so it could not write its files after the evaluation; give the model by a shorter "
            "path (e.g. a symbolic link to its folder), or evaluate with python -m eval.run (which hashes that name)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    # lazy: lm-eval and torch load only when an evaluation runs; this module imports without them
    from lm_eval.__main__ import cli_evaluate

    from . import adapter  # noqa: F401  registers "mhar" with lm-eval's model registry; lazy: lm-eval, torch
    from mhar.runs.checkpoint import CheckpointError  # lazy: torch

    found = _data_dir()
    data_dir = str(found) if found is not None else None
    args = cli_argv(sys.argv[1:] if argv is None else argv, data_dir)
    args, err = mhar_device_argv(args)
    include = _flag(args, "--include_path")
    try:  # lm-eval's own loader reads every YAML of these folders: bounded first (mhar.safe_yaml)
        check_task_folders([p for p in include.split(os.pathsep) if p] if include else [])
    except ValueError as e:
        err = err or str(e)
    err = err or (local_fewshot_error(args) if data_dir else None) or output_name_error(args)
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    split_include_paths()
    old = sys.argv
    sys.argv = [old[0] if old else "mhar-lm-eval", *args]  # lm-eval's parser reads sys.argv
    try:
        cli_evaluate()
    except (CheckpointError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        if not str(e).startswith("MharLM:"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        sys.argv = old
    return 0


if __name__ == "__main__":
    sys.exit(main())
