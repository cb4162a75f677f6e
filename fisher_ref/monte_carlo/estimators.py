r"""Statistics for the Monte Carlo engine: estimates with standard errors, z-scores.

Every Monte Carlo quantity is a mean of ``n`` independent per-sample values
:math:`x_1..x_n` (or a smooth function of such means). Its standard error is

.. math:: \mathrm{se} = \sqrt{\widehat{\mathrm{Var}}(x) / n},

with the sample variance (``ddof=1``); for a smooth function :math:`g` of
means the per-sample *influence values* :math:`\nabla g \cdot (x_i - \bar x)`
take the place of :math:`x_i` (the delta method).

The z-tests against exact values are :mod:`fisher_ref.monte_carlo.ztests`.
"""
from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np

from fisher_ref.monte_carlo.ztests import stream_z_scores

__all__ = ["Estimate", "MCResult", "mean_estimate", "cross_estimate", "advantage_estimates",
           "running_estimates", "variance_reduction", "exact_variance_reduction"]


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


def _se_from_values(x, axis=0):
    """std(x, ddof=1) / sqrt(n) along ``axis``, the deviations divided by a power of two of
    their size before they are squared (exact), so values of 1e-170 do not underflow."""
    n = x.shape[axis]
    if n < 2:
        return np.full(np.delete(x.shape, axis), np.nan) if x.ndim > 1 else np.float64(np.nan)
    dev = x - x.mean(axis=axis, keepdims=True)
    top = np.max(np.abs(dev), axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):  # 0 only where every deviation is 0
        unit = np.where(top > 0, np.exp2(np.ceil(np.log2(np.where(top > 0, top, 1.0)))), 1.0)
    var = np.sum((dev / unit) ** 2, axis=axis, keepdims=True) / (n - 1)  # in units of unit^2
    return np.squeeze(unit * np.sqrt(var), axis=axis) / np.sqrt(n)


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
    # in units of a power of two u of the deviations (exact), so that the squares of
    # rewards of 1e-170 do not underflow; covariance and bound scale with u, and so do
    # their influence values, the correlation not at all
    top = float(np.max(np.abs(dR), initial=0.0))
    u = float(2.0 ** math.frexp(top)[1]) if 0 < top < math.inf else 1.0
    dR = dR / u
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
    return {"covariance": Estimate(u * cov, u * _se_from_values(infl_cov), n),
            "bound": Estimate(u * B, u * _se_from_values(infl_b), n),
            "correlation": Estimate(corr, _se_from_values(infl_c), n)}


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
        :func:`fisher_ref.monte_carlo.ztests.z_score`. A value that is rarely non-zero has
        heavy tails, and its z is far from normal at moderate ``n``:
        :func:`fisher_ref.monte_carlo.check_monte_carlo` allows for that.
        """
        return stream_z_scores(self.streams, exact_result, self.n,
                               mean_baseline=self.task.baseline == "mean")


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


