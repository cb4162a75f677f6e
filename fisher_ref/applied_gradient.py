r"""Is the gradient a trainer applies, step after step, the exact expected gradient? Numpy only.

A trainer run with its weights frozen (learning rate 0, no clipping) applies at each step
``t`` a gradient :math:`g_t \in \mathbb{R}^P`, an i.i.d. draw whose exact mean :math:`\mu`
and per-parameter variance :math:`\sigma^2` fisher_ref computes by enumeration
(:func:`fisher_ref.estimators.expected_loss_gradient`). :func:`check_applied_gradient`
holds the mean of ``n`` steps to it, parameter by parameter, with the **exact** variance:

.. math:: z_i = \frac{\bar g_i - \mu_i}{\sqrt{\sigma_i^2 / n}}, \qquad
   \text{fail when } \max_i |z_i| > z_{\alpha/(2P')}

with :math:`P'` the parameters of nonzero variance (Bonferroni). Under the normal
approximation of the mean of ``n`` steps, a correct pipeline fails with probability at most
``alpha`` (Bonferroni is conservative: the parameters are correlated). The sample variance
is not used: many groups have equal rewards and give a zero gradient, so over a few steps
the sample spread can be far below the true one and every clean run would fail.

**Where the normal approximation fails.** When a parameter's gradient is carried by rare
groups (heavy tails: a loss like GRPO's, where most groups give 0), the tail of its mean
is far heavier than the normal one that ``alpha`` is read from. On ``offpolicy_stale``
with GRPO, G = 2, a correct sampler failed a per-parameter max |z| with the exact variance
at ``alpha = 1e-6`` in 1-1.4% of 2,000 runs at 5-10 steps (below :data:`MIN_STEPS`) and
0.05-0.1% at 40-300 steps (``benchmarks/estimators/applied_covariance.py``,
record ``docs/bench/estimators/applied_covariance.json``): the stated rate holds only
where each parameter's gradient is light-tailed at the steps used. The covariance test
(``fisher_ref.applied_covariance``) measures the tails from the enumerated distribution
and keeps only the directions where the approximation holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fisher_ref.verdict import Verdict

__all__ = ["MIN_STEPS", "AppliedGradientVerdict", "check_applied_gradient", "steps_needed",
           "normal_quantile"]

#: Fewest steps judged. The test rests on the normal approximation of a mean of ``n`` i.i.d.
#: steps; a step's gradient is a mixture with an atom at zero (groups of equal rewards), and
#: below a few dozen steps its mean is visibly skewed. 30 is the usual floor for a mean's
#: normal approximation; the calibration test measures the false-failure rate above it.
MIN_STEPS = 30
#: Relative tolerance within which a parameter of zero exact variance counts as constant.
_CONSTANT_RTOL = 1e-9


def normal_quantile(q):
    r"""The :math:`z \ge 0` with two-sided tail :math:`P(|N(0,1)| > z) =
    \mathrm{erfc}(z/\sqrt2) = q`, by bisection on ``math.erfc`` (numpy only).

    Example:
        >>> round(normal_quantile(0.05), 6)
        1.959964
    """
    if not 0 < q <= 1:
        raise ValueError(f"the tail probability must be in (0, 1], got {q!r}")
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if math.erfc(mid / math.sqrt(2)) > q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _exact(exact):
    """``(mean, variance)`` float64 ``(P,)`` of a LossGradient (or a pair)."""
    if isinstance(exact, tuple) and len(exact) == 2:
        mean, var = exact
    else:
        mean, var = getattr(exact, "mean", None), getattr(exact, "variance", None)
    if mean is None or var is None:
        raise TypeError(f"exact must be a LossGradient (mean, variance) or a pair of arrays, "
                        f"got {type(exact).__name__}")
    mean, var = np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64)
    if mean.ndim != 1 or var.shape != mean.shape:
        raise ValueError(f"exact.mean and exact.variance must be (P,) arrays of one shape, got "
                         f"{mean.shape} and {var.shape}")
    if (var < 0).any() or not np.isfinite(var).all() or not np.isfinite(mean).all():
        raise ValueError("exact.variance must be finite and >= 0, exact.mean finite")
    return mean, var


def _names(layout, P):
    """``P`` parameter names from a list of names or of ``(name, shape)`` pairs."""
    if layout is None:
        return [f"theta[{i}]" for i in range(P)]
    layout = list(layout)
    if len(layout) == P and all(isinstance(x, str) for x in layout):
        return layout
    names = []
    for item in layout:  # (name, shape) or (name, shape, offset)
        name, shape = item[0], item[1]
        size = int(np.prod(shape))
        names += [name] if size == 1 else [f"{name}[{k}]" for k in range(size)]
    if len(names) != P:
        raise ValueError(f"layout names {len(names)} parameters, the gradients have {P}")
    return names


def _samples(samples):
    """``(sum (P,), sum of squares (P,), n, steps (n, P) or None)`` of an array or a recorder."""
    if hasattr(samples, "running_sums"):
        s, s2, n = samples.running_sums()
        kept = samples.samples()
        return np.asarray(s, np.float64), np.asarray(s2, np.float64), int(n), kept
    a = np.asarray(samples, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"samples must be a (steps, P) array or a recorder, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("samples holds NaN or infinite gradients")
    return a.sum(0), np.square(a).sum(0), a.shape[0], a


@dataclass
class AppliedGradientVerdict(Verdict):
    """What :func:`check_applied_gradient` found; true when the applied gradient passed.

    Attributes:
        passed: ``max |z| <= z_threshold`` and no zero-variance parameter moved.
        steps: steps judged.
        max_abs_z: the largest :math:`|z_i|`.
        z_threshold: :math:`z_{\\alpha/(2P')}`.
        p_value: Bonferroni's, :math:`\\min(1, P'\\,\\mathrm{erfc}(\\max|z|/\\sqrt2))`.
        alpha: the false-failure rate asked for.
        tested: :math:`P'`, parameters of nonzero exact variance.
        scale: least-squares :math:`a` with :math:`\\bar g \\approx a\\,\\mu` (1: right).
        scale_se: its standard error over the steps (``nan`` when the steps were not kept).
        cosine: of :math:`\\bar g` and :math:`\\mu`.
        worst: ``[(name, z), ...]``, the five largest :math:`|z_i|`.
    """

    passed: bool
    steps: int
    max_abs_z: float
    z_threshold: float
    p_value: float
    alpha: float
    tested: int
    scale: float
    scale_se: float
    cosine: float
    worst: list = field(default_factory=list)
    reason: str = ""

    @property
    def message(self):
        """The verdict and its numbers, on one line."""
        head = "PASS" if self.passed else "FAIL"
        worst = ", ".join(f"{n} z={z:+.3g}" for n, z in self.worst[:3])
        out = (f"{head} applied gradient over {self.steps} steps: max|z| {self.max_abs_z:.3g} "
               f"vs {self.z_threshold:.3g} (alpha {self.alpha:.2g}, {self.tested} parameters, "
               f"Bonferroni p {self.p_value:.3g}); scale {self.scale:.4g} +- "
               f"{self.scale_se:.2g}, cosine {self.cosine:.6f}; worst: {worst}")
        return out + (f" ({self.reason})" if self.reason else "")




def check_applied_gradient(samples, exact, *, alpha=1e-6, layout=None, min_steps=MIN_STEPS):
    r"""Judge the gradients a trainer applied against the exact expected gradient.

    The test (see the module): per parameter, :math:`z_i = (\bar g_i - \mu_i)/
    \sqrt{\sigma_i^2/n}` with the exact variance; the run fails when
    :math:`\max_i|z_i|` exceeds the two-sided normal quantile at ``alpha / P'``. A correct
    pipeline fails with probability at most ``alpha`` under the normal approximation of
    the mean of ``n >= min_steps`` steps (Bonferroni is conservative; the calibration
    test measures it). A parameter of zero exact variance must be applied exactly
    :math:`\mu_i` at every step (to 1e-9 relative): constant elsewhere, it fails the run
    with :math:`z = \infty`.

    Args:
        samples: ``(steps, P)`` applied gradients, or a recorder
            (:class:`fisher_ref.torch.GradientRecorder`).
        exact: the :class:`fisher_ref.estimators.LossGradient` of what one step should
            apply (``mean``, ``variance`` per parameter), or a pair ``(mean, variance)``.
        alpha: the false-failure rate.
        layout: parameter names for the report: ``P`` strings, or ``(name, shape)`` blocks
            (``(name, shape, offset)`` as ``task.model.layout()`` gives them) in order.
        min_steps: fewest steps judged.

    Returns:
        :class:`AppliedGradientVerdict`, true when passing.

    Raises:
        ValueError: fewer than ``min_steps`` steps, samples of another width than
            ``exact``, a parameter of zero exact variance whose applied gradient varies,
            an ``alpha`` outside (0, 1).

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> steps = rng.normal([1.0, -2.0], [0.5, 1.0], size=(400, 2))
        >>> bool(check_applied_gradient(steps, (np.array([1.0, -2.0]), np.array([0.25, 1.0]))))
        True
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if isinstance(min_steps, bool) or not isinstance(min_steps, (int, np.integer)) \
            or min_steps < 2:
        raise ValueError(f"min_steps must be an integer >= 2, got {min_steps!r}")
    mean, var = _exact(exact)
    s, s2, n, kept = _samples(samples)
    P = mean.shape[0]
    if s.shape != (P,):
        raise ValueError(f"samples have {s.shape[0]} parameters per step, exact has {P}")
    if n < min_steps:
        raise ValueError(f"samples hold {n} steps, fewer than min_steps={min_steps}: the "
                         f"normal approximation of their mean needs more")
    names = _names(layout, P)
    gbar = s / n  # (P,)
    spread = np.sqrt(np.maximum(s2 / n - gbar ** 2, 0.0))  # (P,)
    scale_of = max(float(np.abs(mean).max()), float(np.sqrt(var.max())), 1e-300)
    zero = var == 0
    moved = zero & (spread > _CONSTANT_RTOL * max(scale_of, float(np.abs(gbar).max())))
    if moved.any():
        bad = [names[i] for i in np.flatnonzero(moved)[:5]]
        raise ValueError(f"exact.variance is 0 for {int(moved.sum())} parameters whose applied "
                         f"gradient varies from step to step (first {bad}): the exact result "
                         f"is not of this run (another task, loss or group size?)")
    z = np.zeros(P)
    live = ~zero
    z[live] = (gbar[live] - mean[live]) / np.sqrt(var[live] / n)
    off = zero & (np.abs(gbar - mean) > _CONSTANT_RTOL * scale_of)
    z[off] = np.inf * np.sign(gbar[off] - mean[off])
    tested = max(int(live.sum()), 1)
    z_thr = normal_quantile(alpha / tested)
    max_z = float(np.abs(z).max()) if P else 0.0
    p = min(1.0, tested * math.erfc(max_z / math.sqrt(2)))
    mm = float(mean @ mean)
    scale = float(gbar @ mean) / mm if mm > 0 else math.nan
    if kept is not None and mm > 0 and n > 1:
        proj = kept @ mean / mm  # (n,)
        scale_se = float(proj.std(ddof=1) / math.sqrt(n))
    else:
        scale_se = math.nan
    d = np.linalg.norm(gbar) * np.linalg.norm(mean)
    cosine = float(gbar @ mean / d) if d > 0 else 0.0
    order = np.argsort(-np.abs(z))[:5]
    worst = [(names[i], float(z[i])) for i in order]
    passed = max_z <= z_thr
    reason = "" if passed else (f"{int(off.sum())} parameters of zero variance off their "
                                f"exact value" if off.any() else "")
    return AppliedGradientVerdict(passed=bool(passed), steps=n, max_abs_z=max_z,
                                  z_threshold=z_thr, p_value=p, alpha=float(alpha),
                                  tested=tested, scale=scale, scale_se=scale_se, cosine=cosine,
                                  worst=worst, reason=reason)


def steps_needed(exact, relative_bias, alpha=1e-6, power=0.9):
    r"""Steps after which :func:`check_applied_gradient` catches, with probability at least
    ``power``, a pipeline that applies :math:`(1 + r)` times the right gradient at every
    step (mean :math:`(1 + r)\mu`, spread :math:`|1 + r|\sigma`: a bias of relative size
    ``r`` along the exact mean), from its best-placed parameter alone:

    .. math:: n = \left\lceil \left(\frac{z_{\alpha/(2P')} + |1 + r|\,z_{power}}{|r|\,
       \max_i |\mu_i|/\sigma_i}\right)^2 \right\rceil

    with :math:`z_{power}` the one-sided normal quantile of ``power``. The other parameters
    only add to the power, so this is enough for a scale error; other biases (not along
    :math:`\mu`) need their own count. Never below ``MIN_STEPS``.

    Example:
        >>> import numpy as np
        >>> steps_needed((np.array([1.0, 0.0]), np.array([1.0, 1.0])), 0.5, alpha=1e-6)
        194
    """
    mean, var = _exact(exact)
    if not isinstance(relative_bias, (int, float)) or relative_bias == 0 \
            or not math.isfinite(relative_bias):
        raise ValueError(f"relative_bias must be a nonzero number, got {relative_bias!r}")
    if not 0.5 <= power < 1:
        raise ValueError(f"power must be in [0.5, 1), got {power!r}")
    live = var > 0
    if not live.any():
        raise ValueError("exact.variance is 0 everywhere: one step decides")
    snr = float(np.max(np.abs(mean[live]) / np.sqrt(var[live])))
    if snr == 0:
        raise ValueError("exact.mean is 0 where the variance is not: a bias along it is 0")
    z_a = normal_quantile(alpha / int(live.sum()))
    z_p = normal_quantile(2 * (1 - power))
    need = (z_a + abs(1 + relative_bias) * z_p) / (abs(relative_bias) * snr)
    return max(MIN_STEPS, math.ceil(need ** 2))
