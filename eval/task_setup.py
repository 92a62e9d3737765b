"""One lm-eval task made ready for ``eval.run``: checked before anything runs (its local data there, its name known,
its declared primary metric one it produces, a ``--num-fewshot`` it can honour), then loaded (GPQA's answer order
seeded)."""
from __future__ import annotations

from typing import Optional, Sequence

from .data_local import STANDARD_TASKS, DataSource, unknown_task_message


class HubUnavailable(RuntimeError):
    """A task's Hugging Face hub dataset could not be loaded (offline, wrong name)."""


def check_fewshot(task, task_name: str, num_fewshot: int, source: DataSource) -> None:
    """Refuse a ``num_fewshot`` that the task cannot honour (instead of lm-eval silently ignoring it)."""
    if num_fewshot < 0:
        raise ValueError(f"--num-fewshot {num_fewshot}: must be >= 0")
    if num_fewshot == 0:
        return
    cfg = task.config
    if task.OUTPUT_TYPE == "loglikelihood_rolling":
        raise ValueError(f"task {task_name}: a perplexity task takes no few-shot examples; drop --num-fewshot")
    if getattr(cfg, "num_fewshot", None) == 0 and "zeroshot" in task_name:
        raise ValueError(f"task {task_name}: zero-shot by definition (its config pins num_fewshot: 0); "
                         "drop --num-fewshot")
    fs = getattr(task, "fewshot_cfg", None)
    has_source = any(x is not None for x in (getattr(cfg, "fewshot_split", None), getattr(cfg, "training_split", None),
                                             getattr(fs, "split", None), getattr(fs, "samples", None)))
    if not has_source:
        where = "the local mirror holds no training split for it" if source.is_local else "it has no training split"
        raise ValueError(f"task {task_name}: no few-shot split ({where}); --num-fewshot {num_fewshot} cannot be "
                         "honoured without drawing examples from the evaluated documents. Drop --num-fewshot"
                         + (" or unset MHAR_DATA_DIR to use the hub task" if source.is_local else ""))


def check_primary_metric(task_name: str, metadata: Optional[dict], produced: Sequence[str], source: str = "") -> None:
    """ValueError when the task's ``metadata: primary_metric`` (the metric the tables compare) is not one of the
    metrics it produces (``produced``: its aggregation's names, or lm-eval's result keys ``acc,none``): the tables
    would compare another metric in its place."""
    want = (metadata or {}).get("primary_metric")
    names = list(dict.fromkeys(str(m).split(",")[0] for m in produced
                               if "_stderr" not in str(m) and str(m) != "alias"))  # lm-eval's row label
    if want is not None and want not in names:
        raise ValueError(f"task {task_name}: metadata.primary_metric {want!r} is not a metric it produces "
                         f"({', '.join(names) or 'none'}); name one of those{' in ' + source if source else ''}")


def check_task(task_name: str, source: DataSource, task_manager) -> None:
    """FileNotFoundError / KeyError for a task that cannot run (checked for every task first)."""
    missing = source.missing_files(task_name)
    if missing:
        raise FileNotFoundError(
            f"task {task_name}: local data missing: {', '.join(map(str, missing))} "
            f"({source.describe()}); see shared/data/MANIFEST.md, or unset MHAR_DATA_DIR to use the hub"
        )
    if task_name not in task_manager.all_tasks:
        raise KeyError(unknown_task_message(task_name, task_manager.all_tasks, source.include_paths()))


def load_task(task_name: str, source: DataSource, task_manager, num_fewshot: Optional[int] = None):
    """The lm-eval task object (after ``check_task``), ready to run: GPQA's answer order seeded, and
    ``num_fewshot`` honoured or refused (ValueError) where the task has no few-shot source."""
    try:
        task = task_manager.load([task_name])["tasks"][task_name]
    except Exception as e:
        if source.task_yaml(task_name) is not None:  # a local-mirror or user YAML: its own error
            raise
        hint = (f"it is not one of the local mirror's tasks ({', '.join(STANDARD_TASKS)}), so it reads the hub"
                if source.is_local else "offline? set MHAR_DATA_DIR to the local mirror (layout of shared/data)")
        raise HubUnavailable(f"task {task_name}: could not load its dataset ({type(e).__name__}: {e}); {hint}") from e
    from .tasks.utils import seed_gpqa_choices  # lazy: lm-eval and datasets, needed only once a task loads

    seed_gpqa_choices(task)  # before any read of the docs (local tasks are seeded in their loader)
    metadata = getattr(task.config, "metadata", None) or {}
    # the declared metric against the metrics the task config computes, before anything runs
    check_primary_metric(task_name, metadata, list(task.aggregation()), metadata.get("config_source") or "")
    if num_fewshot is not None:
        check_fewshot(task, task_name, num_fewshot, source)
        task.set_config(key="num_fewshot", value=num_fewshot)
    return task
