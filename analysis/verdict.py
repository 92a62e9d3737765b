"""The one place where statistics become the word a reader looks at first: the verdict.

One evidence function per unit of evidence (each returns a :class:`analysis.stats.PairedResult` whose
``p_value`` is the p-value that decides and is printed, and whose ``method`` names the test):

* :func:`seed_evidence` -- loss tables (Table 1, head sweep). Unit: the training seed (seed = data
  order, so variant and baseline with one seed are paired). Paired t-test over seeds (t with n-1 df).
  We do not use the exact sign-flip test here: with n seeds its smallest two-sided p is 2^(1-n)
  (0.25 at the paper's 3 seeds, 0.0625 at 5), so below 6 seeds it could never decide; the t-test
  assumes normal seed-to-seed differences, which is the usual model for seed noise.
* :func:`question_evidence` -- downstream / CPT scores of ONE trained model per arm. Unit: the
  question. 0/1 scores: exact McNemar p (two-sided binomial on the discordant pairs) with a
  percentile-bootstrap CI; other scores: sign-flip permutation p with a bootstrap CI. When items
  share a cluster (HellaSwag: several endings-questions per source context) the cluster-robust
  (CR1) t-test with G-1 degrees of freedom decides, and its CI is the one shown.
* :func:`perplexity_evidence` -- corpus perplexity of one model per arm. Unit: the document:
  CI by resampling documents, p by per-document swaps of the two models (a ratio of sums is not a
  mean of per-document scores).
* :func:`seed_level_evidence` -- any per-question metric when SEVERAL seeds were trained per arm.
  Unit: the seed again. The per-seed metric difference (on the same questions) goes into a paired
  t-test over seeds; question-level tests per seed would treat training noise as absent.

With fewer than 2 training seeds per arm, the question- or document-level evidence is about two trained
models, not about the method: :func:`decide` with ``single_seed=True`` then says only whether the two
models differ (``MODELS_DIFFER`` / ``NO_DIFFERENCE``), never ``REPRODUCED`` (stated in ``VERDICT_RULE``).

:func:`holm` adjusts the p-values of a table's family (all comparison rows of one table) by Holm's
step-down method (controls the family-wise error rate; we chose it over BH because a table's rows
are few and each verdict is read on its own). :func:`decide` turns evidence, the adjusted p and the
published delta into the verdict by ``VERDICT_RULE`` (stated once here; tables and REPORT.md quote
it). :func:`cost_verdict` does the same for throughput ratios, :func:`target_verdict` for a measured quantity
against a target (``analysis.throughput``: a throughput ratio vs its target, or one routing vs another).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from . import stats as st

__all__ = ["ALPHA", "REPRODUCED", "NOT_REPRODUCED", "INCONCLUSIVE", "INSUFFICIENT", "NO_REFERENCE",
           "EFFECT_DIFFERS", "NOT_JUDGED", "OOM", "MODELS_DIFFER", "NO_DIFFERENCE", "SINGLE_SEED_JUDGED",
           "SAME_SIGN", "OPPOSITE_SIGN", "VERDICTS", "TARGET_MET", "BELOW_TARGET", "NOT_DEMONSTRATED",
           "NOT_MEASURED", "FASTER", "SLOWER", "TARGET_VERDICTS",
           "VERDICT_RULE", "COST_RULE", "SCALE_NOTE",
           "seed_evidence", "question_evidence", "perplexity_evidence", "seed_level_evidence", "holm",
           "decide", "judged_on", "cost_verdict", "target_verdict"]

ALPHA = 0.05
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive at this power"
INSUFFICIENT = "insufficient evidence"
NO_REFERENCE = "no published value"
EFFECT_DIFFERS = "effect differs"  # "effect differs: smaller (ratio 0.33)"
NOT_JUDGED = "not judged"  # "not judged: CPT batch check failed"
OOM = "OOM"
# fewer than 2 training seeds per arm: the evidence is about two models, not the method
MODELS_DIFFER = "models differ (single seed)"
NO_DIFFERENCE = "no detectable difference (single seed)"
# a scale the paper did not run: only the sign of the delta is compared, and the word says so
SAME_SIGN = "same sign as paper"
OPPOSITE_SIGN = "opposite sign to paper"
SINGLE_SEED_JUDGED = "these two models (single seed)"
COST_TOLERANCE = 0.10
# every verdict word (a verdict string starts with one of these), in reading order
VERDICTS = (REPRODUCED, SAME_SIGN, NOT_REPRODUCED, OPPOSITE_SIGN, EFFECT_DIFFERS, INCONCLUSIVE, MODELS_DIFFER,
            NO_DIFFERENCE, INSUFFICIENT, NO_REFERENCE, NOT_JUDGED, OOM)
# a measured quantity against a target (analysis.throughput): met / below / not demonstrated; a size asked for
# but without runs: not measured; one routing against another (target 0): faster / slower / not demonstrated
TARGET_MET = "met"
BELOW_TARGET = "below"
NOT_DEMONSTRATED = "not demonstrated"
NOT_MEASURED = "not measured"
FASTER = "faster"
SLOWER = "slower"
TARGET_VERDICTS = (TARGET_MET, FASTER, BELOW_TARGET, SLOWER, NOT_DEMONSTRATED, NOT_MEASURED)
_EPS = 1e-9  # float-safe comparisons at a tolerance edge (0.45 vs 0.55 - 0.10)

VERDICT_RULE = "\n".join([
    "Verdict rule (analysis/verdict.py): each row compares OUR paired delta (variant - reference) with the PUBLISHED "
    "delta. Unit of "
    "evidence: the seed for losses and for downstream metrics of several seeds (paired t over seeds); the "
    "question for one seed (exact McNemar for 0/1 scores, sign-flip otherwise, cluster-robust t where questions "
    f"share a context); the document for perplexity (document bootstrap). p (Holm) adjusts the printed p across "
    f"the rows of a table (family-wise alpha {ALPHA}).",
    "",
    f"| the row | Holm p < {ALPHA} | Holm p >= {ALPHA} |",
    "|---|---|---|",
    f"| one training seed per arm (says nothing about the method) | {MODELS_DIFFER} | {NO_DIFFERENCE} |",
    f"| paper's scale, our CI contains the paper's delta | {REPRODUCED} | {INCONCLUSIVE} |",
    f"| paper's scale, our CI excludes the paper's delta | {EFFECT_DIFFERS}: smaller/larger (ratio ours/paper); "
    f"{NOT_REPRODUCED} if the sign is opposite | {NOT_REPRODUCED} |",
    f"| a scale the paper did not run (the sign only) | {SAME_SIGN} / {OPPOSITE_SIGN} | {INCONCLUSIVE} |",
    "",
    f"'{INSUFFICIENT}': fewer than 2 units or a zero-width CI; '{NO_REFERENCE}': the paper has no such row.",
])
COST_RULE = (
    f"Cost verdict: throughput ratio vs the baseline on our GPU; 'reproduced' if |ours - paper| <= "
    f"{COST_TOLERANCE:.2f} + 2 x (standard error of our ratio over repeat measurements, 0 without repeats), "
    "else 'effect differs: lower/higher (ratio ours/paper)'; OOM is shown as OOM; sizes the paper did not run "
    "are not judged. Hardware differs from the paper's single H100, so ratios, not tokens/s, are compared."
)
SCALE_NOTE = ("judged = 'sign only' for sizes the paper did not run (compared with the paper's 100M numbers "
              f"by the sign of the paired delta, verdict '{SAME_SIGN}' / '{OPPOSITE_SIGN}'; magnitudes are not "
              "comparable across scales).")


# --- evidence, one function per unit --------------------------------------------------------------------
def seed_evidence(a: Sequence[float], b: Sequence[float]) -> st.PairedResult:
    """Seeds as the unit: paired t over seeds of per-seed values (e.g. tail-mean losses)."""
    r = st.paired_t(a, b)
    return _with(r, method=f"paired t over {r.n} seed(s)")


def question_evidence(a: Sequence[float], b: Sequence[float], clusters: Optional[Sequence] = None, *,
                      n_resamples: int = 4999, seed: int = 0) -> st.PairedResult:
    """Questions as the unit (one model per arm): exact McNemar (0/1) / sign-flip p with a bootstrap CI,
    or the cluster-robust t-test when questions share clusters (at least 2 clusters, one with >1 item)."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    if clusters is not None:
        g = np.asarray([str(c) for c in clusters])
        labels, counts = np.unique(g, return_counts=True)
        if labels.size >= 2 and counts.max() > 1:
            r = st.cluster_se(x - y, g)
            return _with(r, method=f"cluster-robust t ({labels.size} clusters, {labels.size - 1} df)")
    return st.paired_delta(x, y, n_resamples=n_resamples, seed=seed)


def perplexity_evidence(loglik_a, loglik_b, weight_a, weight_b=None, *, n_resamples: int = 4999,
                        seed: int = 0, metric: str = "perplexity") -> st.PairedResult:
    """Documents as the unit: ppl_a - ppl_b (or bits-per-byte a - b for ``metric`` bits_per_byte),
    document-bootstrap CI, per-document swap permutation p."""
    return st.bootstrap_perplexity(loglik_a, loglik_b, weight_a, weight_b, n_resamples=n_resamples, seed=seed,
                                   bits=metric.split(",")[0] == "bits_per_byte")


def seed_level_evidence(values_a: Sequence[float], values_b: Sequence[float]) -> st.PairedResult:
    """Several seeds per arm: the per-seed metric of each arm (same questions) paired by seed, t over seeds."""
    r = st.paired_t(values_a, values_b)
    return _with(r, method=f"paired t over {r.n} seed(s) of per-seed metrics")


def _with(r: st.PairedResult, **kw) -> st.PairedResult:
    d = r.to_dict()
    d.update(kw)
    return st.PairedResult(**d)


# --- multiplicity -----------------------------------------------------------------------------------------
def holm(p_values: Sequence[Optional[float]]) -> list[float]:
    """Holm step-down adjusted p-values; missing (None/NaN) entries stay NaN and are not counted."""
    p = np.array([np.nan if v is None else float(v) for v in p_values], float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    if m == 0:
        return out.tolist()
    order = idx[np.argsort(p[idx], kind="stable")]
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out[order] = np.minimum(1.0, adj)
    return out.tolist()


# --- the verdict ------------------------------------------------------------------------------------------------
def judged_on(same_scale: bool, single_seed: bool = False) -> str:
    if single_seed:
        return SINGLE_SEED_JUDGED
    return "sign and magnitude" if same_scale else "sign only"


def _ratio(x: float, y: float) -> str:
    return f"ratio {x / y:.2g}" if y != 0 else "ratio -"


def decide(result: Optional[st.PairedResult], published_delta: Optional[float], same_scale: bool,
           p_adjusted: Optional[float] = None, alpha: float = ALPHA, single_seed: bool = False) -> str:
    """The verdict of one comparison (``VERDICT_RULE``); ``p_adjusted`` is the Holm p of its row
    (defaults to the raw p of a family of one). ``single_seed``: fewer than 2 training seeds per arm, so the
    evidence (questions / documents) can only say whether these two models differ."""
    if not single_seed and (published_delta is None or not np.isfinite(published_delta)):
        return NO_REFERENCE
    if result is None or result.n < 2:
        return INSUFFICIENT
    lo, hi = result.ci_low, result.ci_high
    p = result.p_value if p_adjusted is None else p_adjusted
    if not (np.isfinite(lo) and np.isfinite(hi) and p is not None and np.isfinite(p)):
        return INSUFFICIENT
    if hi - lo <= 1e-9 * max(1.0, abs(result.estimate)):  # zero width, up to float rounding of equal differences
        return INSUFFICIENT
    if single_seed:
        return MODELS_DIFFER if p < alpha else NO_DIFFERENCE
    covers = lo - _EPS <= published_delta <= hi + _EPS
    if p < alpha and not same_scale:
        return SAME_SIGN if np.sign(result.estimate) == np.sign(published_delta) else OPPOSITE_SIGN
    if p < alpha:
        if np.sign(result.estimate) != np.sign(published_delta):
            return NOT_REPRODUCED
        if same_scale and not covers:
            size = "smaller" if abs(result.estimate) < abs(published_delta) else "larger"
            return f"{EFFECT_DIFFERS}: {size} ({_ratio(result.estimate, published_delta)})"
        return REPRODUCED
    if same_scale and not covers:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def cost_verdict(ratio: Optional[float], published: Optional[float], same_scale: bool, *,
                 se: Optional[float] = None, status: str = "ok", tolerance: float = COST_TOLERANCE) -> str:
    """Throughput-ratio verdict (``COST_RULE``): two-sided tolerance, float-safe, widened by the spread."""
    if status.upper() == OOM:
        return OOM
    if not same_scale:
        return f"{NOT_JUDGED}: size not in the paper"
    if published is None or not math.isfinite(published):
        return NO_REFERENCE
    if ratio is None or not math.isfinite(ratio):
        return INSUFFICIENT
    allowed = tolerance + (2.0 * se if se is not None and math.isfinite(se) else 0.0)
    diff = ratio - published
    if abs(diff) <= allowed or math.isclose(abs(diff), allowed, rel_tol=1e-9, abs_tol=_EPS):
        return REPRODUCED
    return f"{EFFECT_DIFFERS}: {'lower' if diff < 0 else 'higher'} ({_ratio(ratio, published)})"


def target_verdict(p_adjusted: Optional[float], ci: Optional[Sequence[float]], target: float, alpha: float = ALPHA,
                   met: str = TARGET_MET, below: str = BELOW_TARGET) -> str:
    """A one-sided test of "the quantity exceeds ``target``": ``met`` when its (Holm) p is under ``alpha``,
    ``below`` when the interval ``ci`` (low, high) lies under the target, else ``NOT_DEMONSTRATED`` (always so
    with one unit: no p, no interval)."""
    if p_adjusted is not None and p_adjusted < alpha:
        return met
    if ci is not None and ci[1] < target:
        return below
    return NOT_DEMONSTRATED
