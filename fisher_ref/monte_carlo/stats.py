r"""Statistics for the Monte Carlo engine: estimates with standard errors, z-scores.

Every Monte Carlo quantity is a mean of ``n`` independent per-sample values
:math:`x_1..x_n` (or a smooth function of such means). Its standard error is

.. math:: \mathrm{se} = \sqrt{\widehat{\mathrm{Var}}(x) / n},

with the sample variance (``ddof=1``); for a smooth function :math:`g` of
means the per-sample *influence values* :math:`\nabla g \cdot (x_i - \bar x)`
take the place of :math:`x_i` (the delta method).

A z-score holds an estimate against the exact value with the **exact**
variance of the per-sample value, so it is :math:`N(0, 1)` up to the error of
the central limit theorem:

.. math:: z = (\bar x - E[x]) / \sqrt{\mathrm{Var}(x) / n}.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Estimate", "MCResult", "bonferroni_z", "mean_estimate", "cross_estimate",
           "advantage_estimates", "z_score", "running_estimates", "stream_z_scores",
           "bernstein_halfwidth", "bernstein_z", "bernstein_ratio",
           "linearised_values", "spread", "cross_spread", "variance_reduction", "exact_variance_reduction",
           "EXACT_VARIANCE", "SAMPLE_SE", "ZERO_VAR_RTOL", "ROUNDING_RTOL"]

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


@dataclass(frozen=True)
class Estimate:
    """A Monte Carlo estimate: point value ``mean``, standard error ``se``, sample size ``n``.

    ``mean`` and ``se`` have the shape of the estimand (scalar, ``(P,)``, ``(T, T, P)``).
    """

    mean: np.ndarray
    se: np.ndarray
    n: int

    def interval(self, z=1.959963984540054):
        """The nominal interval ``mean -/+ z se`` (95% by default): ``(lo, hi)``."""
        return self.mean - z * self.se, self.mean + z * self.se


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


def _se_from_values(x, axis=0):
    n = x.shape[axis]
    if n < 2:
        return np.full(np.delete(x.shape, axis), np.nan) if x.ndim > 1 else np.float64(np.nan)
    return np.std(x, axis=axis, ddof=1) / np.sqrt(n)


def mean_estimate(x):
    r"""Sample mean of per-sample values ``x`` ``(n, ...)``, se = std(x, ddof=1) / sqrt(n).

    Example:
        >>> e = mean_estimate(np.array([1.0, 2.0, 3.0, 4.0]))
        >>> float(e.mean), round(float(e.se), 4), e.n
        (2.5, 0.6455, 4)
    """
    x = np.asarray(x, dtype=float)
    return Estimate(x.mean(axis=0), _se_from_values(x), x.shape[0])


def cross_estimate(xi):
    r"""Mean and se of :math:`\xi_u\xi_t` over samples, from scores ``xi`` ``(n, T, P)``.

    Returns:
        :class:`Estimate` of shape ``(T, T, P)`` (the diagonal holds :math:`\xi_t^2`).
    """
    n, T, P = xi.shape
    mean, second = np.empty((T, T, P)), np.empty((T, T, P))
    for u in range(T):
        for t in range(u, T):
            prod = xi[:, u] * xi[:, t]  # (n, P)
            mean[u, t] = mean[t, u] = prod.mean(axis=0)
            second[u, t] = second[t, u] = (prod * prod).mean(axis=0)
    if n < 2:
        return Estimate(mean, np.full_like(mean, np.nan), n)
    var = np.maximum(second - mean * mean, 0.0) * n / (n - 1)
    return Estimate(mean, np.sqrt(var / n), n)


def advantage_estimates(R, h, h2):
    r"""Covariance, plug-in bound and correlation of the advantage with the score.

    - ``covariance``: unbiased :math:`\widehat{\mathrm{Cov}}(A, h_i)` (a constant
      shift of ``A`` does not matter, so ``R`` is used), influence values
      :math:`(R_k - \bar R)(h_{k,i} - \bar h_i) - \widehat{\mathrm{Cov}}`;
    - ``bound``: :math:`B = s\sqrt{F}`, :math:`s^2 = \overline{(R-\bar R)^2}`,
      :math:`F = \overline{h^2}`, influence
      :math:`\frac{\sqrt F}{2s}\big((R_k-\bar R)^2 - s^2\big) + \frac{s}{2\sqrt F}(h^2_k - F)`
      (a term whose denominator is 0 counts 0);
    - ``correlation``: :math:`|\widehat{\mathrm{Cov}}| / B` with the covariance
      normalised by ``n`` (so it is at most 1, by Cauchy–Schwarz), influence by the
      quotient rule. Not smooth where the covariance is 0, so its se means little there.

    Args:
        R: ``(n,)`` rewards; h: ``(n, P)`` scores; h2: ``(n, P)`` their squares.

    Returns:
        dict ``covariance``, ``bound``, ``correlation``: :class:`Estimate` ``(P,)``;
        each se is the delta-method one (std of the influence values over sqrt(n)).

    Example:
        >>> R = np.array([0.0, 1.0, 0.0, 1.0]); h = np.array([[-1.0], [1.0], [-1.0], [1.0]])
        >>> e = advantage_estimates(R, h, h * h)
        >>> [float(e[k].mean[0]) for k in ("covariance", "bound", "correlation")]
        [0.6666666666666666, 0.5, 1.0]
    """
    n = R.shape[0]
    dR = R - R.mean()  # (n,)
    infl_cov = dR[:, None] * (h - h.mean(axis=0))  # (n, P)
    cov = infl_cov.sum(axis=0) / max(n - 1, 1)  # (P,)
    infl_cov -= cov
    dR2 = dR * dR
    s2, F = dR2.mean(), h2.mean(axis=0)  # (), (P,)
    s, rF = np.sqrt(s2), np.sqrt(F)
    B = s * rF  # (P,)
    a = np.where(s > 0, rF / (2 * s if s > 0 else 1.0), 0.0)  # (P,)
    c = np.where(rF > 0, s / (2 * np.where(rF > 0, rF, 1.0)), 0.0)  # (P,)
    infl_b = a[None, :] * (dR2 - s2)[:, None] + c[None, :] * (h2 - F)  # (n, P)
    pos = B > 0
    Bs = np.where(pos, B, 1.0)
    corr = np.where(pos, np.abs(cov) * (n - 1) / n / Bs, 0.0)  # (P,); <= 1 by Cauchy-Schwarz
    infl_c = np.where(pos, (np.sign(cov) * infl_cov - corr * infl_b) / Bs, 0.0)  # (n, P)
    return {"covariance": Estimate(cov, _se_from_values(infl_cov), n),
            "bound": Estimate(B, _se_from_values(infl_b), n),
            "correlation": Estimate(corr, _se_from_values(infl_c), n)}


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


def running_estimates(samples, exact=None):
    r"""Running mean and se of per-sample values, for convergence plots.

    ``mean[k] = (1/(k+1)) sum_{i<=k} x_i`` and ``se[k]`` the sample std of the
    first ``k+1`` values (``ddof=1``) over :math:`\sqrt{k+1}` (NaN at ``k = 0``).

    Args:
        samples: ``(n, ...)`` per-sample values (e.g. ``mc.samples["policy"]["h2"]``).
        exact: optional exact value (broadcastable to ``samples.shape[1:]``).

    Returns:
        dict of arrays: ``n`` ``(n,)`` (1..n), ``mean`` and ``se`` ``(n, ...)``; with
        ``exact`` also ``error = mean - exact`` and ``z = error / se``.

    Example:
        >>> r = running_estimates(np.array([1.0, 3.0, 2.0]), exact=2.0)
        >>> r["mean"].tolist(), r["error"].tolist()
        ([1.0, 2.0, 2.0], [-1.0, 0.0, 0.0])
    """
    x = np.asarray(samples, dtype=float)
    if x.ndim < 1 or x.shape[0] < 1:
        raise ValueError(f"samples must be an (n, ...) array with n >= 1, got shape {x.shape}")
    k = np.arange(1, x.shape[0] + 1, dtype=float).reshape((-1,) + (1,) * (x.ndim - 1))
    y = x - x.mean(axis=0)  # shifted: same variance, less cancellation
    mean = np.cumsum(x, axis=0) / k  # (n, ...)
    ym = np.cumsum(y, axis=0) / k
    with np.errstate(divide="ignore", invalid="ignore"):
        var = (np.cumsum(y * y, axis=0) - k * ym * ym) / (k - 1)  # (n, ...)
        se = np.sqrt(np.maximum(var, 0.0) / k)
    se[0] = np.nan
    out = {"n": k.reshape(-1).astype(int), "mean": mean, "se": se}
    if exact is not None:
        out["error"] = mean - np.asarray(exact, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out["z"] = out["error"] / se
    return out


class MCResult:
    """Monte Carlo estimates of one run.

    Attributes:
        streams: ``{stream: {quantity: Estimate}}``; streams ``"policy"`` (drawn from
            ``p``) or ``"raw"`` and ``"centered"`` (drawn from ``mu``); quantities
            ``score_mean``, ``sequence_fisher``, ``token_fisher_sum``, ``cross_terms``
            ``(T, T, P)``, ``gradient``, ``covariance``, ``bound``, ``correlation``
            (``(P,)``), ``expected_reward`` (scalar) and, on ``"raw"``,
            ``importance_gradient``.
        samples: with ``keep_samples``, ``{stream: {"h", "h2", "token_sum", "Ah" (n, P),
            "xi" (n, T, P), "reward", "advantage" (n,)}}`` (``"rho"``, ``"rhoAh"`` on raw).
        draws: the sampled ``tokens`` ``(n, T)`` and ``prompt`` ``(n,)``.
        n, from_sampler, seconds, task.
    """

    def __init__(self, task, n, from_sampler, streams, draws, samples, seconds):
        self.task, self.n, self.from_sampler = task, n, from_sampler
        self.streams, self.draws, self.samples, self.seconds = streams, draws, samples, seconds

    def _policy(self, name):
        if "policy" not in self.streams:
            raise AttributeError(
                f"{name}: this run drew from the sampler mu, so it has no 'policy' stream "
                "(use streams['raw'] / streams['centered'], or estimate(..., use_sampler=False))")
        return self.streams["policy"][name]

    score_mean = property(lambda self: self._policy("score_mean"))
    sequence_fisher = property(lambda self: self._policy("sequence_fisher"))
    token_fisher_sum = property(lambda self: self._policy("token_fisher_sum"))
    cross_terms = property(lambda self: self._policy("cross_terms"))
    gradient = property(lambda self: self._policy("gradient"))
    covariance = property(lambda self: self._policy("covariance"))
    bound = property(lambda self: self._policy("bound"))
    correlation = property(lambda self: self._policy("correlation"))
    expected_reward = property(lambda self: self._policy("expected_reward"))

    def z_scores(self, exact_result):
        r"""``{(stream, quantity): z}`` against ``exact_result`` (same task).

        :math:`z = (\text{mean} - \text{exact}) / \sqrt{\mathrm{Var}/n}` with the exact
        per-sample variance (:data:`EXACT_VARIANCE`; for ``gradient`` only with a
        constant baseline). ``covariance``, ``bound``, ``importance_gradient`` and
        ``gradient`` under baseline ``"mean"`` have no exact variance and use the
        sample se instead (:math:`z \approx t_{n-1}`). Zero variance: see
        :func:`fisher_ref.monte_carlo.stats.z_score`. A value that is rarely non-zero has
        heavy tails, and its z is far from normal at moderate ``n``:
        :func:`fisher_ref.monte_carlo.check_monte_carlo` allows for that.
        """
        return stream_z_scores(self.streams, exact_result, self.n,
                               mean_baseline=self.task.baseline == "mean")


def stream_z_scores(streams, exact_result, n, mean_baseline=False):
    r"""``{(stream, quantity): z}`` of Monte Carlo ``streams`` against ``exact_result``.

    Quantities of :data:`EXACT_VARIANCE` use the exact per-sample variance (for
    ``gradient`` only with a constant baseline: the leave-one-out advantage of
    baseline ``"mean"`` has another variance when :math:`E[h] \ne 0`); those of
    :data:`SAMPLE_SE` and that gradient use the sample se (:math:`z \approx t_{n-1}`).
    ``correlation`` is left out (not smooth where the covariance is 0).
    """
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


def variance_reduction(mc, stream=None):
    r"""Per-parameter :math:`\widehat{\mathrm{Var}}(h^2) / \widehat{\mathrm{Var}}(\sum_t m(s_t))`
    from the sample ses: how many times fewer samples the Rao–Blackwellised estimator needs.

    ``inf`` where only the token sum is constant, ``nan`` where both are.
    """
    stream = stream or ("policy" if "policy" in mc.streams else "centered")
    e = mc.streams[stream]
    with np.errstate(divide="ignore", invalid="ignore"):
        return e["sequence_fisher"].se ** 2 / e["token_fisher_sum"].se ** 2  # (P,)


def exact_variance_reduction(exact_result, stream="policy"):
    r"""Exact :math:`\mathrm{Var}(h^2) / \mathrm{Var}(\sum_t m(s_t))` per parameter, ``(P,)``."""
    v = exact_result.streams[stream].variances
    with np.errstate(divide="ignore", invalid="ignore"):
        return v["h2"] / v["token_sum"]


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
