r"""Bennett's inequality for the mean of bounded i.i.d. steps: a tail bound that needs no
normal approximation. Numpy only.

For i.i.d. :math:`X_1..X_n` with mean :math:`\mu`, variance :math:`\sigma^2` and
:math:`X - \mu \le b` almost surely (Bennett, 1962),

.. math:: P(\bar X - \mu \ge t) \le \exp\!\Big(-\frac{n\sigma^2}{b^2}\,
   h\Big(\frac{b t}{\sigma^2}\Big)\Big), \qquad h(u) = (1 + u)\log(1 + u) - u .

fisher_ref enumerates every batch a sampler can draw, so :math:`\mu`, :math:`\sigma^2` and
the range of one step's gradient are exact, and the bound holds for any ``n``: heavy tails
(a gradient carried by rare groups) make it wider, never wrong. For small
:math:`bt/\sigma^2` it is the normal tail :math:`\exp(-n t^2/2\sigma^2)`; for large, the
Poisson tail of a count of rare groups.
"""
from __future__ import annotations

import numpy as np

__all__ = ["bennett_h", "bennett_log_tail", "bennett_threshold", "two_sided_test"]


def bennett_h(u):
    r""":math:`h(u) = (1 + u)\log(1 + u) - u` for ``u >= 0`` (a series below 1e-4, where the
    formula cancels)."""
    u = np.asarray(u, dtype=np.float64)
    small = u < 1e-4
    with np.errstate(invalid="ignore"):
        big = (1.0 + u) * np.log1p(u) - u
    series = u * u * (0.5 - u / 6.0 + u * u / 12.0)
    return np.where(small, series, big)


def bennett_log_tail(t, sigma, b, n):
    r"""The log of Bennett's bound on :math:`P(\bar X - \mu \ge t)`, elementwise:
    :math:`-\frac{n\sigma^2}{b^2} h(bt/\sigma^2)` (0 for ``t <= 0``).

    Args:
        t: deviations ``>= 0``; sigma: standard deviations ``> 0``; b: one-sided bounds
            on :math:`X - \mu`, ``> 0``; n: the number of steps averaged.

    Example:
        >>> import numpy as np
        >>> float(np.exp(bennett_log_tail(0.0, 1.0, 1.0, 10)))
        1.0
    """
    t, sigma, b = (np.asarray(a, dtype=np.float64) for a in (t, sigma, b))
    t = np.maximum(t, 0.0)
    return -n * sigma ** 2 / b ** 2 * bennett_h(b * t / sigma ** 2)


def bennett_threshold(sigma, b, n, q):
    r"""The deviation :math:`t` at which Bennett's bound on :math:`P(\bar X - \mu \ge t)`
    equals ``q``, elementwise (bisection on :math:`h`, monotone on ``u >= 0``).

    Example:
        >>> round(float(bennett_threshold(1.0, 1e-9, 10 ** 6, 0.05)) * 1000, 4)  # normal
        2.4477
    """
    sigma, b = (np.asarray(a, dtype=np.float64) for a in (sigma, b))
    c = np.log(1.0 / q) * b ** 2 / (n * sigma ** 2)  # h(u) = c
    lo, hi = np.zeros_like(c), np.ones_like(c)
    while True:  # h(hi) >= c everywhere (h grows like u log u)
        short = bennett_h(hi) < c
        if not short.any():
            break
        hi = np.where(short, hi * 2.0, hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        below = bennett_h(mid) < c
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return hi * sigma ** 2 / b


def two_sided_test(dev, sigma, b_up, b_down, n, alpha):
    r"""Bonferroni over ``m`` coordinates of Bennett's two one-sided bounds: coordinate
    ``k`` fails when :math:`d_k > t^+_k` or :math:`-d_k > t^-_k`, each threshold at tail
    :math:`\alpha / 2m`, so that a correct sampler fails with probability at most
    ``alpha`` whatever the distribution within its range.

    Args:
        dev: :math:`\bar X - \mu` ``(m,)``; sigma: ``(m,)`` ``> 0``; b_up, b_down:
            ``(m,)`` bounds on :math:`X - \mu` and :math:`\mu - X`, ``> 0``; n: steps;
            alpha: the false-failure rate.

    Returns:
        ``(failed (m,) bool, z_threshold (m,), log_p (m,))``: the threshold in units of
        :math:`\sigma/\sqrt n` on the side ``dev`` lies, and the log of Bennett's bound at
        the observed deviation on that side.
    """
    dev = np.asarray(dev, dtype=np.float64)
    m = max(dev.size, 1)
    q = alpha / (2 * m)
    up = dev >= 0
    b = np.where(up, b_up, b_down)
    t = bennett_threshold(sigma, b, n, q)
    log_p = bennett_log_tail(np.abs(dev), sigma, b, n)
    return np.abs(dev) > t, t / (sigma / np.sqrt(n)), log_p
