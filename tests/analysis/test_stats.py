"""analysis.stats against independent scipy/statsmodels computations, the paper's McNemar counts,
a planted difference-in-differences effect, and a power simulation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as sps
import statsmodels.api as sm
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.weightstats import DescrStatsW

from analysis import stats as st
from analysis import verdict as vd


# --- McNemar -------------------------------------------------------------------------------------
@pytest.mark.parametrize("b,c,paper_p", [(123, 81, 0.004), (27, 13, 0.038)])
def test_mcnemar_reproduces_paper_pvalues(b, c, paper_p):
    res = st.mcnemar_exact(b, c)
    assert round(res.p_value, 3) == paper_p
    assert st.mcnemar_exact(c, b).p_value == pytest.approx(res.p_value)  # symmetric


def test_mcnemar_matches_statsmodels_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(20):
        b, c = rng.integers(0, 60, size=2)
        table = np.array([[rng.integers(0, 100), b], [c, rng.integers(0, 100)]])
        ref = sm_mcnemar(table, exact=True).pvalue
        assert st.mcnemar_exact(int(b), int(c)).p_value == pytest.approx(ref, rel=1e-10, abs=1e-15)


def test_discordant_counts_match_crosstab():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    tab = np.zeros((2, 2), int)
    np.add.at(tab, (a, b), 1)  # rows: a, cols: b
    assert st.discordant_counts(a, b) == (tab[1, 0], tab[0, 1])
    with pytest.raises(ValueError, match="0/1"):
        st.discordant_counts([0.5, 1], [0, 1])


def test_mcnemar_rejects_bad_counts():
    with pytest.raises(ValueError, match="non-negative"):
        st.mcnemar_exact(-1, 3)
    assert st.mcnemar_exact(0, 0).p_value == 1.0


# --- sign flip / bootstrap --------------------------------------------------------------------------
def _mean(a, axis=-1):
    return np.mean(a, axis=axis)


def test_sign_flip_exact_equals_scipy_permutation_test():
    rng = np.random.default_rng(2)
    for n in (5, 9, 12):
        x, y = rng.normal(0.4, 1, n), rng.normal(0, 1, n)
        obs, p = st.sign_flip_test(x, y, n_resamples=10_000)
        ref = sps.permutation_test((x - y,), _mean, permutation_type="samples", vectorized=True,
                                   n_resamples=np.inf)
        assert obs == pytest.approx(ref.statistic)
        assert p == pytest.approx(ref.pvalue, rel=1e-12)


def test_sign_flip_monte_carlo_close_to_scipy():
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.35, 1, 60), rng.normal(0, 1, 60)
    _, p = st.sign_flip_test(x, y, n_resamples=20_000, seed=1)
    ref = sps.permutation_test((x - y,), _mean, permutation_type="samples", vectorized=True,
                               n_resamples=20_000, rng=np.random.default_rng(5)).pvalue
    assert abs(p - ref) < 0.01 + 0.1 * ref


def test_paired_bootstrap_ci_close_to_t_interval():
    rng = np.random.default_rng(4)
    z = rng.normal(size=400)
    x, y = z + rng.normal(0.2, 0.5, 400), z  # paired, strongly correlated
    est, lo, hi = st.paired_bootstrap(x, y, n_resamples=4000, seed=0)
    ref = DescrStatsW(x - y).tconfint_mean()
    half = (ref[1] - ref[0]) / 2
    assert est == pytest.approx(np.mean(x - y))
    assert abs(lo - ref[0]) < 0.1 * half and abs(hi - ref[1]) < 0.1 * half


def test_paired_delta_uses_mcnemar_for_binary_and_permutation_otherwise():
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    r = st.paired_delta(a, b, n_resamples=999)
    assert r.p_value == pytest.approx(st.mcnemar_exact(*st.discordant_counts(a, b)).p_value)
    x, y = rng.normal(size=30), rng.normal(size=30)
    r2 = st.paired_delta(x, y, n_resamples=4999, seed=3)
    assert r2.p_value == pytest.approx(st.sign_flip_test(x, y, n_resamples=4999, seed=3)[1])
    assert r2.ci_low <= r2.estimate <= r2.ci_high


# --- seeds: paired t --------------------------------------------------------------------------------
def test_paired_t_matches_statsmodels():
    rng = np.random.default_rng(6)
    for n in (2, 3, 5, 12):
        base = rng.normal(3.0, 0.05, n)
        var = base - 0.02 + rng.normal(0, 0.01, n)
        r = st.paired_t(var, base)
        ds = DescrStatsW(var - base)
        tstat, p, _ = ds.ttest_mean(0.0)
        lo, hi = ds.tconfint_mean(alpha=0.05)
        assert r.p_value == pytest.approx(p, rel=1e-9)
        assert (r.ci_low, r.ci_high) == pytest.approx((lo, hi), rel=1e-9)
        assert r.se == pytest.approx(ds.std_mean, rel=1e-9)


def test_paired_inputs_validated():
    with pytest.raises(ValueError, match="equal length"):
        st.paired_t([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="NaN"):
        st.paired_t([1, np.nan], [1, 2])


# --- documents: perplexity ------------------------------------------------------------------------------
def _docs(rng, n, shift):
    w = rng.integers(50, 400, n).astype(float)  # words per document
    per_word = rng.normal(-3.0, 0.3, n)
    la = (per_word + rng.normal(0, 0.05, n)) * w
    lb = (per_word + shift + rng.normal(0, 0.05, n)) * w
    return la, lb, w


def test_bootstrap_perplexity_matches_scipy_bootstrap_and_permutation():
    rng = np.random.default_rng(7)
    la, lb, w = _docs(rng, 80, -0.02)
    r = st.bootstrap_perplexity(la, lb, w, n_resamples=6000, seed=1)
    direct = math.exp(-la.sum() / w.sum()) - math.exp(-lb.sum() / w.sum())
    assert r.estimate == pytest.approx(direct)

    def ppl_diff(a, b, ww, axis=-1):
        return np.exp(-a.sum(axis) / ww.sum(axis)) - np.exp(-b.sum(axis) / ww.sum(axis))

    ref = sps.bootstrap((la, lb, w), ppl_diff, paired=True, vectorized=True, n_resamples=6000,
                        method="percentile", rng=np.random.default_rng(2))
    half = (ref.confidence_interval.high - ref.confidence_interval.low) / 2
    assert abs(r.ci_low - ref.confidence_interval.low) < 0.1 * half
    assert abs(r.ci_high - ref.confidence_interval.high) < 0.1 * half

    def swap_stat(a, b, axis=-1):  # weights equal for both models, so a swap moves only the logliks
        return np.exp(-a.sum(axis) / w.sum()) - np.exp(-b.sum(axis) / w.sum())

    la2, lb2, _ = la, la + rng.normal(0, 0.15, 80) * w, w  # a weak, noisy difference: p in the middle
    r2 = st.bootstrap_perplexity(la2, lb2, w, n_resamples=6000, seed=3)
    pref = sps.permutation_test((la2, lb2), swap_stat, permutation_type="samples", vectorized=True,
                                n_resamples=6000, rng=np.random.default_rng(4)).pvalue
    assert abs(r2.p_value - pref) < 0.03 + 0.1 * pref


def test_bits_per_byte_delta_matches_scipy_bootstrap_and_has_the_word_perplexity_sign():
    """bits=True: the statistic is -sum ll / sum bytes / ln 2 (lm-eval's bits_per_byte); on the same documents its
    delta has the sign of the word-perplexity delta (analysis.lm_metrics relies on it for sign-only verdicts)."""
    from analysis import lm_metrics

    rng = np.random.default_rng(11)
    la, lb, words = _docs(rng, 60, -0.03)
    nbytes = words * 5.3
    r = st.bootstrap_perplexity(la, lb, nbytes, n_resamples=4000, seed=1, bits=True)
    direct = (-la.sum() / nbytes.sum() + lb.sum() / nbytes.sum()) / math.log(2)
    assert r.estimate == pytest.approx(direct) and r.estimate < 0  # a has the higher log-likelihoods
    assert lm_metrics.corpus_value("bits_per_byte,none", la, nbytes) - lm_metrics.corpus_value(
        "bits_per_byte", lb, nbytes) == pytest.approx(direct)

    def bpb_diff(a, b, bb, axis=-1):
        return (-a.sum(axis) / bb.sum(axis) + b.sum(axis) / bb.sum(axis)) / math.log(2)

    ref = sps.bootstrap((la, lb, nbytes), bpb_diff, paired=True, vectorized=True, n_resamples=4000,
                        method="percentile", rng=np.random.default_rng(2))
    half = (ref.confidence_interval.high - ref.confidence_interval.low) / 2
    assert abs(r.ci_low - ref.confidence_interval.low) < 0.1 * half
    assert abs(r.ci_high - ref.confidence_interval.high) < 0.1 * half
    word = st.bootstrap_perplexity(la, lb, words, n_resamples=200, seed=1)
    assert np.sign(word.estimate) == np.sign(r.estimate)


def test_bootstrap_perplexity_identical_models():
    rng = np.random.default_rng(8)
    la, _, w = _docs(rng, 30, 0.0)
    r = st.bootstrap_perplexity(la, la, w, n_resamples=500)
    assert r.estimate == 0 and r.p_value == 1.0 and r.ci_low == r.ci_high == 0
    with pytest.raises(ValueError, match="positive"):
        st.bootstrap_perplexity(la, la, np.zeros_like(w))


# --- clusters ------------------------------------------------------------------------------------------------
def test_cluster_se_matches_statsmodels_cluster_robust_ols():
    rng = np.random.default_rng(9)
    groups = rng.integers(0, 12, 240)
    d = rng.normal(0.05, 0.3, 240) + rng.normal(0, 0.2, 12)[groups]  # shared shock per cluster
    r = st.cluster_se(d, groups)
    fit = sm.OLS(d, np.ones_like(d)).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
    assert r.estimate == pytest.approx(fit.params[0])
    assert r.se == pytest.approx(fit.bse[0], rel=1e-10)
    assert r.p_value == pytest.approx(fit.pvalues[0], rel=1e-8)
    lo, hi = fit.conf_int()[0]
    assert (r.ci_low, r.ci_high) == pytest.approx((lo, hi), rel=1e-8)
    with pytest.raises(ValueError, match="2 clusters"):
        st.cluster_se(d, np.zeros_like(groups))


# --- power -----------------------------------------------------------------------------------------------------
def _simulated_power(delta, n, rho, alpha=0.05, sims=4000, seed=0):
    rng = np.random.default_rng(seed)
    cov = [[1.0, rho], [rho, 1.0]]
    xy = rng.multivariate_normal([delta, 0.0], cov, size=(sims, n))  # (sims, n, 2)
    p = sps.ttest_rel(xy[..., 0], xy[..., 1], axis=1).pvalue
    return float(np.mean(p < alpha))


@pytest.mark.parametrize("n,rho,delta", [(12, 0.6, 0.5), (30, 0.2, 0.4)])
def test_power_matches_simulation(n, rho, delta):
    sd = st.sd_of_difference(1.0, 1.0, rho)
    assert sd == pytest.approx(math.sqrt(2 - 2 * rho))
    analytic = st.power_paired(delta, n, sd)
    assert abs(analytic - _simulated_power(delta, n, rho)) < 0.03


def test_mde_has_the_requested_power_in_simulation():
    n, rho = 10, 0.7
    sd = st.sd_of_difference(1.0, 1.0, rho)
    mde = st.mde_paired(n, sd, power=0.8)
    assert st.power_paired(mde, n, sd) == pytest.approx(0.8, abs=1e-6)
    assert abs(_simulated_power(mde, n, rho, seed=1) - 0.8) < 0.03
    assert st.mde_paired(20, sd) < mde  # more pairs -> smaller detectable effect
    assert math.isnan(st.mde_paired(1, sd))


# --- difference-in-differences --------------------------------------------------------------------------------
def _cpt_arms(rng, n, cpt, mhar):
    """Questions with a latent difficulty; plain CPT and MHAR CPT raise the solve probability."""
    diff = rng.normal(size=n)
    u = rng.random(n)  # shared noise: arms are paired on the same questions
    p0 = 1 / (1 + np.exp(-(diff - 0.8)))
    base = (u < p0).astype(float)
    plain = (u < np.clip(p0 + cpt, 0, 1)).astype(float)
    mh = (rng.random(n) < np.clip(p0 + cpt + mhar, 0, 1)).astype(float)
    truth = {"cpt_gain": np.mean(np.clip(p0 + cpt, 0, 1) - p0),
             "mhar_gain": np.mean(np.clip(p0 + cpt + mhar, 0, 1) - np.clip(p0 + cpt, 0, 1))}
    truth["total_gain"] = truth["cpt_gain"] + truth["mhar_gain"]
    return base, plain, mh, truth


def test_did_recovers_planted_mhar_effect():
    rng = np.random.default_rng(10)
    base, plain, mh, truth = _cpt_arms(rng, 4000, cpt=0.25, mhar=0.06)
    res = st.did_contrasts(base, plain, mh, n_resamples=2000)
    for k, r in res.items():
        assert r.ci_low <= truth[k] <= r.ci_high, k
        assert r.excludes_zero, k
    assert res["total_gain"].estimate == pytest.approx(res["cpt_gain"].estimate + res["mhar_gain"].estimate)
    assert res["mhar_gain"].estimate < 0.5 * res["cpt_gain"].estimate


def test_did_does_not_credit_cpt_gain_to_mhar():
    rng = np.random.default_rng(11)
    base, plain, mh, truth = _cpt_arms(rng, 3000, cpt=0.3, mhar=0.0)
    res = st.did_contrasts(base, plain, mh, n_resamples=2000)
    assert res["cpt_gain"].excludes_zero and res["total_gain"].excludes_zero
    assert not res["mhar_gain"].excludes_zero
    assert vd.decide(res["mhar_gain"], 0.03, same_scale=False) == vd.INCONCLUSIVE


def test_did_continuous_scores():
    rng = np.random.default_rng(12)
    n = 500
    ability = rng.normal(size=n)
    base = ability + rng.normal(0, 0.3, n)
    plain = ability + 1.0 + rng.normal(0, 0.3, n)
    mh = ability + 1.2 + rng.normal(0, 0.3, n)
    res = st.did_contrasts(base, plain, mh, n_resamples=2000)
    assert res["mhar_gain"].ci_low <= 0.2 <= res["mhar_gain"].ci_high
    assert "sign-flip" in res["mhar_gain"].method


# --- scale: 10^6 items, bounded memory -------------------------------------------------------------------------
def _peak_mb(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] / 2 ** 20
    finally:
        tracemalloc.stop()


def test_resampling_at_a_million_items_is_fast_and_bounded():
    """Was 4.8 GB at 10^5 and MemoryError at 10^6 (bootstrap), 138 s for sign-flip at 10^6."""
    import time

    rng = np.random.default_rng(20)
    n = 10 ** 6
    a, b = (rng.random(n) < 0.52).astype(float), (rng.random(n) < 0.50).astype(float)
    t0 = time.perf_counter()
    (obs, p), mb1 = _peak_mb(lambda: st.sign_flip_test(a, b, n_resamples=9999))
    (est, lo, hi), mb2 = _peak_mb(lambda: st.paired_bootstrap(a, b, n_resamples=9999))
    assert time.perf_counter() - t0 < 20 and max(mb1, mb2) < 200
    d = a - b
    se = d.std(ddof=1) / math.sqrt(n)
    assert obs == pytest.approx(d.mean()) and est == pytest.approx(d.mean())
    assert lo == pytest.approx(d.mean() - 1.96 * se, abs=0.1 * se) and hi == pytest.approx(d.mean() + 1.96 * se, abs=0.1 * se)
    x, y = rng.normal(0.003, 1, 200_000), rng.normal(0, 1, 200_000)  # continuous: the chunked general path
    (obs2, p2), mb3 = _peak_mb(lambda: st.sign_flip_test(x, y, n_resamples=999, seed=1))
    assert mb3 < 200
    z = (x - y).mean() / math.sqrt(np.sum((x - y) ** 2)) * 200_000
    assert abs(p2 - 2 * sps.norm.sf(abs(z))) < 0.05  # sign-flip null is ~N(0, sum d^2 / n^2) at this n


def test_compressed_sign_flip_matches_exact_binomial():
    """0/1 scores: the sign-flip null of the discordant pairs is 2 Binomial(b+c, 1/2) - (b+c), so its
    two-sided p is McNemar's exact p (Monte Carlo error only)."""
    rng = np.random.default_rng(21)
    a, b = rng.integers(0, 2, 400).astype(float), rng.integers(0, 2, 400).astype(float)
    a[:30] = 1.0
    b[:30] = 0.0
    _, p = st.sign_flip_test(a, b, n_resamples=40_000, seed=2)
    ref = sm_mcnemar(np.array([[0, st.discordant_counts(a, b)[0]], [st.discordant_counts(a, b)[1], 0]]),
                     exact=True).pvalue
    assert abs(p - ref) < 0.01 + 0.1 * ref


def test_compressed_bootstrap_matches_scipy_on_discrete_scores():
    rng = np.random.default_rng(22)
    a, b = rng.integers(0, 2, 300).astype(float), rng.integers(0, 3, 300).astype(float)
    est, lo, hi = st.paired_bootstrap(a, b, n_resamples=8000, seed=0)
    ref = sps.bootstrap((a - b,), _mean, n_resamples=8000, method="percentile", vectorized=True,
                        rng=np.random.default_rng(1)).confidence_interval
    half = (ref.high - ref.low) / 2
    assert abs(lo - ref.low) < 0.08 * half and abs(hi - ref.high) < 0.08 * half


# --- verdict (analysis.verdict) ------------------------------------------------------------------------------------
def _res(est, lo, hi, p=0.01, n=3):
    return st.PairedResult(est, lo, hi, p, n, "test")


@pytest.mark.parametrize("res,pub,same,expected", [
    (_res(-0.05, -0.08, -0.02), -0.05, False, vd.SAME_SIGN),  # a scale the paper did not run: the sign only
    (_res(-0.05, -0.08, -0.02), -0.06, True, vd.REPRODUCED),
    (_res(0.05, 0.02, 0.08), -0.09, False, vd.OPPOSITE_SIGN),
    (_res(0.05, 0.02, 0.08), -0.09, True, vd.NOT_REPRODUCED),
    (_res(-0.005, -0.02, 0.01, p=0.4), -0.09, True, vd.NOT_REPRODUCED),  # CI rules out the published delta
    (_res(-0.005, -0.02, 0.01, p=0.4), -0.09, False, vd.INCONCLUSIVE),   # other scale: sign only
    (_res(-0.05, -0.12, 0.02, p=0.2), -0.09, True, vd.INCONCLUSIVE),
    (_res(-0.05, -0.08, -0.02), 0.0, True, vd.NOT_REPRODUCED),    # paper: no difference
    (_res(-0.05, -0.08, -0.02), None, True, vd.NO_REFERENCE),
    (_res(-0.05, -0.08, -0.02, p=0.2), -0.05, True, vd.INCONCLUSIVE),  # CI excludes 0 but the printed p does not
])
def test_verdict_rule(res, pub, same, expected):
    assert vd.decide(res, pub, same) == expected


def test_paired_t_single_seed_has_no_ci_and_is_insufficient():
    r = st.paired_t([2.9], [3.0])
    assert r.estimate == pytest.approx(-0.1) and math.isnan(r.ci_low) and math.isnan(r.p_value)
    assert vd.decide(vd.seed_evidence([2.9], [3.0]), -0.05, same_scale=True) == vd.INSUFFICIENT


def test_mcnemar_b4_c0_decides_by_the_exact_p_not_the_bootstrap_ci():
    """b=4, c=0 of 200: the percentile CI excludes 0 but exact McNemar p = 0.125 (was 'reproduced')."""
    a, b = np.zeros(200), np.zeros(200)
    a[:4] = 1.0
    a[10:60] = b[10:60] = 1.0
    r = vd.question_evidence(a, b, n_resamples=4999)
    assert r.p_value == pytest.approx(sm_mcnemar(np.array([[50, 4], [0, 146]]), exact=True).pvalue)
    assert r.p_value == pytest.approx(0.125) and r.ci_low > 0  # the CI alone would have said "significant"
    assert vd.decide(r, 0.024, same_scale=True) == vd.INCONCLUSIVE
    assert vd.decide(r, 0.024, same_scale=False) == vd.INCONCLUSIVE


@pytest.mark.parametrize("a,b", [([1.0], [0.0]), ([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]),
                                 ([3.5, 3.6, 3.7], [3.6, 3.7, 3.8]), ([3.5, 3.75, 4.0], [3.75, 4.0, 4.25])])
def test_zero_width_or_single_unit_is_insufficient(a, b):
    """One question, or all differences equal: CI [d, d], nothing to judge (was 'reproduced')."""
    for res in ((vd.question_evidence(a, b, n_resamples=99),) if len(a) != 3 else ()) + (vd.seed_evidence(a, b),):
        assert vd.decide(res, float(np.mean(np.subtract(a, b))), same_scale=True) == vd.INSUFFICIENT


@pytest.mark.parametrize("factor,word", [(1 / 3, "smaller"), (10.0, "larger")])
def test_magnitude_at_the_paper_scale(factor, word):
    """Our delta a third / ten times the published one, CI tight around ours (was 'reproduced')."""
    rng = np.random.default_rng(30)
    pub = -0.06
    base = 3.0 + rng.normal(0, 0.05, 8)
    var = base + pub * factor + rng.normal(0, 0.002, 8)
    r = vd.seed_evidence(var, base)
    assert r.p_value < 1e-6 and not (r.ci_low <= pub <= r.ci_high)
    ratio = r.estimate / pub
    got = vd.decide(r, pub, same_scale=True)
    assert got == f"{vd.EFFECT_DIFFERS}: {word} (ratio {ratio:.2g})"
    assert abs(ratio - factor) < 0.1 * factor
    assert vd.decide(r, pub, same_scale=False) == vd.SAME_SIGN and vd.judged_on(False) == "sign only"


def test_clustered_questions_decide_by_the_cluster_robust_p():
    """8 clusters with shared shocks: iid tests are wildly overconfident; the cluster-robust t decides."""
    rng = np.random.default_rng(31)
    g = np.repeat(np.arange(8), 125)
    m = np.array([0.5, -0.3, 0.45, -0.2, 0.5, -0.1, 0.35, -0.25])  # per-cluster discordance: + a better, - b
    u, b = rng.random(1000), (rng.random(1000) < 0.4).astype(float)
    a = b.copy()
    pos, neg = (m[g] > 0) & (u < np.abs(m[g])), (m[g] < 0) & (u < np.abs(m[g]))
    a[pos], b[pos], a[neg], b[neg] = 1.0, 0.0, 0.0, 1.0
    iid = vd.question_evidence(a, b, n_resamples=999)
    r = vd.question_evidence(a, b, clusters=g, n_resamples=999)
    fit = sm.OLS(a - b, np.ones(1000)).fit(cov_type="cluster", cov_kwds={"groups": g}, use_t=True)
    assert r.p_value == pytest.approx(fit.pvalues[0], rel=1e-8) and r.se == pytest.approx(fit.bse[0], rel=1e-10)
    assert "cluster" in r.method and "7 df" in r.method
    assert iid.p_value < 1e-6 < 0.05 < r.p_value
    assert vd.decide(r, float((a - b).mean()), same_scale=False) == vd.INCONCLUSIVE
    assert vd.decide(iid, float((a - b).mean()), same_scale=False) == vd.SAME_SIGN


def test_seed_level_evidence_for_several_seeds():
    accs_a, accs_b = [0.61, 0.58, 0.64], [0.55, 0.57, 0.56]
    r = vd.seed_level_evidence(accs_a, accs_b)
    ref = sps.ttest_rel(accs_a, accs_b)
    assert r.p_value == pytest.approx(ref.pvalue) and r.n == 3 and "seed" in r.method


def test_holm_matches_statsmodels():
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(32)
    for m in (1, 2, 5, 13):
        p = rng.uniform(0, 0.1, m) ** 2
        p[rng.integers(0, m)] = p.min()  # ties
        assert vd.holm(p) == pytest.approx(multipletests(p, method="holm")[1].tolist(), rel=1e-12)
    got = vd.holm([0.01, None, 0.04, float("nan"), 0.03])  # missing rows are not part of the family
    assert math.isnan(got[1]) and math.isnan(got[3])
    assert [got[0], got[2], got[4]] == pytest.approx(multipletests([0.01, 0.04, 0.03], method="holm")[1].tolist())


def test_holm_changes_a_borderline_verdict():
    r = _res(-0.05, -0.09, -0.01, p=0.02)
    assert vd.decide(r, -0.05, True) == vd.REPRODUCED
    assert vd.decide(r, -0.05, True, p_adjusted=vd.holm([0.02, 0.03, 0.04])[0]) == vd.INCONCLUSIVE


@pytest.mark.parametrize("ours,paper,se,expected", [
    (0.45, 0.55, None, vd.REPRODUCED),          # exactly at 0.55 - 0.10: was 'not reproduced' by float rounding
    (0.65, 0.55, None, vd.REPRODUCED),          # exactly at 0.55 + 0.10
    (0.44, 0.55, None, f"{vd.EFFECT_DIFFERS}: lower (ratio 0.8)"),
    (0.90, 0.55, None, f"{vd.EFFECT_DIFFERS}: higher (ratio 1.6)"),  # two-sided: much faster is not the paper
    (0.40, 0.55, 0.03, vd.REPRODUCED),          # within tolerance + 2 SE of the repeats
    (None, 0.55, None, vd.INSUFFICIENT),
])
def test_cost_verdict(ours, paper, se, expected):
    assert 0.45 < 0.55 - 0.10  # the float trap the verdict must survive
    assert vd.cost_verdict(ours, paper, True, se=se) == expected


def test_cost_verdict_oom_and_other_scales():
    assert vd.cost_verdict(None, 0.3, True, status="OOM") == vd.OOM
    assert vd.cost_verdict(0.5, 0.5, False).startswith(vd.NOT_JUDGED)
    assert vd.cost_verdict(0.5, None, True) == vd.NO_REFERENCE


def test_t_interval_is_scipys():
    """The one t interval (paired t, cluster-robust t, throughput) against scipy's t.interval and ttest_1samp."""
    x = [0.91, 0.93, 0.92, 0.95]
    mean, sd, lo, hi = st.sample_t_interval(x)
    assert mean == pytest.approx(sum(x) / 4) and sd == pytest.approx(sps.tstd(x))
    assert (lo, hi) == pytest.approx(sps.t.interval(0.95, 3, loc=mean, scale=sps.sem(x)), rel=1e-12)
    ci = sps.ttest_1samp(x, 0.0).confidence_interval(0.9)
    assert st.sample_t_interval(x, 0.9)[2:] == pytest.approx((ci.low, ci.high), rel=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        st.sample_t_interval([0.9])


def test_one_statistics_path():
    """One Holm, one t interval and one home for the verdict words in the analysis stage and the benchmarks: no
    second Holm (statsmodels' multipletests), no t quantile outside analysis/stats.py, no verdict word written
    as a string of its own outside analysis/verdict.py (issue 55)."""
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    words = set(vd.VERDICTS + vd.TARGET_VERDICTS)
    bad = []
    for p in sorted([*root.glob("analysis/**/*.py"), *root.glob("benchmarks/*.py")]):
        text = p.read_text()
        rel = p.relative_to(root).as_posix()
        if "multipletests" in text or (re.search(r"def holm\b", text) and rel != "analysis/verdict.py"):
            bad.append(f"{rel}: a Holm of its own")
        if rel != "analysis/stats.py" and re.search(r"\bt\.(ppf|interval)\(|def t_interval", text):
            bad.append(f"{rel}: a t interval of its own")
        if rel.startswith("analysis/") and rel != "analysis/verdict.py":
            tree = ast.parse(text)
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                    and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            bad += [f"{rel}:{n.lineno}: verdict word {n.value!r} of its own" for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and n.value in words and id(n) not in docs]
    assert not bad, bad
