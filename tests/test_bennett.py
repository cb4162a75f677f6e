"""fisher_ref.bennett: h(u) by its series and its formula, the threshold inverting the tail
bound, the normal limit, and the bound against exact tails it must dominate (the mean of
n two-point draws, by scipy's binomial: code fisher_ref does not share)."""
import doctest
import math

import numpy as np
import pytest
from scipy.stats import binom

import fisher_ref.bennett as bennett
from fisher_ref.bennett import bennett_h, bennett_log_tail, bennett_threshold, two_sided_test

EXACT_RTOL = 1e-10


def test_doctests():
    res = doctest.testmod(bennett)
    assert res.attempted > 0 and res.failed == 0


def test_h_on_both_sides_of_where_the_series_takes_over():
    """Against h's Taylor series to 12 terms, sum_k (-1)^k u^k / (k (k - 1)), exact to
    rounding for u <= 1e-2: the package's short series below 1e-4, its formula above."""
    u = np.logspace(-8, -2, 61)
    series = sum((-1) ** k * u ** k / (k * (k - 1)) for k in range(2, 14))
    assert np.abs(bennett_h(u) / series - 1).max() <= EXACT_RTOL
    big = np.array([0.5, 3.0, 1e3])
    assert np.allclose(bennett_h(big), (1 + big) * np.log1p(big) - big, rtol=1e-14, atol=0)
    assert bennett_h(0.0) == 0.0


@pytest.mark.parametrize("b", [1e-3, 0.3, 1.0, 30.0])
@pytest.mark.parametrize("q", [0.05, 1e-6, 1e-12])
def test_the_threshold_inverts_the_tail(b, q):
    sigma, n = 0.7, 250
    t = bennett_threshold(sigma, b, n, q)
    assert abs(float(bennett_log_tail(t, sigma, b, n)) - math.log(q)) <= EXACT_RTOL * abs(
        math.log(q))


def test_a_tiny_range_gives_the_normal_tail():
    sigma, n, q = 2.0, 10 ** 4, 1e-6
    t = float(bennett_threshold(sigma, 1e-9, n, q))
    assert abs(t / (sigma * math.sqrt(2 * math.log(1 / q) / n)) - 1) <= 1e-6


@pytest.mark.parametrize("p", [0.5, 0.05, 0.002])
@pytest.mark.parametrize("n", [5, 40, 300])
def test_the_bound_dominates_exact_two_point_tails(p, n):
    """X in {0, 1} with P(1) = p: mean p, sigma^2 = p(1 - p), X - p <= 1 - p and
    p - X <= p. At the threshold for q, the exact binomial tail on each side is at most q."""
    q = 1e-3
    sigma = math.sqrt(p * (1 - p))
    up = float(bennett_threshold(sigma, 1 - p, n, q))
    down = float(bennett_threshold(sigma, p, n, q))
    # P(mean - p >= up) = P(S >= n (p + up)), S ~ Binomial(n, p)
    k_up = math.ceil(n * (p + up) - 1e-9)
    k_down = math.floor(n * (p - down) + 1e-9)
    assert binom.sf(k_up - 1, n, p) <= q, (p, n, binom.sf(k_up - 1, n, p))
    assert (binom.cdf(k_down, n, p) if k_down >= 0 else 0.0) <= q, (p, n)


def test_two_sided_test_splits_alpha_over_the_coordinates_and_sides():
    dev = np.array([0.0, 0.5, -0.5])
    sd, b = np.ones(3), np.ones(3)
    failed, z_thr, log_p = two_sided_test(dev, sd, b, b, 100, 0.03)
    t = float(bennett_threshold(1.0, 1.0, 100, 0.03 / 6))
    assert np.allclose(z_thr, t / 0.1, rtol=1e-12)
    assert failed.tolist() == [False, True, True] and log_p[0] == 0.0
