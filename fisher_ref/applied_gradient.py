r"""Is the gradient a trainer applies, step after step, the exact expected gradient? Numpy only.

A trainer run with its weights frozen (learning rate 0, no clipping) applies at each step
``t`` a gradient :math:`g_t \in \mathbb{R}^P`, an i.i.d. draw whose exact mean :math:`\mu`,
per-parameter variance :math:`\sigma^2` and range :math:`[l, h]` fisher_ref computes by
enumeration (:func:`fisher_ref.estimators.expected_loss_gradient`).
:func:`check_applied_gradient` holds the mean of ``n`` steps to it, parameter by
parameter, with the **exact** variance:

.. math:: z_i = \frac{\bar g_i - \mu_i}{\sqrt{\sigma_i^2 / n}} .

**The threshold** (``method="bennett"``, the default) is Bennett's inequality
(:mod:`fisher_ref.bennett`) on each side of each parameter, from :math:`\sigma_i` and the
one-sided ranges :math:`h_i - \mu_i`, :math:`\mu_i - l_i`, at tail :math:`\alpha/2P'`
(Bonferroni over the :math:`P'` parameters of nonzero variance). A correct pipeline then
fails with probability **at most** ``alpha`` for any number of steps and any distribution
within the range: a theorem, not an approximation. ``method="normal"`` takes the normal
quantile :math:`z_{\alpha/2P'}` instead: more power, but its rate rests on the normal
approximation of a mean, which fails for heavy-tailed gradients (a loss like GRPO's, where
most groups give 0 and rare ones carry a parameter): on ``offpolicy_stale`` with GRPO,
G = 2, a correct sampler failed it at ``alpha = 1e-6`` in 0.8-1.7% of 2,000 runs at 5-10
steps and 0.05% at 40-100 steps (``benchmarks/estimators/applied_covariance.py``, record
``docs/bench/estimators/applied_covariance.json``), where Bennett's bound failed none.

The sample variance is not used: many groups have equal rewards and give a zero gradient,
so over a few steps the sample spread can be far below the true one and every clean run
would fail.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fisher_ref.bennett import bennett_threshold, two_sided_test
from fisher_ref.verdict import Verdict

__all__ = ["MIN_STEPS", "METHODS", "SUPPORT_RTOL", "AppliedGradientVerdict",
           "check_applied_gradient", "steps_needed", "normal_quantile"]

#: Fewest steps judged. Bennett's bound holds at any ``n``; the floor is for
#: ``method="normal"``, whose normal approximation of a mean of ``n`` steps (a mixture with
#: an atom at zero: groups of equal rewards) is visibly skewed below a few dozen steps, and
#: so that one step, or a handful, is refused as a mistake rather than judged.
MIN_STEPS = 30
#: The thresholds: Bennett's inequality (rate at most ``alpha``, always) or the normal
#: quantile (rate ``alpha`` under the normal approximation).
METHODS = ("bennett", "normal")
#: Bennett's one-sided ranges are widened by this times the largest :math:`|l_i|, |h_i|`
#: (times :math:`\sqrt P` along a direction), so that a trainer's rounding cannot step
#: outside the enumerated range: the float32 casts of a stock float64 Llama leave under
#: 1e-6 of a group's largest entry (``check_trainer_loss``; the end-to-end tests assert
#: it). Wider costs power: on the real ``GRPOTrainer`` of those tests, 1e-4 hid TRL's bf16
#: bias at 1,000 steps that 1e-5 shows.
SUPPORT_RTOL = 1e-5
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


def _exact(exact, method="normal"):
    r"""``(mean, variance, b_up, b_down)`` float64 ``(P,)`` of a LossGradient (or a tuple
    ``(mean, variance)`` / ``(mean, variance, low, high)``): the one-sided ranges
    :math:`h - \mu`, :math:`\mu - l` widened by :data:`SUPPORT_RTOL`, ``None`` for
    ``method="normal"``."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(exact, tuple) and len(exact) in (2, 4):
        mean, var, low, high = (tuple(exact) + (None, None))[:4]
    else:
        mean, var = getattr(exact, "mean", None), getattr(exact, "variance", None)
        low, high = getattr(exact, "low", None), getattr(exact, "high", None)
    if mean is None or var is None:
        raise TypeError(f"exact must be a LossGradient (mean, variance, low, high) or a tuple "
                        f"(mean, variance[, low, high]) of arrays, got {type(exact).__name__}")
    mean, var = np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64)
    if mean.ndim != 1 or var.shape != mean.shape:
        raise ValueError(f"exact.mean and exact.variance must be (P,) arrays of one shape, got "
                         f"{mean.shape} and {var.shape}")
    if (var < 0).any() or not np.isfinite(var).all() or not np.isfinite(mean).all():
        raise ValueError("exact.variance must be finite and >= 0, exact.mean finite")
    if method == "normal":
        return mean, var, None, None
    if low is None or high is None:
        raise ValueError("method='bennett' needs the range of one step's gradient (exact.low, "
                         "exact.high, as expected_loss_gradient returns them); without it "
                         "pass method='normal' (an approximation)")
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    if low.shape != mean.shape or high.shape != mean.shape or not (
            np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(f"exact.low and exact.high must be finite ({mean.shape[0]},) arrays")
    tol = _CONSTANT_RTOL * max(float(np.abs(mean).max(initial=0.0)),
                               float(np.sqrt(var.max(initial=0.0))), 1e-300)
    if (high < mean - tol).any() or (low > mean + tol).any():
        raise ValueError("exact.low <= exact.mean <= exact.high fails: the range is not that "
                         "of the distribution whose mean this is")
    slack = SUPPORT_RTOL * max(float(np.abs(low).max(initial=0.0)),
                               float(np.abs(high).max(initial=0.0)), 1e-300)
    return (mean, var, np.maximum(high - mean, 0.0) + slack,
            np.maximum(mean - low, 0.0) + slack)


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


def _zero_variance(mean, var):
    """``(P,)`` bool: the parameters whose exact variance is 0 up to the enumeration's
    rounding (below :data:`_CONSTANT_RTOL` of the largest mean or spread, squared)."""
    scale = max(float(np.abs(mean).max(initial=0.0)), float(np.sqrt(var.max(initial=0.0))),
                1e-300)
    return var <= (_CONSTANT_RTOL * scale) ** 2


def _samples(samples):
    """``(sum (P,), sum of squares (P,), n, steps (n, P) or None)`` of an array or a recorder."""
    if hasattr(samples, "running_sums"):
        s, s2, n = samples.running_sums()
        kept = samples.samples()
        if not (np.isfinite(s).all() and np.isfinite(s2).all()):
            raise ValueError("the recorder holds NaN or infinite gradients")
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
        passed: every :math:`|z_i|` within its threshold, no zero-variance parameter moved.
        steps: steps judged.
        method: ``"bennett"`` or ``"normal"``.
        max_abs_z: the largest :math:`|z_i|`.
        z_threshold: the threshold of the parameter nearest to (or furthest past) its own:
            :math:`z_{\\alpha/(2P')}` for every parameter with ``"normal"``; Bennett's, in
            units of :math:`\\sigma_i/\\sqrt n`, depends on the parameter's range.
        ratio: the largest :math:`|z_i|` over its threshold (``> 1``: failed).
        p_value: Bonferroni's bound, :math:`\\min(1, 2P' \\min_i q_i)` with :math:`q_i`
            the one-sided tail (Bennett's bound, or the normal tail) at the observed
            deviation.
        alpha: the false-failure rate asked for.
        tested: :math:`P'`, parameters of nonzero exact variance.
        scale: least-squares :math:`a` with :math:`\\bar g \\approx a\\,\\mu` (1: right).
        scale_se: its standard error over the steps (``nan`` when the steps were not kept).
        cosine: of :math:`\\bar g` and :math:`\\mu`.
        worst: ``[(name, z), ...]``, the five parameters nearest to their thresholds.
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
    method: str = "bennett"
    ratio: float = 0.0

    @property
    def message(self):
        """The verdict and its numbers, on one line."""
        head = "PASS" if self.passed else "FAIL"
        worst = ", ".join(f"{n} z={z:+.3g}" for n, z in self.worst[:3])
        out = (f"{head} applied gradient over {self.steps} steps: max|z| {self.max_abs_z:.3g}; "
               f"worst |z|/threshold {self.ratio:.3g} (threshold {self.z_threshold:.3g}, "
               f"{self.method}, alpha {self.alpha:.2g}, {self.tested} parameters, "
               f"Bonferroni p {self.p_value:.3g}); scale {self.scale:.4g} +- "
               f"{self.scale_se:.2g}, cosine {self.cosine:.6f}; worst: {worst}")
        return out + (f" ({self.reason})" if self.reason else "")


def _check_alpha(alpha):
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def _thresholds(dev, var, b_up, b_down, n, alpha, tested):
    """``(failed, z threshold, log one-sided tail)`` ``(P',)`` of the live parameters."""
    sd = np.sqrt(var)
    if b_up is None:
        z = dev / (sd / math.sqrt(n))
        thr = np.full(dev.shape, normal_quantile(alpha / tested))
        log_q = np.log(np.maximum(0.5 * np.array([math.erfc(abs(x) / math.sqrt(2))
                                                   for x in z]), 1e-320))
        return np.abs(z) > thr, thr, log_q
    return two_sided_test(dev, sd, b_up, b_down, n, alpha)


def check_applied_gradient(samples, exact, *, alpha=1e-6, layout=None, min_steps=MIN_STEPS,
                           method="bennett"):
    r"""Judge the gradients a trainer applied against the exact expected gradient.

    The test (see the module): per parameter, :math:`z_i = (\bar g_i - \mu_i)/
    \sqrt{\sigma_i^2/n}` with the exact variance, each side against Bennett's threshold at
    tail :math:`\alpha/2P'` (``method="bennett"``: a correct pipeline fails with
    probability at most ``alpha``, whatever the tails) or the normal quantile
    (``"normal"``: the normal approximation's rate). A parameter of zero exact variance must
    be applied exactly :math:`\mu_i` at every step (to 1e-9 relative): constant elsewhere,
    it fails the run with :math:`z = \infty`.

    Args:
        samples: ``(steps, P)`` applied gradients, or a recorder
            (:class:`fisher_ref.torch.GradientRecorder`).
        exact: the :class:`fisher_ref.estimators.LossGradient` of what one step should
            apply (``mean``, ``variance``, ``low``, ``high`` per parameter), or a tuple
            ``(mean, variance, low, high)`` (``(mean, variance)`` with ``"normal"``).
        alpha: the false-failure rate.
        layout: parameter names for the report: ``P`` strings, or ``(name, shape)`` blocks
            (``(name, shape, offset)`` as ``task.model.layout()`` gives them) in order.
        min_steps: fewest steps judged.
        method: ``"bennett"`` or ``"normal"`` (:data:`METHODS`).

    Returns:
        :class:`AppliedGradientVerdict`, true when passing.

    Raises:
        ValueError: fewer than ``min_steps`` steps, samples of another width than
            ``exact``, a parameter of zero exact variance whose applied gradient varies,
            an ``alpha`` outside (0, 1), ``"bennett"`` without the range.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> steps = rng.choice([0.0, 2.0], size=(400, 2))  # mean 1, variance 1, range [0, 2]
        >>> one = np.ones(2)
        >>> bool(check_applied_gradient(steps, (one, one, 0 * one, 2 * one)))
        True
        >>> bool(check_applied_gradient(steps + 0.5, (one, one, 0 * one, 2 * one)))
        False
    """
    _check_alpha(alpha)
    if isinstance(min_steps, bool) or not isinstance(min_steps, (int, np.integer)) \
            or min_steps < 2:
        raise ValueError(f"min_steps must be an integer >= 2, got {min_steps!r}")
    mean, var, b_up, b_down = _exact(exact, method)
    s, s2, n, kept = _samples(samples)
    P = mean.shape[0]
    if s.shape != (P,):
        raise ValueError(f"samples have {s.shape[0]} parameters per step, exact has {P}")
    if n < min_steps:
        raise ValueError(f"samples hold {n} steps, fewer than min_steps={min_steps}: too few "
                         f"to judge (a run of one step, or a handful, is more likely a "
                         f"mistake than a test)")
    names = _names(layout, P)
    gbar = s / n  # (P,)
    spread = np.sqrt(np.maximum(s2 / n - gbar ** 2, 0.0))  # (P,)
    scale_of = max(float(np.abs(mean).max()), float(np.sqrt(var.max())), 1e-300)
    zero = _zero_variance(mean, var)
    moved = zero & (spread > _CONSTANT_RTOL * max(scale_of, float(np.abs(gbar).max())))
    if moved.any():
        bad = [names[i] for i in np.flatnonzero(moved)[:5]]
        raise ValueError(f"exact.variance is 0 for {int(moved.sum())} parameters whose applied "
                         f"gradient varies from step to step (first {bad}): either the exact "
                         f"result is not of this run (another task, loss or group size?) or "
                         f"the pipeline moves parameters no correct step can move")
    live = ~zero
    tested = max(int(live.sum()), 1)
    z, thr, log_q = np.zeros(P), np.full(P, np.inf), np.zeros(P)
    z[live] = (gbar[live] - mean[live]) / np.sqrt(var[live] / n)
    if live.any():
        cut = (lambda b: None) if b_up is None else (lambda b: b[live])
        _, thr[live], log_q[live] = _thresholds(gbar[live] - mean[live], var[live],
                                                cut(b_up), cut(b_down), n, alpha, tested)
    off = zero & (np.abs(gbar - mean) > _CONSTANT_RTOL * scale_of)
    z[off] = np.inf * np.sign(gbar[off] - mean[off])
    ratio = np.zeros(P)  # |z| / threshold; inf where a constant parameter is off
    ratio[live] = np.abs(z[live]) / thr[live]
    ratio[off] = np.inf
    max_z = float(np.abs(z).max()) if P else 0.0
    k = int(np.argmax(ratio)) if P else 0
    p = 0.0 if off.any() else min(1.0, 2 * tested * math.exp(float(log_q.min(initial=0.0))))
    mm = float(mean @ mean)
    scale = float(gbar @ mean) / mm if mm > 0 else math.nan
    if kept is not None and mm > 0 and n > 1:
        proj = kept @ mean / mm  # (n,)
        scale_se = float(proj.std(ddof=1) / math.sqrt(n))
    else:
        scale_se = math.nan
    d = np.linalg.norm(gbar) * np.linalg.norm(mean)
    cosine = float(gbar @ mean / d) if d > 0 else 0.0
    order = np.argsort(-ratio)[:5]
    worst = [(names[i], float(z[i])) for i in order]
    passed = not off.any() and float(ratio.max(initial=0.0)) <= 1.0
    reason = "" if passed else (f"{int(off.sum())} parameters of zero variance off their "
                                f"exact value" if off.any() else "")
    return AppliedGradientVerdict(passed=bool(passed), steps=n, max_abs_z=max_z,
                                  z_threshold=float(thr[k]) if P else math.inf, p_value=p,
                                  alpha=float(alpha), tested=tested, scale=scale,
                                  scale_se=scale_se, cosine=cosine, worst=worst, reason=reason,
                                  method=method, ratio=float(ratio.max(initial=0.0)))


def steps_needed(exact, relative_bias, alpha=1e-6, power=0.9, method="bennett"):
    r"""Steps after which :func:`check_applied_gradient` catches, with probability at least
    ``power``, a pipeline that applies :math:`(1 + r)` times the right gradient at every
    step (mean :math:`(1 + r)\mu`, spread :math:`|1 + r|\sigma`: a bias of relative size
    ``r`` along the exact mean), from its best-placed parameter alone: the least ``n`` with

    .. math:: |r\,\mu_i| \ge t_i(n) + z_{power}\,|1 + r|\,\sigma_i / \sqrt n

    for some ``i``, :math:`t_i(n)` the test's threshold at ``n`` steps (Bennett's on the
    side of :math:`r\mu_i`, or the normal one) and :math:`z_{power}` the one-sided normal
    quantile of ``power``. The other parameters only add to the power, so this is enough
    for a scale error; other biases (not along :math:`\mu`) need their own count. Never
    below ``MIN_STEPS``.

    Example:
        >>> import numpy as np
        >>> steps_needed((np.array([1.0, 0.0]), np.array([1.0, 1.0])), 0.5, alpha=1e-6,
        ...              method="normal")
        194
    """
    mean, var, b_up, b_down = _exact(exact, method)
    _check_alpha(alpha)
    if isinstance(relative_bias, bool) or not isinstance(relative_bias, (int, float)) \
            or relative_bias == 0 or not math.isfinite(relative_bias):
        raise ValueError(f"relative_bias must be a nonzero number, got {relative_bias!r}")
    if not 0.5 <= power < 1:
        raise ValueError(f"power must be in [0.5, 1), got {power!r}")
    live = ~_zero_variance(mean, var)
    if not live.any():
        raise ValueError("exact.variance is 0 everywhere: one step decides")
    shift = relative_bias * mean[live]  # (P',)
    if not np.abs(shift).max() > 0:
        raise ValueError("exact.mean is 0 where the variance is not: a bias along it is 0")
    sd, tested = np.sqrt(var[live]), int(live.sum())
    z_p = normal_quantile(2 * (1 - power))
    if b_up is not None:
        b = np.where(shift >= 0, b_up[live], b_down[live])

    def caught(n):
        if b_up is None:
            t = normal_quantile(alpha / tested) * sd / math.sqrt(n)
        else:
            t = bennett_threshold(sd, b, n, alpha / (2 * tested))
        return bool((np.abs(shift) >= t + z_p * abs(1 + relative_bias) * sd / math.sqrt(n)).any())
    hi = MIN_STEPS
    while not caught(hi):
        hi *= 2
        if hi > 2 ** 50:
            raise ValueError("no number of steps below 2**50 catches this bias")
    lo = hi // 2 if hi > MIN_STEPS else MIN_STEPS - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if caught(mid) else (mid, hi)
    return max(MIN_STEPS, hi)
