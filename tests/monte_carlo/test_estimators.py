"""Estimates of the Monte Carlo engine (fisher_ref.monte_carlo.estimators): means and
their intervals, cross terms, delta-method ses, running estimates, an MCResult's z-scores
and variance reduction. The z-tests themselves are in tests/monte_carlo/test_ztests.py."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from fisher_ref import exact, load_config
import fisher_ref.monte_carlo.sampling as monte_carlo
import fisher_ref.monte_carlo.estimators as mc_stats
from fisher_ref.monte_carlo.estimators import (Estimate, advantage_estimates, cross_estimate,
                                               mean_estimate, running_estimates,
                                               variance_reduction)
from fisher_ref.monte_carlo.sampling import estimate

from cases import brute_values, rows_of_draws

RTOL = 1e-10  # exact float64 identities
FD_RTOL = 1e-5  # central differences with step 1e-6 (truncation ~1e-12, rounding ~1e-10 / 1e-6)


@pytest.mark.parametrize("mod", [mc_stats, monte_carlo], ids=["mc_stats", "monte_carlo"])
def test_docstring_examples(mod):
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0


def test_mean_estimate_and_interval():
    x = np.arange(10.0)[:, None] * np.array([1.0, -2.0])  # (10, 2)
    e = mean_estimate(x)
    np.testing.assert_allclose(e.mean, x.mean(axis=0), rtol=RTOL)
    np.testing.assert_allclose(e.se, x.std(axis=0, ddof=1) / np.sqrt(10), rtol=RTOL)
    lo, hi = e.interval()
    np.testing.assert_allclose(hi - lo, 2 * 1.959963984540054 * e.se, rtol=RTOL)
    assert np.isnan(mean_estimate(np.ones((1, 3))).se).all()


def test_cross_estimate_matches_a_direct_computation():
    xi = np.random.default_rng(0).standard_normal((50, 3, 4))  # (n, T, P)
    e = cross_estimate(xi)
    prod = xi[:, :, None, :] * xi[:, None, :, :]  # (n, T, T, P)
    np.testing.assert_allclose(e.mean, prod.mean(axis=0), rtol=RTOL)
    np.testing.assert_allclose(e.se, prod.std(axis=0, ddof=1) / np.sqrt(50), rtol=1e-8)


def _weighted_stats(u, R, h, h2):
    """Covariance (population), bound and correlation under sample weights u (sum 1)."""
    mR = u @ R
    cov = u @ ((R - mR)[:, None] * (h - u @ h))
    B = np.sqrt(u @ (R - mR) ** 2) * np.sqrt(u @ h2)
    return {"covariance": cov, "bound": B, "correlation": np.abs(cov) / B}


def test_delta_method_ses_are_the_influence_functions():
    """Each sample's influence is d/de stat((1-e) uniform + e delta_k): by central
    differences, the std of those influences / sqrt(n) is the se advantage_estimates gives."""
    rng = np.random.default_rng(1)
    n = 40
    R = rng.integers(0, 3, n).astype(float)
    h = rng.standard_normal((n, 3)) + R[:, None] * np.array([0.5, -0.3, 0.1])
    est = advantage_estimates(R, h, h * h)
    base = np.full(n, 1.0 / n)
    step = 1e-6
    infl = {k: np.empty((n, 3)) for k in est}
    for k in range(n):
        e = np.zeros(n)
        e[k] = 1.0
        up = _weighted_stats(base + step * (e - base), R, h, h * h)
        dn = _weighted_stats(base - step * (e - base), R, h, h * h)
        for q in est:
            infl[q][k] = (up[q] - dn[q]) / (2 * step)
    for q, e in est.items():
        np.testing.assert_allclose(e.se, infl[q].std(axis=0, ddof=1) / np.sqrt(n), rtol=FD_RTOL)
    np.testing.assert_allclose(est["covariance"].mean, np.cov(R, h.T)[0, 1:], rtol=RTOL)
    np.testing.assert_allclose(est["bound"].mean, R.std() * np.sqrt((h * h).mean(axis=0)),
                               rtol=RTOL)
    assert np.all(est["correlation"].mean <= 1.0)


def test_constant_inputs_give_zero_se_not_nan():
    R = np.ones(20)  # constant reward: std(A) = 0
    h = np.zeros((20, 2))  # a parameter that never moves: h = 0
    est = advantage_estimates(R, h, h * h)
    for e in est.values():
        assert np.all(e.mean == 0) and np.all(e.se == 0)


def test_running_estimates_match_prefix_statistics():
    x = np.random.default_rng(2).exponential(size=(30, 2)) + 1e6  # an offset stresses cancellation
    r = running_estimates(x, exact=np.array([1e6 + 1, 1e6 + 1]))
    assert r["n"].tolist() == list(range(1, 31))
    for k in (2, 7, 30):
        np.testing.assert_allclose(r["mean"][k - 1], x[:k].mean(axis=0), rtol=RTOL)
        np.testing.assert_allclose(r["se"][k - 1], x[:k].std(axis=0, ddof=1) / np.sqrt(k),
                                   rtol=1e-8)
    assert np.isnan(r["se"][0]).all()
    np.testing.assert_allclose(r["error"], r["mean"] - (1e6 + 1), rtol=RTOL)
    with pytest.raises(ValueError, match="samples must be an"):
        running_estimates(np.zeros(0))


def test_mc_result_z_scores_and_variance_reduction():
    task = load_config("offpolicy_temperature")
    ex = exact(task, progress=False)
    mc = estimate(task, 3000, np.random.default_rng(4))
    zs = mc.z_scores(ex)
    qs = {"score_mean", "sequence_fisher", "token_fisher_sum", "cross_terms", "gradient",
          "expected_reward", "covariance", "bound"}
    expected = {(s, q) for s in ("raw", "centered") for q in qs}
    assert set(zs) == expected | {("raw", "importance_gradient")}
    assert zs[("raw", "cross_terms")].shape == (3, 3, task.model.num_params)
    assert isinstance(mc.streams["centered"]["bound"], Estimate)
    # variance_reduction defaults to the centered stream when drawn from mu: against the
    # variances, taken here, of the same draws' h^2 and token sums, each looked up in the
    # brute-force enumeration (centered at mu's mean score; tests/cases.py)
    w, h2, g, rows = brute_values("config:offpolicy_temperature", "centered")
    k = rows_of_draws(mc.draws, rows)
    vh, vg = np.var(h2[k], axis=0, ddof=1), np.var(g[k], axis=0, ddof=1)  # (P,) each
    live = vg > 1e-12 * np.max(g[k] ** 2)
    assert live.sum() > 0.5 * len(vg)
    np.testing.assert_allclose(variance_reduction(mc)[live], vh[live] / vg[live], rtol=1e-8)


def test_tiny_rewards_keep_their_standard_errors():
    """issue 46 item 1 (Monte Carlo): with rewards of 1e-170 x a count, the squares in the
    standard errors (and in the bound's spread) underflowed: se 0 and bound 0. The same
    draws with rewards of 1 x the count give the same numbers times 1e-170."""
    from fisher_ref import load_config
    from fisher_ref.monte_carlo.sampling import estimate
    task = load_config("default")
    count, s = task.reward, 1e-170
    unit = estimate(task, 300, np.random.default_rng(3))
    tiny = estimate(task.with_(reward=lambda p, r: s * count(p, r)), 300,
                    np.random.default_rng(3))
    for q in ("expected_reward", "gradient", "covariance", "bound", "correlation"):
        a, b = unit.streams["policy"][q], tiny.streams["policy"][q]
        k = 1.0 if q == "correlation" else s
        assert np.any(np.asarray(a.se) > 0), q
        np.testing.assert_allclose(b.mean, k * np.asarray(a.mean), rtol=1e-10, atol=0,
                                   err_msg=q)
        np.testing.assert_allclose(b.se, k * np.asarray(a.se), rtol=1e-10, atol=0, err_msg=q)
