"""Per-task records from lm-eval's output: our per-document ``samples.jsonl`` rows and aggregate metrics
(what the statistics read), and lm-eval's own output files, staged and committed beside them."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from mhar.atomic import fsync_file, pid_alive

LM_EVAL_DIR = "lm_eval"  # lm-eval's own output files (its --output_path) inside each task folder

# --- lm-eval output -> our files --------------------------------------------------------
def jsonable(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "item"):  # numpy / torch scalars
        return x.item()
    return str(x)


def _metric_key(metric: str, filter_key: str) -> str:
    return metric if filter_key == "none" else f"{metric},{filter_key}"


def arguments_hash(arguments: Sequence[Any]) -> str:
    """sha256 of all of a document's request arguments (contexts, continuations, gen settings).

    Stored as ``arguments_hash``; ``prompt_hash`` keeps lm-eval's meaning (sha256 of the first
    request's first argument, as lm-eval logs it), so joins with lm-eval's own logs work."""
    blob = json.dumps(jsonable(arguments), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def sample_records(samples: list[dict], output_type: str, cluster_field: Optional[str] = None) -> list[dict]:
    """lm-eval logged samples (one per document and filter) -> one record per document.

    ``cluster_field``: the document field that groups related questions (the task YAML's ``metadata:
    cluster_field``), recorded as each record's ``group`` (clustered standard errors in the tables).

    ``metrics`` holds each document's metric value under ``metric`` (filter ``none``) or
    ``metric,filter``; perplexity-type metrics keep lm-eval's per-document item
    (``[loglikelihood, n_words|n_bytes]`` for wikitext, the loglikelihood for lambada).
    """
    by_doc: dict[int, dict] = {}
    for s in samples:
        doc_id = int(s["doc_id"])
        filt = s.get("filter", "none")
        rec = by_doc.get(doc_id)
        if rec is None:
            target = None if output_type == "loglikelihood_rolling" else jsonable(s["target"])
            rec = by_doc[doc_id] = {
                "doc_id": doc_id,
                "prompt_hash": s.get("prompt_hash"),  # lm-eval's: sha256 of the first request's context
                "arguments_hash": arguments_hash(s["arguments"]),  # ours: every argument of every request
                "target": target,  # rolling tasks: the document itself (see target_hash)
                "target_hash": s.get("target_hash"),
                "doc_hash": s.get("doc_hash"),
                "metrics": {},
                "responses": {},
            }
            if output_type == "generate_until":
                rec["generation"] = jsonable(s["resps"][0][0]) if s["resps"] and s["resps"][0] else None
            if cluster_field and isinstance(s.get("doc"), dict) and s["doc"].get(cluster_field) is not None:
                rec["group"] = jsonable(s["doc"][cluster_field])
        for m in s["metrics"]:
            rec["metrics"][_metric_key(m, filt)] = jsonable(s[m])
        rec["responses"][filt] = jsonable(s["filtered_resps"])
    return [by_doc[k] for k in sorted(by_doc)]


def aggregate_metrics(task_results: dict) -> dict:
    """lm-eval's ``{"acc,none": x, "acc_stderr,none": se}`` -> ``{"acc": x, "acc_stderr": se}``.

    Metrics with a filter keep it (``exact_match,strict-match``); a standard error that
    lm-eval does not provide (``"N/A"``) becomes ``None``.
    """
    out = {}
    for key, value in task_results.items():
        if "," not in key:
            continue  # alias, sample_len, ...
        metric, filt = key.split(",", 1)
        out[_metric_key(metric, filt)] = None if value == "N/A" else jsonable(value)
    return out


def fill_missing_stderrs(metrics: dict, samples: list[dict], aggregations: dict, iters: int) -> dict[str, str]:
    """Bootstrap (over documents) the stderrs lm-eval leaves out (wikitext's perplexities, bits per byte).

    Uses lm-eval's own ``bootstrap_stderr`` on the task's aggregation function; updates
    ``metrics`` in place and returns ``{metric: how its stderr was obtained}``.
    """
    from lm_eval.api.metrics import bootstrap_stderr  # lazy: lm-eval (loads torch); this module imports without it

    how = {}
    for name in list(metrics):
        base, sep, filt = name.partition(",")
        if base.endswith("_stderr"):
            continue
        key = f"{base}_stderr{sep}{filt}"
        if metrics.get(key) is not None or base not in aggregations:
            how[name] = "lm-eval" if metrics.get(key) is not None else "none"
            continue
        items = [s[base] for s in samples if s.get("filter", "none") == (filt or "none") and base in s]
        if iters > 0 and len(items) > 1:
            metrics[key] = float(bootstrap_stderr(aggregations[base], items, iters=iters))
            how[name] = f"bootstrap over documents ({iters} draws, lm_eval.api.metrics.bootstrap_stderr)"
        else:
            how[name] = "none"
    return how


# --- lm-eval's own output files ------------------------------------------------------------
def lm_eval_model(model_info: dict, model_path: str, lm: Any) -> tuple[str, dict]:
    """``(--model, --model_args)`` of the ``lm_eval`` command that evaluates the same model."""
    kind = model_info.get("adapter")
    if kind == "hf":
        return "hf", {k: model_info[k] for k in ("pretrained", "dtype", "max_length") if model_info.get(k) is not None}
    if kind == "mhar":
        args = {"pretrained": str(model_path)}
        if model_info.get("max_length") is not None:
            args["max_length"] = model_info["max_length"]
        return "mhar", args
    return type(lm).__name__, {"pretrained": str(model_path)}


_STAGING_PREFIX = f".{LM_EVAL_DIR}.tmp-"
# lm-eval's EvaluationTracker names its files <model folder>/results_<date>.json and samples_<task>_<date>.jsonl,
# the model folder after the whole model path (lm_eval.utils.sanitize_model_name: '/' -> '__').
_DATE_LEN = len("2026-01-01T00-00-00.000000")


def fitting_model_folder(name: str, limit: int) -> str:
    """lm-eval's folder name for a model's files, itself when it fits the file-name limit ``limit`` (bytes);
    a longer one (a model path longer than the limit: lm-eval would fail to write its files after the whole
    evaluation) becomes ``<sha256 of the name, 16 hex>__<its last bytes>``: within the limit, one per path."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= limit:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    tail = raw[-(limit - len(digest) - 2):].decode("utf-8", "ignore").lstrip("_")
    return f"{digest}__{tail}"


def task_name_problem(task: str, limit: int) -> Optional[str]:
    """Why lm-eval could not name the samples file of ``task`` under the file-name limit ``limit`` (None: it can)."""
    n = len(f"samples_{task}_{'0' * _DATE_LEN}.jsonl".encode("utf-8", "surrogateescape"))
    if n <= limit:
        return None
    return (f"task {task[:60]}{'...' if len(task) > 60 else ''}: lm-eval names its samples file "
            f"samples_<task>_<date>.jsonl, {n} bytes for this task, over the file system's limit of {limit} for a "
            "file name; give the task a shorter name (its YAML's task:)")


def lm_eval_staging(task_dir: Path) -> Path:
    """A fresh same-folder staging directory for lm-eval's files; those of killed runs are removed first."""
    for old in task_dir.glob(_STAGING_PREFIX + "*") if task_dir.is_dir() else ():
        pid = old.name[len(_STAGING_PREFIX):].split("-")[0]
        if old.is_dir() and (not pid.isdigit() or not pid_alive(int(pid))):
            shutil.rmtree(old, ignore_errors=True)
    return task_dir / f"{_STAGING_PREFIX}{os.getpid()}-{time.time_ns()}"


def write_lm_eval_files(tracker, res: dict, task_name: str, staging: Path, dest: Path) -> dict:
    """Write lm-eval's ``results_<date>.json`` and ``samples_<task>_<date>.jsonl`` with its own
    EvaluationTracker (what ``lm_eval --output_path DEST --log_samples`` does after an evaluation), staged
    and then moved into ``dest/<model>/`` BESIDE the files of a previous evaluation: the previous record
    (results.json) names those by their date, so they stay until the new record is written
    (:func:`commit_lm_eval_files` then removes them; :func:`drop_lm_eval_files` removes the new ones where
    the new record could not be written).

    lm-eval's tracker logs and swallows write errors: the files are checked here, and a missing one is an
    OSError. Returns the two files' paths relative to ``dest``'s parent. ``res["samples"]`` is consumed
    (lm-eval rewrites each sample's arguments and responses while saving)."""
    samples = res.pop("samples")
    moved: list[Path] = []
    try:
        tracker.save_results_aggregated(results=res, samples=samples)
        tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
        found = {"results": sorted(staging.glob("*/results_*.json")),
                 "samples": sorted(staging.glob(f"*/samples_{task_name}_*.jsonl"))}
        if any(len(v) != 1 for v in found.values()):
            raise OSError(f"lm-eval could not write its output files into {staging} (found {found}); "
                          "check the free space and permissions of the output folder")
        for p in found.values():
            fsync_file(p[0])
        for (p,) in found.values():
            target = dest / p.parent.name / p.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(p, target)
            moved.append(target)
    except BaseException:
        drop_lm_eval_files(dest, [str(Path(dest.name) / t.relative_to(dest)) for t in moved])
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {k: str(Path(dest.name) / m.relative_to(dest)) for k, m in zip(found, moved)}


def drop_lm_eval_files(dest: Path, files) -> None:
    """Remove the new lm-eval files ``files`` (paths relative to ``dest``'s parent): their record was not written."""
    for f in files:
        (dest.parent / f).unlink(missing_ok=True)
    for d in sorted((p for p in dest.rglob("*") if p.is_dir()), reverse=True) if dest.is_dir() else ():
        if not any(d.iterdir()):
            d.rmdir()


def commit_lm_eval_files(dest: Path, keep) -> None:
    """Once results.json names ``keep`` (paths relative to ``dest``'s parent): the files of earlier evaluations
    (and any a killed run left) go."""
    keep = {(dest.parent / f).resolve() for f in keep}
    stale = [p for p in dest.rglob("*") if p.is_file() and p.resolve() not in keep] if dest.is_dir() else []
    drop_lm_eval_files(dest, [str(p.relative_to(dest.parent)) for p in stale])
