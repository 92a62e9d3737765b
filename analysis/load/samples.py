"""Evaluation outputs: one task's per-document records (``<eval dir>/<task>/samples.jsonl`` + ``results.json``),
validated before any statistic, and the per-document metric arrays the paired tests read."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .common import AnalysisInputError, jsonl_rows, read_json


@dataclass
class EvalTask:
    """One task of one evaluated model: per-document metrics keyed by doc_id."""

    task: str
    path: Path
    docs: dict[Any, dict]  # doc_id -> {"prompt_hash": str|None, "metrics": {name: value}}
    results: dict

    @property
    def facts(self) -> dict:
        """The task's facts (``primary_metric``, ``cluster_field``) from :func:`task_facts`."""
        return task_facts(self.results)

    def metric_names(self) -> list[str]:
        names: list[str] = []
        for d in self.docs.values():
            for k in d["metrics"]:
                if k not in names:
                    names.append(k)
        return names


def task_facts(results: dict) -> dict:
    """A task's facts as its task YAML states them under ``metadata:`` and lm-eval records them in results.json
    (``lm_eval.config.metadata``): ``primary_metric`` (the metric the tables compare; see
    analysis.tables.questions.primary_metric for a task that names none) and ``cluster_field`` (the document field
    that groups related questions, for clustered standard errors: several HellaSwag items come from one
    ActivityNet / WikiHow source). {} when the record carries no metadata."""
    cfg = (results.get("lm_eval") or {}).get("config") if isinstance(results.get("lm_eval"), dict) else None
    meta = cfg.get("metadata") if isinstance(cfg, dict) else None
    return meta if isinstance(meta, dict) else {}


def eval_tasks(eval_dir: str | os.PathLike) -> list[str]:
    """Tasks with a samples.jsonl under EVAL_DIR."""
    root = Path(eval_dir)
    if not root.is_dir():
        raise AnalysisInputError(f"{root}: eval directory not found (run `python -m eval.run ... --out {root}`)")
    return sorted(p.parent.name for p in root.glob("*/samples.jsonl"))


def _bad_metric(v: Any) -> Optional[str]:
    """Why a per-document metric value is unusable (None when it is a finite number or [loglik, weight])."""
    if isinstance(v, (list, tuple)):
        if not v:
            return "an empty list"
        for x in v:
            why = _bad_metric(x)
            if why:
                return why
        return None
    if isinstance(v, bool):
        return None  # 0/1 scores stored as booleans
    if isinstance(v, (int, float)):
        return None if math.isfinite(v) else "not finite"
    return "not a number"


def _expected_docs(results: dict, rp: Path) -> tuple[Optional[list], Optional[int], str]:
    """(the recorded doc ids, or None; the recorded count, or None; where it was read) of a results.json."""
    ids = results.get("doc_ids")
    if isinstance(ids, list):
        return ids, len(ids), f"{rp} doc_ids"
    n = results.get("n")
    if isinstance(n, int) and not isinstance(n, bool):
        return None, n, f"{rp} n"
    total, sub = results.get("n_docs_total"), results.get("subset")
    spec = sub.get("spec") if isinstance(sub, dict) else sub
    if isinstance(total, int) and spec in (None, "full"):
        return None, total, f"{rp} n_docs_total"
    return None, None, ""


def load_eval_task(eval_dir: str | os.PathLike, task: str) -> EvalTask:
    """One task's per-document records, validated before any use: each doc_id once, every metric a finite
    number, and the documents those that ``results.json`` records (``doc_ids``; else its count ``n``, the
    subset / ``--limit`` it was run with). Anything else is one AnalysisInputError naming the file and the
    first bad record."""
    d = Path(eval_dir) / task
    sp = d / "samples.jsonl"
    if not sp.is_file():
        raise AnalysisInputError(f"{sp}: missing; evaluate task {task!r} into {eval_dir} first")
    redo = f"re-run the evaluation of {task!r} (python -m eval.run ... --out {eval_dir})"
    rp = d / "results.json"
    results = read_json(rp) if rp.is_file() else {}
    if not isinstance(results, dict):
        raise AnalysisInputError(f"{rp}: expected a JSON object")
    cluster_field = task_facts(results).get("cluster_field")
    docs: dict[Any, dict] = {}
    lines: dict[Any, int] = {}
    for i, rec in jsonl_rows(sp):
        if not isinstance(rec, dict) or "doc_id" not in rec or not isinstance(rec.get("metrics"), dict):
            raise AnalysisInputError(f"{sp}:{i}: each line needs 'doc_id' and a 'metrics' object")
        doc_id = rec["doc_id"]
        if not isinstance(doc_id, (int, str)) or isinstance(doc_id, bool):
            raise AnalysisInputError(f"{sp}:{i}: doc_id {doc_id!r} is not an integer or string; {redo}")
        if doc_id in lines:
            raise AnalysisInputError(f"{sp}:{i}: doc_id {doc_id!r} appears again (first on line {lines[doc_id]}); "
                                     f"each document is recorded once, so the file is damaged: {redo}")
        lines[doc_id] = i
        for name, v in rec["metrics"].items():
            why = _bad_metric(v)
            if why:
                raise AnalysisInputError(f"{sp}:{i}: doc_id {doc_id!r} metric {name!r} = {v!r} is {why}; a "
                                         f"damaged or failed evaluation cannot be compared: {redo}")
        group = rec.get("group", rec.get("cluster"))  # a sample's own group takes precedence
        if group is None and cluster_field and isinstance(rec.get("doc"), dict):
            group = rec["doc"].get(cluster_field)
        # the all-arguments hash (``arguments_hash``; older files stored it as ``prompt_hash``)
        docs[doc_id] = {"prompt_hash": rec.get("arguments_hash", rec.get("prompt_hash")),
                        "metrics": rec["metrics"], "group": group}
    want_ids, want_n, src = _expected_docs(results, rp)
    if want_ids is not None and set(want_ids) != set(docs):
        missing = [k for k in want_ids if k not in docs]
        extra = [k for k in docs if k not in set(want_ids)]
        what = (f"{len(missing)} recorded document(s) are missing (first: doc_id {missing[0]!r})" if missing else
                f"{len(extra)} document(s) are not in the recorded selection (first: doc_id {extra[0]!r}, line "
                f"{lines[extra[0]]})")
        raise AnalysisInputError(f"{sp}: {what}; {src} lists {len(want_ids)}, the file holds {len(docs)}: {redo}")
    if want_n is not None and want_n != len(docs):
        raise AnalysisInputError(f"{sp}: holds {len(docs)} documents, {src} records {want_n}: the file is incomplete "
                                 f"or damaged: {redo}")
    return EvalTask(task=task, path=sp, docs=docs, results=results)


def align(a: EvalTask, b: EvalTask) -> list:
    """The doc_ids of a pair, in a's order: both sides must hold the same documents (a pair is never
    reduced to the documents they happen to share) and agree on the prompt hash where both record it."""
    common = [k for k in a.docs if k in b.docs]
    if not common:
        raise AnalysisInputError(f"{a.path} and {b.path} share no doc_id; were they evaluated on the same subset?")
    only_a = [k for k in a.docs if k not in b.docs]
    only_b = [k for k in b.docs if k not in a.docs]
    if only_a or only_b:
        side, k = (a.path, only_a[0]) if only_a else (b.path, only_b[0])
        raise AnalysisInputError(
            f"{a.path} vs {b.path}: the pair holds different documents ({len(only_a)} only in the first, {len(only_b)} "
            f"only in the second; first: doc_id {k!r} in {side}); evaluate both on the same subset (--limit / "
            "--subset) and re-run the incomplete one")
    bad = [k for k in common if a.docs[k]["prompt_hash"] and b.docs[k]["prompt_hash"]
           and a.docs[k]["prompt_hash"] != b.docs[k]["prompt_hash"]]
    if bad:
        raise AnalysisInputError(f"{a.path} vs {b.path}: prompt_hash differs for doc_id(s) {bad[:5]}; the two "
                                 "evaluations used different prompts (task version / few-shot seed); re-run one")
    return common


def _metric(rec: dict, name: str):
    m = rec["metrics"]
    if name in m:
        return m[name]
    for k, v in m.items():  # lm-eval style "exact_match,strict-match"
        if k.split(",")[0] == name:
            return v
    raise KeyError(name)


def metric_arrays(task: EvalTask, name: str, doc_ids: Sequence) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Per-document values of metric ``name``: (values, None) for scalar scores, or
    (loglikelihoods, weights) when the metric is stored as [loglik, weight] (perplexities)."""
    vals = []
    for k in doc_ids:
        try:
            vals.append(_metric(task.docs[k], name))
        except KeyError:
            raise AnalysisInputError(f"{task.path}: doc_id {k!r} has no metric {name!r} "
                                     f"(available: {list(task.docs[k]['metrics'])})") from None
    if vals and isinstance(vals[0], (list, tuple)):
        arr = np.asarray(vals, float)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise AnalysisInputError(f"{task.path}: metric {name!r} must be a number or [loglik, weight]")
        return arr[:, 0], arr[:, 1]
    return np.asarray(vals, float), None
