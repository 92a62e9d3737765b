"""Evaluate one checkpoint on a list of lm-eval tasks, keeping every per-document result.

    python -m eval.run --model RUN_DIR/model.pt --tasks wikitext,lambada_openai,hellaswag,gsm8k,gpqa_main_zeroshot \\
        --out EVAL_DIR [--limit N | --subset first:N | --subset random:N:SEED] [--device cpu] [--batch-size N]
    python -m eval.run --model hf:<path or hub name> ...      # a Hugging Face checkpoint (lm-eval's HF model)

Python: ``evaluate_model(model_path, tasks, out_dir, subset="first:200", device="cpu")``.

Outputs per task (docs/ARCHITECTURE.md "Evaluation outputs"):
  ``OUT/<task>/samples.jsonl``  one line per document: doc_id, prompt_hash / target_hash / doc_hash
                                (lm-eval's fields and meanings), arguments_hash (sha256 of all request
                                arguments), target, metrics, responses (what the statistics read)
  ``OUT/<task>/results.json``   aggregate metrics with standard errors, n, subset, model, provenance
  ``OUT/<task>/lm_eval/<model>/results_<date>.json``, ``samples_<task>_<date>.jsonl``: lm-eval's own
                                files, written by lm-eval's EvaluationTracker exactly as
                                ``lm_eval --output_path OUT/<task>/lm_eval --log_samples`` writes them
                                (a ``<model>`` name over the file-name limit, where lm-eval would fail
                                after the evaluation, is hashed: ``records.fitting_model_folder``)
Tasks: lm-eval's stock registry, plus ``eval/tasks/`` (the local mirror's YAMLs, when a data directory is
set) and ``--tasks-dir DIR`` (your own YAMLs, any file names) as include paths; a later folder wins a name.
Data: the local mirror when ``MHAR_DATA_DIR`` (or ``data_dir``) is set, else the hub.
Each task is a separate lm-eval run, so its results do not depend on which other tasks are listed.
The CLI refuses (exit 2, one ``error:`` line) results of another model (other weights: the sha256 of
the model file is compared, not its path) or subset already in OUT, and bad input (missing / corrupt
checkpoint or one without its ``.sha256``, a model whose vocabulary is smaller than its tokenizer's,
``--device cuda`` where no GPU is visible, unknown task, bad subset, missing data files); the output folders are checked writable before the model
is loaded, and an OSError while writing (disk full, read-only) is one line too.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import inspect
import json
import logging
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from mhar.atomic import atomic_write_text, check_writable, clean_stale_temps, name_max, os_error_line
from mhar.runs.layout import run_info
from mhar.runs.provenance import collect_provenance

from .records import (LM_EVAL_DIR, aggregate_metrics, commit_lm_eval_files, drop_lm_eval_files,
                      fill_missing_stderrs, fitting_model_folder, jsonable, lm_eval_model, lm_eval_staging,
                      sample_records, task_name_problem, write_lm_eval_files)
from .data_local import STANDARD_TASKS, DataSource
from .task_setup import HubUnavailable, check_primary_metric, check_task, load_task
from .vocab import check_vocab

log = logging.getLogger("eval.run")
RESULTS_FILE = "results.json"
SAMPLES_FILE = "samples.jsonl"


# --- which documents ------------------------------------------------------------------
@dataclass(frozen=True)
class Subset:
    """``full`` | ``first:N`` (the paper's protocol: first N documents) | ``random:N:SEED``."""

    kind: str = "full"
    n: Optional[int] = None
    seed: Optional[int] = None

    @classmethod
    def parse(cls, spec: "Optional[str | Subset]") -> "Subset":
        if isinstance(spec, Subset):
            return spec
        if spec is None or spec == "full":
            return cls()
        parts = str(spec).split(":")
        try:
            if parts[0] == "first" and len(parts) == 2:
                sub = cls("first", int(parts[1]))
            elif parts[0] == "random" and len(parts) == 3:
                sub = cls("random", int(parts[1]), int(parts[2]))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"subset {spec!r}: expected 'full', 'first:N' or 'random:N:SEED' (N, SEED integers)"
            ) from None
        if sub.n is not None and sub.n < 1:
            raise ValueError(f"subset {spec!r}: N must be >= 1")
        return sub

    def __str__(self) -> str:
        return {"full": "full", "first": f"first:{self.n}", "random": f"random:{self.n}:{self.seed}"}[self.kind]

    def doc_ids(self, n_docs: int) -> list[int]:
        """Selected document indices (ascending) out of ``n_docs``; N is capped at ``n_docs``."""
        if self.kind == "full":
            return list(range(n_docs))
        n = min(self.n, n_docs)
        if self.kind == "first":
            return list(range(n))
        return sorted(random.Random(self.seed).sample(range(n_docs), n))


# --- the model ---------------------------------------------------------------------------
@dataclass
class ModelSpec:
    """``hf:<path or name>`` -> lm-eval's HF model; anything else -> our exported model.pt."""

    path: str
    device: str = "cpu"
    batch_size: int = 8
    max_length: Optional[int] = None
    dtype: Optional[str] = None

    @property
    def kind(self) -> str:
        return "hf" if self.path.startswith("hf:") else "mhar"

    def load(self):
        """Return ``(lm, info)``: an lm-eval LM and the settings that produced it."""
        from lm_eval.api.registry import get_model  # lazy: lm-eval (loads torch); this module imports without it

        if self.kind == "hf":
            args: dict[str, Any] = {"pretrained": self.path[3:], "dtype": self.dtype or "auto"}
            if self.max_length is not None:
                args["max_length"] = self.max_length
            try:
                lm = get_model("hf").create_from_arg_obj(args, {"batch_size": self.batch_size, "device": self.device})
            except OSError as e:  # not found locally nor on the hub (or offline)
                from mhar.runs.checkpoint import CheckpointError, load_error_brief  # lazy: torch (see _model_file)

                raise CheckpointError(f"--model {self.path}: could not load this Hugging Face model "
                                      f"({load_error_brief(e)}); check the directory or hub name and the "
                                      "network (HF_HUB_OFFLINE)") from e
            return lm, {"adapter": "hf", **args, "batch_size": self.batch_size, "device": self.device,
                        "max_length": lm.max_length}
        if not Path(self.path).exists():
            raise FileNotFoundError(no_checkpoint_message(str(self.path)))
        from .adapter import MharLM  # lazy: torch and lm-eval, only once an mhar model loads

        lm = MharLM(pretrained=self.path, device=self.device, batch_size=self.batch_size,
                    max_length=self.max_length, dtype=self.dtype)
        return lm, lm.describe()


def _atomic_write(path: Path, text: str) -> None:
    """Same-folder temp + fsync + rename; a killed write's temp file goes at the next start."""
    clean_stale_temps(path.parent)
    atomic_write_text(path, text)


def _provenance(config: dict) -> dict:
    return collect_provenance(config)


@contextlib.contextmanager
def _caller_rng_kept():
    """lm-eval reseeds python/numpy/torch RNGs; give the caller (e.g. a training loop) its state back."""
    import numpy as np  # lazy: as torch below, only around an evaluation
    import torch  # lazy: torch, only once a model is evaluated (bad input is refused first)

    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


# --- the model ------------------------------------------------------------------------
def _model_file(model_path: str) -> Optional[Path]:
    """The exported model file behind ``model_path`` (``RUN_DIR`` means ``RUN_DIR/model.pt``); None for hf:."""
    # lazy: mhar.runs.checkpoint imports torch; this module imports without it (`python -m eval.run --help`,
    # eval.cpt's table in the analysis environment)
    from mhar.runs.checkpoint import MODEL_FILE

    if str(model_path).startswith("hf:"):
        return None
    path = Path(model_path)
    return path / MODEL_FILE if path.is_dir() else path


def _batch_size_arg(text: str) -> int | str:
    """--batch-size: an integer, 'auto' or 'auto:N' (checked by eval.adapter when the model is built)."""
    if text.strip().lower().startswith("auto"):
        return text.strip().lower()
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer, 'auto' or 'auto:N'") from None


def no_checkpoint_message(model_path: str) -> str:
    """Why ``model_path`` has no model to evaluate: a run folder whose training has not finished says so, with
    its progress (read by mhar.runs.layout from the folder's own records); anything else is not a checkpoint."""
    path = _model_file(model_path)
    run = path.parent if path is not None else None
    if run is not None and (run / "config.yaml").is_file():
        info = run_info(run, run.parent, check_layout=False)
        progress = f"step {info.step if info.step is not None else 0} of {info.steps if info.steps else '?'}"
        todo = {"incomplete": "rerun its training command to finish it (it resumes from the last checkpoint)",
                "running": "its training is still running; evaluate it when it has finished",
                "diverged": "it diverged and has no model to evaluate"}.get(info.status)
        if todo:
            return f"--model {model_path}: run {info.status} ({progress}), no model.pt yet; {todo}"
    return f"--model {model_path}: no such checkpoint (expected RUN_DIR/model.pt or hf:<name>)"


def weights_sha256(model_path: str) -> Optional[str]:
    """sha256 of an exported model file, checked against its ``.sha256`` (CheckpointError when it fails or
    is missing: such a file is never evaluated); None for ``hf:`` models and paths that are not a file."""
    from mhar.runs.checkpoint import verify_sha256  # lazy: torch (see _model_file)

    path = _model_file(model_path)
    return verify_sha256(path) if path is not None and path.is_file() else None


def model_identity(model_path: str, lm: Any, sha: Optional[str] = None) -> dict:
    """``run`` (the exported model's run identity), ``display`` (its variant's display record, as summary.json
    records it: the tables name the variant by it, without the residual registry) and ``weights_sha256`` of an
    exported model. The display is the model's own (``extra.display``, written by mhar.train), else the
    registry's for the variant the model was built as (an imported released checkpoint)."""
    if str(model_path).startswith("hf:"):
        return {"run": None, "weights_sha256": None}
    extra = (getattr(lm, "blob", None) or {}).get("extra") or {}
    run = extra.get("run")
    out = {"run": run, "weights_sha256": sha if sha is not None else weights_sha256(model_path)}
    res = run.get("residual") if isinstance(run, dict) else None
    if isinstance(extra.get("display"), dict):
        out["display"] = extra["display"]
    elif isinstance(res, dict) and isinstance(res.get("variant"), str):
        from mhar.model.residuals import display_record  # lazy: torch (see _model_file); loaded with the model
        out["display"] = display_record(res["variant"])
    return out


def evaluate_task(lm, model_info: dict, task, task_name: str, source: DataSource, task_manager, subset: Subset,
                  out_dir: Path, bootstrap_iters: int = 100000, model_path: str = "",
                  identity: Optional[dict] = None, wandb_args: Optional[dict] = None) -> dict:
    """Run the loaded ``task`` (see :func:`load_task`) on the selected documents; write samples.jsonl and
    results.json. ``identity``: ``run`` + ``weights_sha256`` of the model (written into results.json).
    ``num_fewshot`` (set by load_task): None = the task's own setting; N is honoured when the task has a
    few-shot source (a fewshot or training split) and refused when it has none or is zero-shot by definition.
    GPQA's answer order is the seeded stock order on the hub path too. ``wandb_args`` (wandb.init arguments):
    the results and samples also go to Weights & Biases through lm-eval's own WandbLogger."""
    from lm_eval.evaluator import simple_evaluate  # lazy: lm-eval (loads torch); this module imports without it

    n_docs = len(task.eval_docs)
    doc_ids = subset.doc_ids(n_docs)
    kwargs: dict[str, Any] = {}
    if subset.kind == "first":
        kwargs["limit"] = len(doc_ids)
    elif subset.kind == "random":
        kwargs["samples"] = {task_name: doc_ids}
    from lm_eval.loggers import EvaluationTracker  # lazy: lm-eval (loads torch); this module imports without it

    lm_name, lm_args = lm_eval_model(model_info, model_path, lm)
    task_dir = Path(out_dir) / task_name
    staging = lm_eval_staging(task_dir)
    tracker = EvaluationTracker(output_path=str(staging))
    t0 = time.time()
    res = simple_evaluate(model=lm, model_args=lm_args, tasks=[task], log_samples=True,
                          bootstrap_iters=bootstrap_iters, task_manager=task_manager, evaluation_tracker=tracker,
                          batch_size=model_info.get("batch_size"), device=model_info.get("device"), **kwargs)
    wall = time.time() - t0
    for_wandb = copy.deepcopy(res) if wandb_args else None  # lm-eval's file writers below change res in place
    # what `lm_eval --model <name> --model_args ...` records (simple_evaluate, given a built LM, records its class)
    res["config"]["model"] = lm_name
    tracker.general_config_tracker.model_source = lm_name
    # lm-eval names the model's folder after the whole model path: one longer than a file name may be is hashed
    named = str(tracker.general_config_tracker.model_name_sanitized)
    fitting = fitting_model_folder(named, name_max(task_dir))
    if fitting != named:
        log.info("lm-eval's folder name for %s is %d bytes, over the file-name limit: its files go to %s/%s/",
                 model_path, len(named.encode()), LM_EVAL_DIR, fitting)
        tracker.general_config_tracker.model_name_sanitized = fitting
    metadata = getattr(task.config, "metadata", None) or {}
    records = sample_records(res["samples"][task_name], task.OUTPUT_TYPE, metadata.get("cluster_field"))
    got = [r["doc_id"] for r in records]
    if got != doc_ids:
        raise RuntimeError(f"task {task_name}: lm-eval evaluated documents {got[:10]}... not the selection {doc_ids[:10]}...")

    # and against what lm-eval produced, before a record the tables read is written
    check_primary_metric(task_name, metadata, list(res["results"][task_name]), metadata.get("config_source") or "")
    metrics = aggregate_metrics(res["results"][task_name])
    stderr_source = fill_missing_stderrs(metrics, res["samples"][task_name], task.aggregation(), bootstrap_iters)

    # lm-eval's own files (its save functions rewrite the logged samples in place: ours are built above)
    lm_eval_dir = task_dir / LM_EVAL_DIR
    lm_eval_files = write_lm_eval_files(tracker, res, task_name, staging, lm_eval_dir)
    try:
        summary = _write_task_records(task_dir, records, lm_eval_files, task, task_name, res, metrics, stderr_source, wall,
                            n_docs, doc_ids, subset, source, model_path, model_info, identity, bootstrap_iters)
    except BaseException:  # the previous record (if any) still names its own lm-eval files: keep those, not ours
        drop_lm_eval_files(lm_eval_dir, lm_eval_files.values())
        raise
    commit_lm_eval_files(lm_eval_dir, lm_eval_files.values())
    if wandb_args:  # as `lm_eval --wandb_args ...` does, after our records are complete
        from lm_eval.loggers import WandbLogger

        samples = for_wandb.pop("samples")
        wandb_logger = WandbLogger(dict(wandb_args))
        wandb_logger.post_init(for_wandb)
        wandb_logger.log_eval_result()
        wandb_logger.log_eval_samples(samples)
        wandb_logger.run.finish()
    return summary


def _write_task_records(task_dir, records, lm_eval_files, task, task_name, res, metrics, stderr_source, wall,
                        n_docs, doc_ids, subset, source, model_path, model_info, identity, bootstrap_iters):
    """samples.jsonl, then results.json (the record: written last, atomically)."""
    import lm_eval  # lazy: lm-eval (loads torch); this module imports without it

    _atomic_write(task_dir / SAMPLES_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    settings = {"task": task_name, "model": model_path, "subset": str(subset), "bootstrap_iters": bootstrap_iters,
                "data_source": source.describe(), "model_info": model_info}
    summary = {
        "task": task_name,
        "model": model_path,
        **(identity or {}),  # run identity and weights_sha256 of an exported model
        "model_kind": model_info.get("adapter"),
        "metrics": metrics,
        "stderr_source": stderr_source,
        "higher_is_better": jsonable(res.get("higher_is_better", {}).get(task_name, {})),
        "n": len(records),
        "n_docs_total": n_docs,
        "subset": {"spec": str(subset), **asdict(subset)},
        "doc_ids": doc_ids,
        "num_fewshot": jsonable(res.get("n-shot", {}).get(task_name)),
        "output_type": task.OUTPUT_TYPE,
        "data_source": source.describe(),
        "data_files": source.file_hashes(task_name),
        "model_info": jsonable(model_info),
        "bootstrap_iters": bootstrap_iters,
        "wall_s": round(wall, 3),
        "lm_eval": {"version": lm_eval.__version__, "results": jsonable(res["results"][task_name]),
                    "version_of_task": jsonable(res.get("versions", {}).get(task_name)),
                    "config": jsonable(res.get("configs", {}).get(task_name))},
        "samples_file": SAMPLES_FILE,
        "lm_eval_files": lm_eval_files,  # lm-eval's results_<date>.json / samples_<task>_<date>.jsonl
        "provenance": _provenance(settings),
    }
    _atomic_write(task_dir / RESULTS_FILE, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


# --- public entry points ------------------------------------------------------------------
def evaluate_model(model_path: str | os.PathLike, tasks: Sequence[str] | str, out_dir: str | os.PathLike,
                   subset: Optional[str | Subset] = None, device: Optional[str] = None, batch_size: int = 8,
                   limit: Optional[int] = None, max_length: Optional[int] = None, dtype: Optional[str] = None,
                   bootstrap_iters: int = 100000, data_dir: Optional[str | os.PathLike] = None,
                   lm: Any = None, overwrite: bool = False, num_fewshot: Optional[int] = None,
                   tasks_dir: Optional[str | os.PathLike] = None,
                   wandb_args: Optional[str | dict] = None) -> dict[str, dict]:
    """Evaluate one checkpoint on ``tasks``; returns ``{task: results.json content}``.

    ``model_path``: an exported ``model.pt`` (or its run dir) or ``hf:<path or name>``.
    ``subset``: ``None``/``"full"``, ``"first:N"``, ``"random:N:SEED"``; ``limit=N`` means ``first:N``.
    ``data_dir``: local mirror (default ``MHAR_DATA_DIR``; unset -> Hugging Face hub).
    ``lm``: an already-built lm-eval LM to use instead of loading ``model_path`` (e.g. an
    in-memory ``MharLM.from_model``); ``model_path`` is then only recorded.
    ``num_fewshot``: few-shot examples per prompt (None: each task's default; refused where the task
    has no few-shot split).
    ``tasks_dir``: a folder of your own lm-eval task YAMLs (any file names; a task is found by its
    ``task:`` name), an include path on top of the stock tasks and ``eval/tasks``.
    ``overwrite``: replace results of another model or subset already in ``out_dir`` (default: refuse
    with ``FileExistsError`` before anything runs; results of the same model and subset are redone).
    ``wandb_args``: lm-eval's ``--wandb_args`` (``key=val,key2=val2`` or a dict of wandb.init arguments):
    each task's results and samples are logged to Weights & Biases by lm-eval's WandbLogger.
    """
    if limit is not None and subset is not None:
        raise ValueError("give either limit or subset, not both (limit=N is subset='first:N')")
    sub = Subset.parse(f"first:{int(limit)}" if limit is not None else subset)
    task_list = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    if not task_list:
        raise ValueError("no tasks given (e.g. --tasks wikitext,lambada_openai)")
    from mhar.training.distributed import cuda_missing  # lazy: torch (see _model_file)

    missing = cuda_missing(device, f"--device {device}", "--device cpu (or leave --device out)")
    if missing:  # not a silent fall-back to the CPU: a GPU run was asked for
        raise ValueError(missing)
    wandb_args = _wandb_args(wandb_args)
    path_file = _model_file(str(model_path))
    sha = weights_sha256(str(model_path))  # refuses a model without (or failing) its checksum, before anything
    conflict = None if overwrite else existing_results_conflict(out_dir, ",".join(task_list), str(model_path), sub,
                                                                 sha)
    if conflict:
        raise FileExistsError(conflict)
    if lm is None and path_file is not None and not path_file.is_file():
        raise FileNotFoundError(no_checkpoint_message(str(model_path)))
    if device is None:
        import torch  # lazy: torch, only once a model is evaluated (bad input is refused first)

        device = "cuda" if torch.cuda.is_available() else "cpu"
    source = DataSource.from_env(data_dir, tasks_dir)
    with _caller_rng_kept():  # model building and lm-eval consume / reseed the global RNGs
        tm = source.task_manager()
        for name in task_list:  # every task name and data file is checked before anything is loaded
            check_task(name, source, tm)
            problem = task_name_problem(name, name_max(out_dir))
            if problem:
                raise ValueError(problem)
        created: list[Path] = []
        try:
            for name in task_list:  # a read-only or full output location fails now, not after the evaluation
                created += check_writable(Path(out_dir) / name) or []
            if lm is None:
                lm, info = ModelSpec(str(model_path), device, batch_size, max_length, dtype).load()
            else:
                info = lm.describe() if hasattr(lm, "describe") else {"adapter": type(lm).__name__}
            check_vocab(getattr(lm, "model", None), getattr(lm, "tokenizer", None), f"--model {model_path}")
            identity = model_identity(str(model_path), lm, sha)
            # every task is loaded (few-shot settings checked) before any result is written
            tasks = {name: load_task(name, source, tm, num_fewshot) for name in task_list}
        except BaseException:
            for c in sorted(created, key=lambda c: -len(c.parts)):  # refused: leave no empty folders behind
                try:
                    c.rmdir()
                except OSError:
                    pass
            raise
        out = {}
        for name in task_list:
            log.info("evaluating %s on %s (%s, %s)", model_path, name, sub, source.describe())
            out[name] = evaluate_task(lm, info, tasks[name], name, source, tm, sub, Path(out_dir), bootstrap_iters,
                                      str(model_path), identity, wandb_args)
    return out


def _wandb_args(value: Optional[str | dict]) -> Optional[dict]:
    """``--wandb-args`` as wandb.init arguments (lm-eval's ``key=val,key2=val2``); ValueError when wandb is missing."""
    if not value:
        return None
    if importlib.util.find_spec("wandb") is None:
        raise ValueError("--wandb-args: wandb is not installed; pip install wandb (or pip install -e '.[track]')")
    import wandb  # lazy: optional wandb, only with --wandb

    if isinstance(value, dict):
        parsed = dict(value)
    else:
        # lazy: lm-eval (loads torch); this module imports without it
        from lm_eval.utils import simple_parse_args_string

        parts = [p for p in value.replace(" ", ",").split(",") if p]
        bad = [p for p in parts if "=" not in p]
        if bad:
            raise ValueError(f"--wandb-args {value!r}: expected key=val,key2=val2 (wandb.init arguments), got {bad[0]!r}")
        parsed = simple_parse_args_string(",".join(parts))
    known = inspect.signature(wandb.init).parameters
    unknown = [k for k in parsed if k not in known]
    if unknown:  # found now, not after the evaluation
        raise ValueError(f"--wandb-args: {', '.join(unknown)} is not an argument of wandb.init")
    return parsed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="RUN_DIR/model.pt or hf:<path or hub name>")
    p.add_argument("--tasks", required=True, help=f"comma-separated, e.g. {','.join(STANDARD_TASKS)}")
    p.add_argument("--out", required=True, help="output dir; writes OUT/<task>/{results.json,samples.jsonl} and "
                   "lm-eval's own files under OUT/<task>/lm_eval/")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--limit", type=int, help="first N documents (same as --subset first:N)")
    sel.add_argument("--subset", help="full | first:N | random:N:SEED")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--batch-size", type=_batch_size_arg, default=8,
                   help="sequences per forward, or auto / auto:N (the largest that fits, found again N times over a "
                        "run, as lm-eval's --batch_size auto); default 8")
    p.add_argument("--max-length", type=int, default=None, help="context length (default: the model's training context)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: as stored / HF auto)")
    p.add_argument("--num-fewshot", "--num_fewshot", type=int, default=None,
                   help="few-shot examples per prompt (default: each task's own; refused where no few-shot split)")
    p.add_argument("--bootstrap-iters", type=int, default=100000, help="lm-eval bootstrap draws for stderrs (0: none)")
    p.add_argument("--data-dir", default=None, help="local data mirror (default: $MHAR_DATA_DIR; unset: hub)")
    p.add_argument("--wandb-args", "--wandb_args", default=None, metavar="KEY=VAL,...",
                   help="log results and samples to Weights & Biases through lm-eval's WandbLogger: wandb.init "
                        "arguments as lm-eval's --wandb_args, e.g. project=mhar,mode=offline")
    p.add_argument("--tasks-dir", default=None,
                   help="folder of your own lm-eval task YAMLs (any file names), added to the stock tasks")
    return p


def _same_model(a: str, b: str) -> bool:
    """Same ``hf:`` name, or the same exported file (``RUN_DIR`` and ``RUN_DIR/model.pt`` are one)."""
    if a.startswith("hf:") or b.startswith("hf:"):
        return a == b
    pa, pb = Path(a), Path(b)
    pa, pb = (p / "model.pt" if p.is_dir() else p for p in (pa, pb))
    return pa.resolve() == pb.resolve()


def existing_results_conflict(out_dir: str | os.PathLike, tasks: str, model: str, subset: Subset,
                              sha: Optional[str] = None) -> Optional[str]:
    """Why writing into ``out_dir`` would replace results of another model or subset (None: it would not).

    An exported model is identified by its weights (``sha``, the model file's sha256, against the recorded
    ``weights_sha256``), not by its path: a model retrained at the same path is another model, and a copy of
    the same file elsewhere is the same one. Records without a hash fall back to the path."""
    for name in (t.strip() for t in tasks.split(",") if t.strip()):
        path = Path(out_dir) / name / RESULTS_FILE
        if not path.is_file():
            continue
        try:
            old = json.loads(path.read_text())
            old_sha = old.get("weights_sha256")
            old_spec = old.get("subset", {}).get("spec")
            if old_sha and sha:
                same_model = old_sha == sha
                if not same_model and _same_model(old.get("model", ""), model):
                    return (f"{path} holds results of {model} with other weights (sha256 {old_sha[:12]}... then, "
                            f"{sha[:12]}... now: the model was retrained or replaced); refusing to overwrite them. "
                            "Evaluate into another --out (or move the old results aside first).")
            else:
                same_model = _same_model(old.get("model", ""), model)
            same = same_model and old_spec == str(subset)
        except (OSError, ValueError, AttributeError):
            same = False
        if not same:
            return (f"{path} already holds results of another model or subset; refusing to overwrite it. "
                    "Choose another output directory (--out) or delete that one (Python: overwrite=True).")
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from mhar.runs.checkpoint import CheckpointError  # lazy: torch, after --help has been answered

    try:
        results = evaluate_model(args.model, args.tasks, args.out, subset=args.subset, limit=args.limit,
                                 device=args.device, batch_size=args.batch_size, max_length=args.max_length,
                                 dtype=args.dtype, bootstrap_iters=args.bootstrap_iters, data_dir=args.data_dir,
                                 num_fewshot=args.num_fewshot, tasks_dir=args.tasks_dir, wandb_args=args.wandb_args)
    except (CheckpointError, HubUnavailable, FileNotFoundError, FileExistsError, KeyError, ValueError) as e:
        # bad input (model file, task name, data dir, subset, adapter setting, results of another model in
        # --out): one line, no traceback
        if isinstance(e, OSError) and e.errno is not None:  # raised by the OS, not by our checks
            print("error: " + os_error_line(e, "evaluation"), file=sys.stderr)
            return 2
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, read-only or forbidden output: results already written stay as they are
        print("error: " + os_error_line(e, "evaluation", f"results already complete in {args.out} are kept"),
              file=sys.stderr)
        return 2
    for name, summary in results.items():
        shown = ", ".join(f"{k}={v:.4g}" for k, v in summary["metrics"].items()
                          if isinstance(v, (int, float)) and "_stderr" not in k)
        print(f"{name} (n={summary['n']}): {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
