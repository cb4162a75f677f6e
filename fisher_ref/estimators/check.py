r"""Verdicts on a trainer's loss: is its expected gradient what it should be?

:func:`check_loss` computes :func:`fisher_ref.estimators.expected_loss_gradient` and
holds its mean to a target, with the sign convention of a loss to be minimised:

- ``"unbiased"``: :math:`E[\nabla L] = -\nabla E_p[R]`;
- ``"unbiased-up-to-scale"``: :math:`E[\nabla L] = -\alpha\,\nabla E_p[R]`, some
  :math:`\alpha > 0` (Dr. GRPO; the group-mean baseline, :math:`\alpha = 1 - 1/G`);
- ``"kl"``: :math:`E[\nabla L] = +\beta\,\nabla KL(p_{seq}\|ref_{seq})`, some
  :math:`\beta > 0`, the sequence-level KL of the task's reference policy.

The residual is judged at the exact-identity tolerance (``EXACT_RTOL``, 1e-10) on the
scale of the per-group gradient, :math:`\sqrt{E\|\nabla L\|^2}` (or of the target, when
larger). The verdict is true when it passes, so ``assert check_loss(...)`` works in a
test, and ``verdict.assert_ok()`` raises an ``AssertionError`` that says by how much it
missed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks.tolerances import EXACT_RTOL
from ..limits import check_real
from ..verdict import Verdict
from .gradient import LossGradient, expected_loss_gradient, fit_scale

__all__ = ["EXPECTATIONS", "LossVerdict", "check_loss", "judge"]

EXPECTATIONS = ("unbiased", "unbiased-up-to-scale", "kl")


@dataclass
class LossVerdict(Verdict):
    """What :func:`check_loss` found; true when the loss passed.

    Attributes:
        passed: the expected gradient is the one expected.
        expect: what was expected.
        scale: the fitted factor (``alpha`` of ``mean ≈ alpha target``; -1 for an
            unbiased policy-gradient loss, ``beta`` for a KL term).
        relative_bias: :math:`\\|mean - \\alpha\\,target\\| / \\|\\alpha\\,target\\|`.
        residual: the norm of what is left, :math:`\\|mean - expected\\|`.
        tolerance: the largest residual that passes.
        gradient: the :class:`LossGradient` judged.
    """

    passed: bool
    expect: str
    scale: float
    relative_bias: float
    residual: float
    tolerance: float
    gradient: LossGradient
    reason: str = ""

    @property
    def message(self):
        """The verdict and its numbers, on one line."""
        head = "PASS" if self.passed else "FAIL"
        out = (f"{head} expect={self.expect!r}: scale={self.scale:+.6g}, relative bias="
               f"{self.relative_bias:.3g}, residual {self.residual:.3g} vs tolerance "
               f"{self.tolerance:.3g}")
        return out + (f" ({self.reason})" if self.reason else "")




def _check_args(expect, rtol):
    """Refuse an unknown ``expect`` and an ``rtol`` that is not a number in (0, 1)."""
    if expect not in EXPECTATIONS:
        raise ValueError(f"expect must be one of {', '.join(map(repr, EXPECTATIONS))}, "
                         f"got {expect!r}")
    if check_real(rtol, "rtol", positive=True) >= 1:
        raise ValueError(f"rtol must be a relative tolerance below 1, got {rtol!r}")


def judge(lg, expect="unbiased", rtol=EXACT_RTOL):
    """The verdict on a :class:`LossGradient` already computed (see :func:`check_loss`)."""
    _check_args(expect, rtol)
    if expect == "kl":
        if lg.kl_gradient is None:
            raise ValueError("expect='kl' needs a task with a reference policy "
                             "(the task key 'reference')")
        target, sign = lg.kl_gradient, 1.0
    else:
        target, sign = lg.policy_gradient, -1.0
    group_scale = math.sqrt(float(lg.mean @ lg.mean) + lg.variance_trace)
    tol = rtol * max(group_scale, float(np.linalg.norm(target)))
    alpha, rel = fit_scale(lg.mean, target)
    if expect == "unbiased":
        residual = float(np.linalg.norm(lg.mean + target))
        reason = "" if residual <= tol else f"expected scale -1, fitted {alpha:+.6g}"
        passed = residual <= tol
    else:
        residual = float(np.linalg.norm(lg.mean - alpha * target))
        fitted = float(np.linalg.norm(alpha * target))
        right_sign = sign * alpha > 0
        # a vanishing expected gradient (k1 in the loss, a ratio against itself) fits any
        # scale within rounding, of either sign: it must not pass by the sign of a rounding
        passed = right_sign and residual <= tol and fitted > tol
        reason = ""
        if float(np.linalg.norm(target)) == 0:
            passed, reason = False, "the target gradient vanishes: nothing to fit a scale to"
        elif fitted <= tol:
            reason = (f"the expected gradient vanishes (|E[grad L]| = "
                      f"{float(np.linalg.norm(lg.mean)):.3g}, at most the tolerance): the loss "
                      f"gives no gradient along the target")
        elif not right_sign:
            reason = (f"the fitted scale {alpha:+.6g} has the wrong sign (a loss to be "
                      f"minimised has {'+' if sign > 0 else '-'}scale)")
        elif not passed:
            reason = f"not parallel to the target: relative bias {rel:.3g}"
    if not passed:
        reason = _hints(lg, expect, alpha, rel, target, tol, reason)
    return LossVerdict(passed=bool(passed), expect=expect, scale=alpha, relative_bias=rel,
                       residual=residual, tolerance=tol, gradient=lg, reason=reason)


#: A failing scale this close to the expected one is reported as "the direction is exact".
SCALE_HINT = 1e-5


def _hints(lg, expect, alpha, rel, target, tol, reason):
    """What a failing verdict adds: a scale within ``SCALE_HINT`` of -1 along an exact
    direction, and the loss's casts below float64."""
    fitted = float(np.linalg.norm(alpha * target))
    exact_direction = fitted > 0 and rel * fitted <= tol
    if expect == "unbiased" and exact_direction and abs(alpha + 1) <= SCALE_HINT:
        reason += (f"; the direction is exact and the scale is off by only "
                   f"{abs(alpha + 1):.3g} (at most {SCALE_HINT:g}), as an epsilon in a "
                   f"normaliser gives (verl's GRPO with one response is R/(1+1e-6)); "
                   f"expect='unbiased-up-to-scale' passes")
    casts = getattr(lg, "casts", None)
    if casts:
        listed = ", ".join(f"{k} x{v}" for k, v in casts.items())
        reason += (f"; the loss casts to {_dtypes(casts)}: {listed} (its gradient is rounded "
                   f"there; compute the loss in float64)")
    return reason.lstrip("; ")


def _dtypes(casts):
    return "/".join(sorted({k.rsplit(" to ", 1)[-1] for k in casts}))


def check_loss(task, loss, group_size=1, expect="unbiased", *, symmetric=False,
               rtol=EXACT_RTOL, **kwargs):
    r"""Judge ``loss``'s exact expected gradient on ``task`` (see the module).

    Args:
        task, loss, group_size, symmetric: as in
            :func:`fisher_ref.estimators.expected_loss_gradient` (``kwargs`` go there too:
            ``groups_per_batch``, ``pad``, ``max_groups`` ...).
        expect: ``"unbiased"``, ``"unbiased-up-to-scale"`` or ``"kl"``.
        rtol: the tolerance relative to the per-group gradient's scale.

    Returns:
        :class:`LossVerdict`, true when the loss passed.

    Example:
        >>> from fisher_ref import load_config
        >>> from fisher_ref.estimators import check_loss, presets
        >>> bool(check_loss(load_config("tabular"), presets.reinforce()))
        True
        >>> check_loss(load_config("tabular"), presets.group_mean_reinforce(), 2).passed
        False
    """
    _check_args(expect, rtol)
    lg = expected_loss_gradient(task, loss, group_size, symmetric, **kwargs)
    return judge(lg, expect, rtol)
