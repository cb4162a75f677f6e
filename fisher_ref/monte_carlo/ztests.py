r"""z-scores and Bernstein bounds: how far a Monte Carlo estimate may lie from the exact value.

A z-score holds an estimate against the exact value with the **exact** variance of the
per-sample value, so it is :math:`N(0, 1)` up to the error of the central limit theorem:

.. math:: z = (\bar x - E[x]) / \sqrt{\mathrm{Var}(x) / n}.

Where values are skewed (rarely non-zero), a Bernstein bound on the mean's deviation
replaces the normal threshold; :func:`bonferroni_z` spreads a false-failure rate over
many entries.
"""
from __future__ import annotations

import math

import numpy as np

from fisher_ref.limits import TINY_REWARD

__all__ = ["bonferroni_z", "z_score", "stream_z_scores", "check_reward_scale",
           "bernstein_halfwidth", "bernstein_z",
           "bernstein_ratio", "linearised_values", "spread", "cross_spread", "ZERO_VAR_RTOL",
           "ROUNDING_RTOL", "EXACT_VARIANCE", "SAMPLE_SE"]

# quantity -> key of StreamResult.variances giving the exact per-sample variance.
EXACT_VARIANCE = {"score_mean": "h", "sequence_fisher": "h2", "token_fisher_sum": "token_sum",
                  "cross_terms": "cross", "gradient": "Ah", "expected_reward": "reward"}
# quantities z-tested with the sample se (no exact variance available); "correlation"
# is not z-tested (|cov| is not smooth at 0).


SAMPLE_SE = ("covariance", "bound", "importance_gradient")
# An exact variance at most this fraction of E[x^2] is rounding noise from the
# cancellation E[x^2] - E[x]^2 (float64 eps ~ 2e-16, times a few): the value is
# treated as constant, and the estimate must then match the exact value to rounding.

ZERO_VAR_RTOL = 1e-12
# "To rounding": |estimate - exact| <= ROUNDING_RTOL * max(1, max|exact|) over the array.


ROUNDING_RTOL = 1e-12


def bonferroni_z(alpha, m):
    r"""Two-sided threshold for ``m`` z-scores with family false-failure rate ``alpha``.

    :math:`z^* = \Phi^{-1}(1 - \alpha / (2m))`, so that
    :math:`P(\max_k |z_k| > z^*) \le \alpha` for ``m`` standard normal z's.

    Example:
        >>> round(bonferroni_z(1e-6, 1), 2)
        4.89
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if int(m) < 1:
        raise ValueError(f"the number of z-scores m must be >= 1, got {m!r}")
    from scipy.stats import norm  # imported here: scipy.stats costs ~0.7 s at import
    return float(norm.isf(alpha / (2 * int(m))))


def z_score(mean, exact_value, variance, n, scale=None):
    r""":math:`z = (\bar x - E[x]) / \sqrt{\mathrm{Var}(x)/n}`, elementwise.

    Where the exact variance is 0 (at most :data:`ZERO_VAR_RTOL` of the entry's
    :math:`E[x^2]`), or the entry's values are all at rounding level (its
    :math:`E[x^2]` at most ``ROUNDING_RTOL**2`` of the largest entry's: a parameter
    that moves every logit alike, such as an attention key bias, has a score of
    exactly 0 and only rounding in its values), the per-sample value
    is constant, so the estimate must equal the exact value to rounding: ``z = 0``
    if ``|diff| <= ROUNDING_RTOL * scale`` (``scale = max(1, max|exact|)``), else ``inf``.

    Example:
        >>> z_score(np.array([1.1, 2.0]), np.array([1.0, 2.0]), np.array([0.04, 0.0]), 100)
        array([5., 0.])
    """
    mean = np.asarray(mean, dtype=float)
    exact_value = np.asarray(exact_value, dtype=float)
    variance = np.asarray(variance, dtype=float)
    if scale is None:
        scale = max(1.0, float(np.max(np.abs(exact_value), initial=0.0)))
    diff = mean - exact_value
    second = np.abs(variance) + exact_value ** 2  # E[x^2] of each entry
    zero = (variance <= ZERO_VAR_RTOL * second) | \
        (second <= ROUNDING_RTOL ** 2 * np.max(second, initial=0.0))  # values at rounding level
    with np.errstate(divide="ignore", invalid="ignore"):
        z = diff / np.sqrt(np.where(zero, 1.0, variance) / n)
    const = np.where(np.abs(diff) <= ROUNDING_RTOL * scale, 0.0, np.inf)
    return np.where(zero, const, z)


def check_reward_scale(exact_result):
    """Refuse (``ValueError`` naming the reward scale) an exact result whose rewards are
    below :data:`~fisher_ref.limits.TINY_REWARD` in size (see :func:`stream_z_scores`)."""
    st = exact_result.streams.get("policy") or next(iter(exact_result.streams.values()))
    size = math.hypot(st.reward_std, st.expected_reward) + abs(st.baseline)
    if 0 < size < TINY_REWARD:
        raise ValueError(
            f"Monte Carlo z-scores refused: the rewards are of size {size:.3g} "
            f"(sqrt(E[R]^2 + std(A)^2) + |baseline|), below {TINY_REWARD:g}; their squares, "
            "the variances the z-scores of expected_reward and gradient divide by, leave "
            "float64's range, so those z would be wrong. Multiply the reward and the "
            f"baseline by a power of two near 1/{size:.3g} (z is unchanged; "
            "fisher_ref.verify does this)")


def stream_z_scores(streams, exact_result, n, mean_baseline=False):
    r"""``{(stream, quantity): z}`` of Monte Carlo ``streams`` against ``exact_result``.

    Quantities of :data:`EXACT_VARIANCE` use the exact per-sample variance (for
    ``gradient`` only with a constant baseline: the leave-one-out advantage of
    baseline ``"mean"`` has another variance when :math:`E[h] \ne 0`); those of
    :data:`SAMPLE_SE` and that gradient use the sample se (:math:`z \approx t_{n-1}`).
    ``correlation`` is left out (not smooth where the covariance is 0).

    Raises:
        ValueError: the rewards are below :data:`fisher_ref.limits.TINY_REWARD` in size:
            the variances of the reward quantities underflow, and their z would be
            wrong (0 or infinite); scale the reward by a power of two first (z is
            unchanged; ``verify`` does it).
    """
    check_reward_scale(exact_result)
    out = {}
    for s, est in streams.items():
        ex = exact_result.streams[s]
        for q, e in est.items():
            if q == "correlation":
                continue
            if q in EXACT_VARIANCE and not (q == "gradient" and mean_baseline):
                var = ex.variances[EXACT_VARIANCE[q]]
            else:
                var = e.se ** 2 * n
            out[(s, q)] = z_score(e.mean, getattr(ex, q), var, n)
    return out


def bernstein_halfwidth(n, var, dev, delta, second=None):
    r"""Half-width :math:`\varepsilon` with :math:`P(|\bar x - \mu| \ge \varepsilon) \le \delta`
    for the mean of ``n`` i.i.d. bounded values (Bernstein's inequality).

    With :math:`\sigma^2 = \mathrm{Var}(x)`, :math:`M = \max|x - \mu|` (``dev``) and
    :math:`L = \ln(2/\delta)`, solving
    :math:`2\exp\!\big(-n\varepsilon^2 / (2\sigma^2 + 2M\varepsilon/3)\big) = \delta`:

    .. math:: \varepsilon = \frac{2ML/3 + \sqrt{(2ML/3)^2 + 8nL\sigma^2}}{2n}.

    No central limit theorem is needed, so it holds in the far tail of skewed,
    spiky values. Rounding: an exact variance from :math:`E[x^2] - E[x]^2` is only
    known to :data:`ZERO_VAR_RTOL` :math:`\cdot E[x^2]`. Given ``second`` (:math:`E[x^2]`),
    the variance used is :math:`\min(\max(\sigma^2, 0) + \text{ZERO\_VAR\_RTOL}\,E[x^2],\ M^2)`
    (:math:`\mathrm{Var} \le M^2` always), so a constant value (``dev`` at rounding level)
    gets :math:`\varepsilon` at rounding level, whatever the sign of its rounded variance.
    Without ``second`` a negative variance counts 0.

    Args:
        n: number of draws.
        var: exact variance(s) :math:`\sigma^2`, any shape.
        dev: largest deviation(s) :math:`M`, broadcastable to ``var``.
        delta: false-failure probability of each entry.
        second: optional :math:`E[x^2]`, broadcastable to ``var``.

    Returns:
        :math:`\varepsilon`, the broadcast shape of ``var`` and ``dev``.

    Example:
        >>> round(float(bernstein_halfwidth(100, 1.0, 0.0, 2 * np.exp(-2.0))), 6)
        0.2
    """
    L = np.log(2.0 / delta)
    dev = np.abs(np.asarray(dev, dtype=float))
    var = np.maximum(np.asarray(var, dtype=float), 0.0)
    if second is not None:
        var = np.minimum(var + ZERO_VAR_RTOL * np.abs(np.asarray(second, dtype=float)), dev * dev)
    b = 2.0 * L * dev / 3.0
    return (b + np.sqrt(b * b + 8.0 * n * L * var)) / (2.0 * n)


def bernstein_z(n, var, dev, delta, second=None):
    r"""A z threshold that holds at any ``n`` for a mean of bounded values (Bernstein).

    :func:`bernstein_halfwidth` in units of the z-score's denominator:
    :math:`\varepsilon / \sqrt{\sigma^2/n}` with the caller's ``var`` (0 where
    ``var <= 0``: a constant, which :func:`z_score` judges to rounding). Near
    :math:`\sqrt{2\log(2/\delta)}` for light tails; much larger for a value that is
    rarely non-zero (a skewed, spiky distribution, where the normal tail would be
    optimistic).

    Example:
        >>> round(float(bernstein_z(10**6, 1.0, 1.0, 1e-6)), 2)
        5.39
    """
    var = np.asarray(var, dtype=float)
    eps = bernstein_halfwidth(n, var, dev, delta, second)
    pos = var > 0
    return np.where(pos, eps / np.sqrt(np.where(pos, var, 1.0) / n), 0.0)


def bernstein_ratio(diff, n, var, dev, delta, mean):
    r"""``|diff| / t`` for Monte Carlo errors ``diff`` of means of bounded values: pass where <= 1.

    :math:`t = \max(\varepsilon, \text{ROUNDING\_RTOL}\cdot s)`: the Bernstein half-width
    :func:`bernstein_halfwidth` (with :math:`E[x^2] = \sigma^2 + \mu^2`), floored at the
    rounding level of the quantity, :math:`s = \max(|\mu| + M)` over the array (a bound
    on the largest per-sample value). A value whose variance and range are rounding
    noise (a constant) is thus compared to rounding, never divided by a noise-sized
    :math:`\varepsilon`. Where :math:`t = 0` (all values exactly 0) the ratio is 0 if
    ``diff == 0`` else ``inf``.

    Args:
        diff: estimate minus exact mean, any shape.
        n: draws per estimate.
        var, dev: exact variance and largest deviation :math:`M` of the per-sample value.
        delta: false-failure probability of each entry.
        mean: exact mean :math:`\mu`.

    Returns:
        array of ratios, the shape of ``diff``.

    Example:
        >>> bernstein_ratio(np.array([5e-16, 0.0]), 4000, np.array([-3e-18, 0.0]),
        ...                 np.array([3e-17, 0.0]), 1e-6, np.array([0.5, 0.0])).tolist()
        [0.001, 0.0]
    """
    diff = np.abs(np.asarray(diff, dtype=float))
    mean = np.asarray(mean, dtype=float)
    var = np.asarray(var, dtype=float)
    dev = np.abs(np.asarray(dev, dtype=float))
    eps = bernstein_halfwidth(n, var, dev, delta, second=np.maximum(var, 0.0) + mean * mean)
    scale = float(np.max(np.abs(mean) + dev, initial=0.0))
    t = np.maximum(eps, ROUNDING_RTOL * scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t > 0, diff / np.where(t > 0, t, 1.0), np.where(diff == 0, 0.0, np.inf))


def linearised_values(values, w, baseline):
    r"""Per-response values whose mean under ``w`` is each estimand and whose variance
    is its estimator's (leading-order) per-sample variance.

    Linear estimands are their own values (:math:`h`, :math:`h^2`, :math:`\sum_t m`,
    ``R``, :math:`Ah`, :math:`\rho Ah`; the cross terms, ``(M, T, T, P)``, are left to
    :func:`cross_spread`, which never holds them all at once); the covariance, the
    leave-one-out gradient of baseline ``"mean"`` (a sample covariance) and the
    plug-in bound are replaced by their influence values (delta method; the remainder
    is :math:`O(1/n)`).

    Args:
        values: :func:`fisher_ref.monte_carlo.sample_values` of every response.
        w: ``(M,)`` probability of each response under the drawing distribution.
        baseline: the task's baseline (a number or ``"mean"``).

    Returns:
        dict ``{(stream, quantity): x}`` with ``x`` of shape ``(M, ...)``.
    """
    R, rho = values["reward"], values["rho"]
    dR = R - w @ R  # (M,)
    s2 = w @ (dR * dR)
    out = {}
    for s, v in values.items():
        if s in ("reward", "rho"):
            continue
        h, h2 = v["h"], v["h2"]  # (M, P), (M, P)
        F = w @ h2  # (P,)
        cov = dR[:, None] * (h - w @ h)  # (M, P)
        A = dR if baseline == "mean" else R - float(baseline)  # (M,)
        a = np.where(s2 > 0, np.sqrt(F) / (2 * np.sqrt(s2) if s2 > 0 else 1.0), 0.0)  # (P,)
        c = np.where(F > 0, np.sqrt(s2) / (2 * np.sqrt(np.where(F > 0, F, 1.0))), 0.0)  # (P,)
        out.update({
            (s, "score_mean"): h, (s, "sequence_fisher"): h2,
            (s, "token_fisher_sum"): v["token_sum"],
            (s, "expected_reward"): R,
            (s, "gradient"): cov if baseline == "mean" else A[:, None] * h,
            (s, "covariance"): cov, (s, "bound"): a * (dR * dR - s2)[:, None] + c * h2})
        if s == "raw":
            out[(s, "importance_gradient")] = (rho * A)[:, None] * h
    return out


def spread(x, w):
    r"""Mean, variance and largest deviation :math:`\max_{w>0}|x - E x|` of values ``x``
    ``(M, ...)`` under probabilities ``w`` ``(M,)``: a tuple of ``(...)`` arrays."""
    mean = np.tensordot(w, x, axes=1)
    d = x - mean  # (M, ...)
    var = np.tensordot(w, d * d, axes=1)
    pos = w > 0
    if not pos.all():
        d = d[pos]
    return mean, var, np.maximum(d.max(axis=0), -d.min(axis=0))


def cross_spread(xi, w):
    r""":func:`spread` of :math:`\xi_u\xi_t` from scores ``xi`` ``(M, T, P)``, one
    pair ``(u, t)`` at a time: three ``(T, T, P)`` arrays."""
    T = xi.shape[1]
    out = [np.empty((T, T) + xi.shape[2:]) for _ in range(3)]
    for u in range(T):
        for t in range(u, T):
            for arr, val in zip(out, spread(xi[:, u] * xi[:, t], w)):
                arr[u, t] = arr[t, u] = val
    return tuple(out)
