"""check_applied_gradient on a correct sampler (no trainer): per-step gradients drawn as
exact groups, its false-failure rate measured over many seeds, its power against a scale
error, and its refusals."""
import doctest

import numpy as np
import pytest
from scipy.stats import binom

import fisher_ref.applied_gradient as applied
from fisher_ref.applied_gradient import (MIN_STEPS, check_applied_gradient, normal_quantile,
                                         steps_needed)
from fisher_ref.estimators import expected_loss_gradient, presets
from fisher_ref.estimators.batch import group_arrays
from fisher_ref.estimators.gradient import _group_gradients, loss_coefficients
from fisher_ref.estimators.groups import groups, response_table
from tests.estimators.brute import tiny_task

G = 2
#: The calibration's own false-failure rate: a binomial upper tail.
CALIBRATION_FALSE_FAILURE = 1e-6


def group_draws(task, loss, group_size):
    """Every group's gradient ``(n, P)`` and its probability ``(n,)``: one training step of
    a correct pipeline is a draw from these."""
    table = response_table(task)
    gs, ws = [], []
    for pr in table.prompts:
        q = np.exp(pr.sampler_logp)
        for idx, mult in groups(len(pr), group_size, False, chunk=1 << 16):
            a = group_arrays(table, pr, idx)
            gs.append(_group_gradients(table, a, loss_coefficients(loss, a, pr.prompt)))
            ws.append(pr.weight * mult * np.prod(q[idx], axis=1))
    return np.concatenate(gs), np.concatenate(ws)


@pytest.fixture(scope="module")
def draws():
    task, loss = tiny_task(), presets.grpo()
    exact = expected_loss_gradient(task, loss, G)
    g, w = group_draws(task, loss, G)
    return exact, g, w


def _steps(g, w, n, rng):
    return g[rng.choice(len(w), size=n, p=w / w.sum())]  # (n, P)


def test_doctests():
    res = doctest.testmod(applied)
    assert res.attempted > 0 and res.failed == 0


def test_draws_are_the_exact_distribution(draws):
    exact, g, w = draws
    mean = w @ g
    assert abs(w.sum() - 1) < 1e-12
    assert np.abs(mean - exact.mean).max() <= 1e-10 * np.abs(exact.mean).max()
    var = w @ (g - mean) ** 2
    assert np.abs(var - exact.variance).max() <= 1e-10 * exact.variance.max()


def test_normal_quantile():
    from scipy.stats import norm
    for q in (0.5, 0.05, 1e-3, 1e-6, 1e-9, 1e-12):
        assert abs(normal_quantile(q) - norm.isf(q / 2)) < 1e-9, q


@pytest.mark.parametrize("n", [MIN_STEPS, 200])
def test_false_failure_rate_on_a_correct_sampler(draws, n):
    """At a test alpha of 0.05 (measurable), the rejection rate of a correct sampler over
    many seeds is at most alpha within binomial error (Bonferroni is conservative). This
    test fails falsely with probability <= CALIBRATION_FALSE_FAILURE."""
    exact, g, w = draws
    alpha, seeds = 0.05, 2000
    rng = np.random.default_rng(20261205 + n)
    rejected = sum(not check_applied_gradient(_steps(g, w, n, rng), exact, alpha=alpha)
                   for _ in range(seeds))
    limit = binom.isf(CALIBRATION_FALSE_FAILURE, seeds, alpha)
    assert rejected <= limit, (f"seed {20261205 + n}: {rejected}/{seeds} rejected at "
                               f"alpha {alpha} (limit {limit})")


def test_power_against_a_scale_error(draws):
    """A pipeline applying 1.5 times the gradient is caught in the steps steps_needed gives
    at least 90% of the time (a floor: it counts only the best-placed parameter). False
    failure <= CALIBRATION_FALSE_FAILURE (binomial lower tail at 0.9)."""
    exact, g, w = draws
    n = steps_needed(exact, 0.5, alpha=1e-6, power=0.9)
    rng = np.random.default_rng(7)
    seeds = 200
    caught = sum(not check_applied_gradient(1.5 * _steps(g, w, n, rng), exact, alpha=1e-6)
                 for _ in range(seeds))
    assert caught >= binom.ppf(CALIBRATION_FALSE_FAILURE, seeds, 0.9), (n, caught)


def test_verdict_numbers_and_names(draws):
    exact, g, w = draws
    steps = _steps(g, w, 500, np.random.default_rng(3))
    names = [f"p{i}" for i in range(g.shape[1])]
    v = check_applied_gradient(steps, exact, layout=names)
    assert v and v.steps == 500 and v.worst[0][0] in names
    assert abs(v.scale - 1) < 6 * v.scale_se and v.cosine > 0.9
    v.assert_ok()
    bad = check_applied_gradient(steps + 10 * np.sqrt(exact.variance / 500), exact)
    assert not bad and "FAIL" in bad.message
    with pytest.raises(AssertionError, match="max\\|z\\|"):
        bad.assert_ok()


def test_zero_variance_parameter():
    mean, var = np.array([1.0, 2.0]), np.array([1.0, 0.0])
    steps = np.random.default_rng(0).normal(1.0, 1.0, size=(100, 2))
    steps[:, 1] = 2.0
    assert check_applied_gradient(steps, (mean, var))
    steps[:, 1] = 2.5  # constant, but not the exact value: a deterministic bias
    v = check_applied_gradient(steps, (mean, var))
    assert not v and v.max_abs_z == np.inf and "zero variance" in v.reason
    steps[::2, 1] = 2.0  # varies where the exact result says it cannot
    with pytest.raises(ValueError, match="variance is 0"):
        check_applied_gradient(steps, (mean, var))


def test_refusals():
    exact = (np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="min_steps"):
        check_applied_gradient(np.zeros((MIN_STEPS - 1, 3)), exact)
    with pytest.raises(ValueError, match="min_steps"):
        check_applied_gradient(np.zeros((1, 3)), exact, min_steps=1)
    with pytest.raises(ValueError, match="parameters per step"):
        check_applied_gradient(np.zeros((100, 4)), exact)
    with pytest.raises(ValueError, match="steps, P"):
        check_applied_gradient(np.zeros(100), exact)
    with pytest.raises(ValueError, match="alpha"):
        check_applied_gradient(np.zeros((100, 3)), exact, alpha=0)
    with pytest.raises(TypeError, match="LossGradient"):
        check_applied_gradient(np.zeros((100, 3)), object())
    with pytest.raises(ValueError, match="layout"):
        check_applied_gradient(np.zeros((100, 3)), exact, layout=[("w", (2,))])
    with pytest.raises(ValueError, match="relative_bias"):
        steps_needed(exact, 0.0)
    with pytest.raises(ValueError, match="mean is 0"):
        steps_needed(exact, 0.1)
