r"""Hold the gradients a trainer applied to the exact covariance of one batch's gradient:
numpy only.

A correct trainer applies, at each step ``s``, an i.i.d. draw :math:`g_s` of the batch
gradient, whose exact mean :math:`\mu` and covariance :math:`\Sigma = U \Lambda U^T`
fisher_ref enumerates (``expected_loss_gradient(..., covariance=True)``). By the central
limit theorem the mean :math:`\bar g` of ``n`` steps is then about
:math:`N(\mu, \Sigma / n)`, so on the ``m`` principal directions :math:`u_k` kept

.. math:: X^2 = \sum_{k=1}^{m} \frac{\big(u_k^T(\bar g - \mu)\big)^2}{\lambda_k / n}
   \;\sim\; \chi^2_m .

The per-parameter z test divides by :math:`\Sigma_{ii}`, which the high-variance
directions dominate; a bias along a low-variance direction :math:`u_k` is invisible there
but weighs :math:`1/\lambda_k` here. The covariance is exact, not estimated, so every
direction above rounding can be used (Hotelling's :math:`T^2` with the sample covariance
needs ``n`` well above ``P``).

The chi-square leans on the central limit theorem in every direction, which heavy tails
break (a direction carried by rare groups). ``method="bennett"`` (the default) needs no
such approximation: with the enumerated distribution it knows each direction's exact range
:math:`[\min_b u_k^T(g_b - \mu), \max_b u_k^T(g_b - \mu)]`, and holds each
:math:`u_k^T(\bar g - \mu)` to Bennett's bound (:mod:`fisher_ref.bennett`) on both sides at
tail :math:`\alpha / 2m`, so a correct sampler fails with probability at most ``alpha``
at any number of steps. ``method="chi2"`` keeps the sum above, with the kurtosis rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fisher_ref.applied_gradient import SUPPORT_RTOL
from fisher_ref.bennett import two_sided_test
from fisher_ref.verdict import Verdict

__all__ = ["CovarianceVerdict", "check_applied_covariance", "chi2_sf", "MIN_STEPS",
           "RELATIVE_FLOOR", "MAX_KURTOSIS_PER_STEP", "METHODS"]

#: ``"bennett"``: the largest direction's deviation against Bennett's bound (rate at most
#: ``alpha``, needs the distribution); ``"chi2"``: the sum of squares, normal approximation.
METHODS = ("bennett", "chi2")

#: Fewest steps accepted (the central limit theorem is what the test stands on).
MIN_STEPS = 30
#: Directions with :math:`\lambda_k \le` this times :math:`\lambda_{max}` are rounding,
#: not variance, and are left out.
RELATIVE_FLOOR = 1e-10
#: With the enumerated distribution given, a direction is used only when its excess
#: kurtosis :math:`\kappa_k \le` this times the steps: a direction carried by groups of
#: probability ``q`` has :math:`\kappa \approx 1/q`, so it then sees ``q n >= 100``
#: such groups and their Poisson count stays normal out to the 1e-6 tail.
MAX_KURTOSIS_PER_STEP = 0.01


def _gamma_series(a, x):
    """The regularized lower incomplete gamma :math:`P(a, x)` by its series (x < a + 1)."""
    term = total = 1.0 / a
    n = a
    for _ in range(10000):
        n += 1.0
        term *= x / n
        total += term
        if abs(term) < abs(total) * 1e-17:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_fraction(a, x):
    """The regularized upper incomplete gamma :math:`Q(a, x)` by Lentz's continued
    fraction (x >= a + 1)."""
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(x, df):
    r"""The chi-square tail :math:`P(\chi^2_{df} > x) = Q(df/2, x/2)`, the regularized upper
    incomplete gamma, by its series or its continued fraction (relative error ~1e-13).

    Example:
        >>> round(chi2_sf(3.841458820694124, 1), 12)
        0.05
    """
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    if x <= 0:
        return 1.0
    a, h = 0.5 * df, 0.5 * x
    return 1.0 - _gamma_series(a, h) if h < a + 1.0 else _gamma_fraction(a, h)


@dataclass
class CovarianceVerdict(Verdict):
    r"""What :func:`check_applied_covariance` found; true when the samples passed.

    Attributes:
        method: ``"bennett"`` or ``"chi2"``.
        passed: with ``"chi2"``, ``p_value >= alpha``; with ``"bennett"``, every direction
            within its threshold (``statistic <= 1``).
        kurtosis: the directions' excess kurtosis ``(m,)`` when the distribution was
            given, else ``None``; ``excluded``: directions above the floor left out for
            their kurtosis.
        statistic: :math:`X^2` (``"chi2"``), or the largest :math:`|z_k|` over its
            Bennett threshold (``"bennett"``).
        m: the directions used (the degrees of freedom).
        p_value: :math:`P(\chi^2_m > X^2)`, or Bonferroni's bound
            :math:`\min(1, 2m\min_k q_k)` on Bennett's one-sided tails :math:`q_k` at the
            observed deviations.
        alpha: the false-failure rate asked for.
        eigenvalues: :math:`\lambda_k` of the directions used ``(m,)``, largest first.
        z: :math:`u_k^T(\bar g - \mu) / \sqrt{\lambda_k / n}` per direction ``(m,)``.
        steps: ``n``.
        null_rms: the root mean square of the samples' deviation from :math:`\mu` off the
            directions above the floor (or the ``directions`` asked), over
            :math:`\sqrt{\lambda_{max}}`; reported, not judged.
    """

    passed: bool
    statistic: float
    m: int
    p_value: float
    alpha: float
    eigenvalues: np.ndarray
    z: np.ndarray
    steps: int
    null_rms: float
    kurtosis: np.ndarray | None = None
    excluded: int = 0
    method: str = "chi2"

    @property
    def message(self):
        """The verdict and its numbers, on one line."""
        k = int(np.argmax(np.abs(self.z))) if self.m else 0
        worst = f", worst direction {k} (lambda={self.eigenvalues[k]:.3g}, " \
            f"z={self.z[k]:+.2f})" if self.m else ""
        what = "chi2" if self.method == "chi2" else "max |z|/Bennett threshold"
        return (f"{'PASS' if self.passed else 'FAIL'}: {what}={self.statistic:.4g} on "
                f"m={self.m} directions over {self.steps} steps, p={self.p_value:.3g} "
                f"(alpha={self.alpha:g}){worst}")


def _exact_parts(exact, P):
    mean = np.asarray(getattr(exact, "mean", None) if not isinstance(exact, tuple)
                      else exact[0], dtype=np.float64)
    cov = getattr(exact, "covariance", None) if not isinstance(exact, tuple) else exact[1]
    if cov is None:
        raise ValueError("exact has no covariance: compute it with "
                         "expected_loss_gradient(..., covariance=True)")
    cov = np.asarray(cov, dtype=np.float64)
    if mean.shape != (P,) or cov.shape != (P, P):
        raise ValueError(f"exact.mean {mean.shape} and exact.covariance {cov.shape} must be "
                         f"({P},) and ({P}, {P}), the samples' width P = {P}")
    if not (np.isfinite(mean).all() and np.isfinite(cov).all()):
        raise ValueError("exact.mean or exact.covariance has NaN or infinite entries")
    return mean, cov


def _projected(distribution, mean, U, P):
    """``(y (N, m), probabilities (N,))``: every enumerated gradient's deviation from the
    mean on the directions ``U``."""
    try:
        g, p = (np.asarray(a, dtype=np.float64) for a in distribution)
    except (TypeError, ValueError) as e:
        raise ValueError("distribution must be (gradients (N, P), probabilities (N,)), as "
                         "enumerated_gradients returns") from e
    if g.ndim != 2 or g.shape[1] != P or p.shape != (len(g),):
        raise ValueError(f"distribution must be (gradients (N, {P}), probabilities (N,)), "
                         f"got shapes {g.shape} and {p.shape}")
    scale = max(float(np.abs(g).max(initial=0.0)), 1e-300)
    if (p < 0).any() or abs(p.sum() - 1) > 1e-9 or \
            np.abs(p @ g - mean).max(initial=0.0) > 1e-8 * scale:
        raise ValueError("distribution is not that of exact: its probabilities must be >= 0 "
                         "and sum to 1, and its mean must be exact.mean (another task, loss, "
                         "group size or groups_per_batch?)")
    return (g - mean) @ U, p  # (N, m), (N,)


def _kurtosis(y, p, lam):
    """The excess kurtosis of each direction ``(m,)`` under the enumerated distribution."""
    return (p @ y ** 4) / p.sum() / lam ** 2 - 3.0


def check_applied_covariance(samples, exact, *, alpha=1e-6, directions=None,
                             distribution=None, max_kurtosis=MAX_KURTOSIS_PER_STEP,
                             method="bennett", min_steps=MIN_STEPS):
    r"""Test the mean of the gradients a trainer applied against the exact mean, on the
    principal directions of the exact covariance (see the module).

    With ``method="bennett"`` (the default; ``distribution`` required) each direction's
    deviation is held to Bennett's bound from its exact variance and range, Bonferroni over
    the directions: a correct sampler fails with probability at most ``alpha``, whatever
    the tails and the number of steps. With ``method="chi2"``:
    under a correct sampler :math:`X^2` is :math:`\chi^2_m` up to the central limit
    theorem's error, so the false-failure rate is ``alpha`` (1e-6 by default) where the
    CLT holds on every direction used. It does not on a direction carried by rare groups
    (heavy-tailed: GRPO, where most groups have equal rewards and a zero gradient): one such
    group among ``n`` steps is a spike of :math:`z \approx 1/\sqrt{q n}`. Give the
    enumerated ``distribution`` and the directions whose excess kurtosis passes
    ``max_kurtosis * steps`` are the only ones used. The tests measure the rate at
    ``alpha = 0.05`` on correct samplers; docs/check/applied_gradient.md shows how far
    off it is without the kurtosis rule on a heavy-tailed task.

    Args:
        samples: the per-step applied gradients ``(steps, P)``, ``steps >=``
            ``min_steps``, or a recorder that kept them
            (:class:`fisher_ref.torch.GradientRecorder`).
        exact: a ``LossGradient`` with ``covariance`` (or a ``(mean, covariance)`` pair),
            ``(P,)`` and ``(P, P)``.
        alpha: the false-failure rate, in (0, 1).
        directions: how many principal directions to use, largest variance first
            (``None``: every direction above :data:`RELATIVE_FLOOR` of the largest).
        distribution: ``(gradients (N, P), probabilities (N,))``, every batch's gradient
            and probability (``fisher_ref.estimators.enumerated_gradients``): the ranges
            Bennett's bound needs, or, with ``"chi2"``, to keep only the directions where
            the CLT holds at this many steps.
        max_kurtosis: with ``"chi2"``, a direction is kept when its excess kurtosis
            :math:`\kappa_k \le` ``max_kurtosis * steps``.
        method: ``"bennett"`` or ``"chi2"`` (:data:`METHODS`).
        min_steps: fewest steps judged (the chi-square's floor; Bennett's bound holds at
            any number, but one step is more likely a mistake than a test).

    Returns:
        :class:`CovarianceVerdict`, true when passing.

    Raises:
        ValueError: too few steps, a wrong width, a bad ``alpha``, ``directions``,
            ``distribution``, ``max_kurtosis`` or ``method``, ``"bennett"`` without the
            distribution, no covariance, a zero covariance where the samples vary, or no
            direction passing the kurtosis rule.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> cov = np.diag([4.0, 1.0, 0.01])
        >>> g = rng.multivariate_normal([1.0, 0.0, 0.0], cov, size=200)
        >>> exact = (np.array([1.0, 0.0, 0.0]), cov)
        >>> bool(check_applied_covariance(g, exact, method="chi2"))
        True
        >>> bool(check_applied_covariance(g + [0, 0, 0.05], exact, method="chi2"))
        False
    """
    if hasattr(samples, "running_sums"):  # a recorder
        samples = samples.samples()
        if samples is None:
            raise ValueError("the recorder kept no steps (keep_samples=False): the covariance "
                             "test needs them")
    g = np.asarray(samples, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"samples must be (steps, P), got shape {g.shape}")
    n, P = g.shape
    if isinstance(min_steps, bool) or not isinstance(min_steps, (int, np.integer)) \
            or min_steps < 2:
        raise ValueError(f"min_steps must be an integer >= 2, got {min_steps!r}")
    if n < min_steps:
        raise ValueError(f"samples: {n} steps, fewer than min_steps={min_steps} (the central "
                         f"limit theorem's floor for the chi-square)")
    if not np.isfinite(g).all():
        raise ValueError("samples has NaN or infinite entries")
    if isinstance(alpha, bool) or not isinstance(alpha, (float, int)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if isinstance(max_kurtosis, bool) or not isinstance(max_kurtosis, (float, int)) \
            or not max_kurtosis > 0:
        raise ValueError(f"max_kurtosis must be a number > 0, got {max_kurtosis!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "bennett" and distribution is None:
        raise ValueError("method='bennett' needs distribution=(gradients, probabilities) "
                         "(fisher_ref.estimators.enumerated_gradients) for each direction's "
                         "range; or pass method='chi2' (a normal approximation)")
    mean, cov = _exact_parts(exact, P)
    lam, U = np.linalg.eigh((cov + cov.T) / 2)  # ascending
    lam, U = lam[::-1], U[:, ::-1]
    top = lam[0] if P else 0.0
    if not top > 0:
        spread = float(np.abs(g - g[0]).max())
        raise ValueError(f"exact.covariance is zero but the samples vary (max spread "
                         f"{spread:.3g}); the exact result is not that of these samples")
    keep = int((lam > RELATIVE_FLOOR * top).sum())
    if directions is not None:
        if isinstance(directions, bool) or not isinstance(directions, (int, np.integer)) \
                or not 1 <= directions <= keep:
            raise ValueError(f"directions must be an integer in [1, {keep}] (the directions "
                             f"above the floor), got {directions!r}")
        keep = int(directions)
    d = g.mean(axis=0) - mean  # (P,)
    if method == "bennett":
        return _bennett(g, d, lam[:keep], U, keep, top, mean, distribution, alpha, P)
    kurt, excluded, used = None, 0, np.arange(keep)
    if distribution is not None:
        y, p = _projected(distribution, mean, U[:, :keep], P)
        every = _kurtosis(y, p, lam[:keep])  # (keep,)
        used = np.flatnonzero(every <= max_kurtosis * n)
        if len(used) == 0:
            raise ValueError(
                f"distribution: no direction's excess kurtosis is within max_kurtosis * "
                f"steps = {max_kurtosis * n:.3g} (the smallest is {every.min():.3g}): the "
                f"central limit theorem needs about {math.ceil(every.min() / max_kurtosis):,} "
                f"steps here")
        excluded, kurt = keep - len(used), every[used]
    lam_u, U_u = lam[used], U[:, used]  # (m,), (P, m)
    z = (U_u.T @ d) / np.sqrt(lam_u / n)  # (m,)
    stat = float(z @ z)
    null_rms = _null_rms(g, mean, U[:, :keep], top)
    m = len(used)
    p = chi2_sf(stat, m)
    return CovarianceVerdict(passed=p >= alpha, statistic=stat, m=m, p_value=p,
                             alpha=float(alpha), eigenvalues=lam_u.copy(), z=z, steps=n,
                             null_rms=null_rms, kurtosis=kurt, excluded=excluded)


def _null_rms(g, mean, U, top):
    r"""RMS of the samples' deviation off the directions ``U``, over
    :math:`\sqrt{\lambda_{max}}`."""
    dev = g - mean  # (n, P)
    off = dev - (dev @ U) @ U.T  # (n, P)
    return float(np.sqrt((off ** 2).sum(axis=1).mean() / top))


def _bennett(g, d, lam, U, keep, top, mean, distribution, alpha, P):
    """The ``"bennett"`` verdict on the ``keep`` leading directions."""
    n = g.shape[0]
    Uk = U[:, :keep]  # (P, m)
    y, _ = _projected(distribution, mean, Uk, P)  # (N, m)
    gmax = float(np.abs(distribution[0]).max(initial=0.0))
    slack = SUPPORT_RTOL * max(gmax, 1e-300) * math.sqrt(P)
    b_up = np.maximum(y.max(axis=0), 0.0) + slack
    b_down = np.maximum(-y.min(axis=0), 0.0) + slack
    sd = np.sqrt(lam)
    dev = Uk.T @ d  # (m,)
    _, z_thr, log_q = two_sided_test(dev, sd, b_up, b_down, n, alpha)
    z = dev / (sd / math.sqrt(n))
    ratio = float((np.abs(z) / z_thr).max(initial=0.0))
    p = min(1.0, 2 * keep * math.exp(float(log_q.min(initial=0.0))))
    return CovarianceVerdict(passed=ratio <= 1.0, statistic=ratio, m=keep, p_value=p,
                             alpha=float(alpha), eigenvalues=lam.copy(), z=z, steps=n,
                             null_rms=_null_rms(g, mean, Uk, top), method="bennett")
