"""Question-level comparisons of two evaluated models on the same documents of one task, and the task's
primary metric."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import lm_metrics
from .. import stats as st
from .. import verdict as vd
from ..load.common import AnalysisInputError
from ..load.samples import EvalTask, align, metric_arrays


# The metric compared for a task whose YAML names no ``metadata: primary_metric``: the first of these it records.
DEFAULT_METRICS = ("acc", "exact_match", "pass@1", "word_perplexity", "perplexity")


def primary_metric(task: EvalTask) -> str:
    """The metric the tables compare for ``task``: its YAML's ``metadata: primary_metric`` (as recorded in
    results.json), else the first of DEFAULT_METRICS it records, else its first metric. A declared metric the
    records do not carry is refused (AnalysisInputError), never replaced by another."""
    names = task.metric_names()
    want = task.facts.get("primary_metric")
    if want is not None:
        for n in names:
            if n.split(",")[0] == want:
                return n
        raise AnalysisInputError(
            f"{task.path}: task {task.task}: metadata.primary_metric {want!r} is not a metric it produces "
            f"({', '.join(dict.fromkeys(n.split(',')[0] for n in names)) or 'none'}); name one of those in the "
            "task's YAML and evaluate again (python -m eval.run refuses it before running)")
    for key in DEFAULT_METRICS:
        for n in names:
            if n.split(",")[0] == key:
                return n
    if not names:
        raise AnalysisInputError(f"{task.path}: no metrics recorded")
    return names[0]


@dataclass
class Comparison:
    """a - b on the same documents of one task; ``result`` is the deciding evidence (analysis.verdict)."""

    value_a: float
    value_b: float
    result: st.PairedResult
    mde80: Optional[float]
    kind: str  # "perplexity" | "binary" | "score"
    mcnemar: Optional[st.McNemarResult] = None
    cluster: Optional[st.PairedResult] = None


def compare_task(a: EvalTask, b: EvalTask, metric: str, *, n_resamples: int = 4999, seed: int = 0) -> Comparison:
    """One model per arm: the question-level (or document-level) evidence of analysis.verdict."""
    ids = align(a, b)
    xa, wa = metric_arrays(a, metric, ids)
    xb, wb = metric_arrays(b, metric, ids)
    if wa is not None:
        if wb is None:
            raise AnalysisInputError(f"{a.path} vs {b.path}: metric {metric!r} stored differently")
        res = vd.perplexity_evidence(xa, xb, wa, wb, n_resamples=n_resamples, seed=seed, metric=metric)
        z = 2.8016  # z_{0.975} + z_{0.80}
        return Comparison(lm_metrics.corpus_value(metric, xa, wa), lm_metrics.corpus_value(metric, xb, wb), res,
                          z * res.se, "perplexity")
    groups = [a.docs[k].get("group") for k in ids]
    clusters = groups if all(g is not None for g in groups) else None
    res = vd.question_evidence(xa, xb, clusters, n_resamples=n_resamples, seed=seed)
    binary = bool(np.isin(xa, (0, 1)).all() and np.isin(xb, (0, 1)).all())
    d = xa - xb
    mde = st.mde_paired(d.size, float(np.std(d, ddof=1))) if d.size > 1 else None
    cl = res if res.method.startswith("cluster") else None
    mc = st.mcnemar_exact(*st.discordant_counts(xa, xb)) if binary else None
    return Comparison(float(xa.mean()), float(xb.mean()), res, mde, "binary" if binary else "score", mc, cl)
