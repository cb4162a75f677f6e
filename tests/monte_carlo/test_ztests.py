"""The z-tests of the Monte Carlo checks (fisher_ref.monte_carlo.ztests): the Bonferroni
threshold, Bernstein's half-width and ratio (rounding-level variances judged to rounding),
and z-scores of constant and rounding-noise quantities."""
import numpy as np
import pytest
from scipy.stats import norm

from cases import RTOL
from fisher_ref.monte_carlo.ztests import (ROUNDING_RTOL, ZERO_VAR_RTOL, bernstein_halfwidth,
                                           bernstein_ratio, bernstein_z, bonferroni_z, z_score)


def test_bonferroni_z_is_the_two_sided_normal_quantile():
    assert bonferroni_z(0.05, 1) == pytest.approx(1.959963984540054, rel=RTOL)
    for m in (1, 10, 1000):
        z = bonferroni_z(1e-6, m)
        assert 2 * m * norm.sf(z) == pytest.approx(1e-6, rel=1e-9)
    with pytest.raises(ValueError, match="alpha"):
        bonferroni_z(0.0, 3)
    with pytest.raises(ValueError, match="number of z-scores"):
        bonferroni_z(1e-3, 0)


def test_bernstein_z_is_near_normal_for_light_tails_and_large_for_spikes():
    L = np.log(2 / 1e-6)
    assert bernstein_z(10 ** 12, 1.0, 1.0, 1e-6) == pytest.approx(np.sqrt(2 * L), rel=1e-4)
    # a value that is 1 with probability 1e-4: var ~ 1e-4, max deviation ~ 1
    assert bernstein_z(20000, 1e-4, 1.0, 1e-6) > 1.5 * np.sqrt(2 * L)
    assert bernstein_z(100, 0.0, 0.0, 1e-6) == 0.0


def test_bernstein_ratio_judges_rounding_noise_variance_to_rounding():
    """A constant per-sample value (0.53 for every response) whose exact variance came out
    -3.5e-18 and range 2.8e-17 (rounding): the error of its mean is compared to rounding,
    not to the noise-sized half-width (which would give a ratio in the hundreds)."""
    n, delta = 4000, 1e-6 / 119
    mean = np.array([0.53, 1.76, 0.0])  # (3,): constant, live, all-zero
    var = np.array([-3.5e-18, 0.3, 0.0])
    dev = np.array([2.8e-17, 9.0, 0.0])
    diff = np.array([5.6e-16, 0.01, 0.0])
    assert diff[0] / bernstein_halfwidth(n, 0.0, dev[0], delta) > 100  # the old failure
    r = bernstein_ratio(diff, n, var, dev, delta, mean)
    assert np.all(np.isfinite(r)) and r[0] <= 1e-2 and r[2] == 0
    # a live entry: the plain Bernstein ratio (the ZERO_VAR_RTOL inflation is negligible)
    assert r[1] == pytest.approx(0.01 / bernstein_halfwidth(n, 0.3, 9.0, delta), rel=1e-10)
    # a constant that is off by more than rounding (of the array's scale) fails
    scale = np.max(np.abs(mean) + dev)
    bad = bernstein_ratio(np.array([10 * ROUNDING_RTOL * scale, 0.0, 0.0]), n, var, dev,
                          delta, mean)
    assert bad[0] == pytest.approx(10.0, rel=1e-10)
    # an all-zero quantity (scale 0) must be matched exactly
    zero = np.zeros(2)
    assert bernstein_ratio(np.array([0.0, 1e-300]), n, zero, zero, delta, zero).tolist() == \
        [0.0, np.inf]
    # a positive noise variance is capped by dev^2 (Var <= max|x - mu|^2) given E[x^2]
    eps = bernstein_halfwidth(n, 1e-17, 2.8e-17, delta, second=0.53 ** 2)
    assert eps <= 2.8e-17
    assert bernstein_halfwidth(n, 1e-17, 2.8e-17, delta) > 1e3 * eps  # without E[x^2]: noise
    # the variance is known only to ZERO_VAR_RTOL * E[x^2]: a rounded-to-0 variance of a
    # value with a real range is not trusted as 0
    assert bernstein_halfwidth(n, 0.0, 1.0, delta, second=1.0) == pytest.approx(
        bernstein_halfwidth(n, ZERO_VAR_RTOL, 1.0, delta), rel=1e-12)
    # bernstein_z (check_monte_carlo's form) is the half-width in units of sqrt(var / n)
    assert bernstein_z(n, 0.3, 9.0, delta) == pytest.approx(
        bernstein_halfwidth(n, 0.3, 9.0, delta) / np.sqrt(0.3 / n), rel=1e-12)
    assert bernstein_z(n, var, dev, delta)[0] == 0.0


def test_z_score_handles_zero_and_rounding_variance():
    z = z_score(np.array([1.0, 2.0, 2.0 + 1e-9, 0.5]), np.array([1.0, 2.0, 2.0, 0.4]),
                np.array([0.0, -1e-18, 0.0, 0.01]), 100)
    assert z[0] == 0 and z[1] == 0  # constant: equal to rounding
    assert z[2] == np.inf  # constant but off by more than rounding
    assert z[3] == pytest.approx(10.0, rel=RTOL)
    assert z_score(np.array([1.0 + 0.5 * ROUNDING_RTOL]), np.array([1.0]), np.array([0.0]), 5)[0] == 0


def test_z_scores_of_tiny_rewards_are_refused_naming_the_reward_scale():
    """issue 46 item 1 (Monte Carlo): with rewards of 1e-170 x a count the exact variances
    of expected_reward and gradient underflow, and their z came out 0 (a pass whatever the
    estimate). The z-scores are refused, naming the scale; the same task with the reward
    scaled by a power of two gives the z of rewards near 1."""
    from fisher_ref import exact, load_config
    from fisher_ref.monte_carlo.sampling import check_monte_carlo, estimate
    task = load_config("default")
    count = task.reward
    tiny = task.with_(reward=lambda p, r: 1e-170 * count(p, r))
    ex = exact(tiny, progress=False)
    mc = estimate(tiny, 200, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"z-scores refused: the rewards are of size [\d.]+e-1\d\d"
                       r" .* below 1e-100"):
        mc.z_scores(ex)
    with pytest.raises(ValueError, match="z-scores refused"):
        check_monte_carlo(tiny, ex, 200, seed=0)
    s = 2.0 ** 560  # exact: the z of the scaled task are those of rewards near 1
    scaled = task.with_(reward=lambda p, r: s * 1e-170 * count(p, r))
    z = estimate(scaled, 200, np.random.default_rng(0)).z_scores(exact(scaled, progress=False))
    assert np.max(np.abs(z[("policy", "gradient")])) > 0
