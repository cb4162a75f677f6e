r"""How a value computed in another precision or order is judged against the exact one.

The error of an array ``a`` (torch, any dtype) against the exact float64 ``b``:

.. math:: \text{abs} = \max|a - b|,\qquad \text{rel} = \max_i |a_i - b_i| / s_i

with ``s`` the *scale* of the quantity (:func:`scale`). A quantity computed directly is
judged on its own largest entry, :math:`s = \max|b|`, so small entries are judged on the
scale of the quantity. A quantity derived from parts is judged on the error its parts
are allowed, carried through (first-order error propagation), or on the scale of the
parts where they cancel:

- **correlation** :math:`\rho_i = |\mathrm{Cov}_i| / B_i` (bound
  :math:`B_i = \mathrm{std}(A)\sqrt{F_i}`). With the covariance allowed an error
  ``tol * max|Cov|`` and the bound ``tol * max B``,
  :math:`\delta\rho_i \le \delta\mathrm{Cov}_i/B_i + \rho_i\,\delta B_i/B_i`, so
  :math:`s_i = (\max|\mathrm{Cov}| + \rho_i \max B)/B_i` (infinite where
  :math:`B_i = 0`: the ratio is undefined there, and 0 by convention on both sides). A
  parameter whose bound is a thousandth of the largest may be off by a thousand times
  more than one at the top, exactly as much as its parts allow.
- **score_mean** :math:`E[h_i]` (0 on-policy): a sum of scores
  :math:`\xi = j - \bar j` whose rounding is on the scale of the sensitivities ``j``
  themselves (centering cancels them on a peaked model), over at most ``T`` positions:
  :math:`s_i = \max(\max|b|, \sqrt{\max F}, T \max_{s,a}|j_{i,a}(s)|)`.
- **gradients** :math:`E[Ah]`: a cancellation of terms as large as
  :math:`(\sqrt{E[R^2]} + |b|)\sqrt{\max F}` when the baseline ``b`` is large, judged on
  that size (:func:`gradient_scale`).

An all-zero exact array is judged by the absolute error. Tolerances per dtype:

- ``float64``: :data:`TOL_FLOAT64` = 1e-10 — the same arithmetic in another order.
- ``float32`` (matmul precision ``"highest"``, TF32 off): :data:`TOL_FLOAT32` = 2e-5,
  eps32 = 1.2e-7 times a conditioning factor of about 170 (the tanh layer, the softmax,
  centering :math:`j - \bar j`, sums over up to ``V^T`` responses).
- ``bfloat16``: :data:`TOL_BFLOAT16` = 0.1, about 13 eps (2^-7) — logits and
  sensitivities in bfloat16, probabilities and every sum in float32.
"""
from __future__ import annotations

import numpy as np

__all__ = ["TOL_FLOAT64", "TOL_FLOAT32", "TOL_BFLOAT16", "TOLERANCES", "GRADIENT_QUANTITIES",
           "rel_error", "scale", "correlation_scale", "score_mean_scale",
           "gradient_judge_scale", "EXACT_RTOL", "GRADIENT_FLOOR", "rel_err", "fisher_scale",
           "gradient_scale"]

# the numbers live in fisher_ref.limits, the bottom layer (numpy only), so that the torch
# engine's self-checks and the golden-file checker use the same ones; this module says
# what they mean and how they are applied
from fisher_ref.limits import TOL_BFLOAT16, TOL_FLOAT32, TOL_FLOAT64, TOLERANCES  # noqa: E402
GRADIENT_QUANTITIES = ("gradient", "importance_gradient")

EXACT_RTOL = TOL_FLOAT64  # exact identities in float64 (docs/theory.md §9.3)


GRADIENT_FLOOR = 1.0  # relative errors of gradients are taken against at least their
#                       natural scale (see gradient_scale): the size of the summands of
#                       E[A h], since a gradient near 0 is a cancellation of such terms


def rel_err(a, b, floor=0.0):
    """``max|a-b| / max(max|a|, max|b|, floor)`` (0 when they are equal).

    ``floor`` keeps a quantity that is exactly 0 in exact arithmetic from being
    divided by its own rounding noise; callers pass a small fraction of the
    quantity's natural scale.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    scale = max(np.abs(a).max(initial=0.0), np.abs(b).max(initial=0.0), floor)
    diff = np.abs(a - b).max(initial=0.0)
    return 0.0 if diff == 0 else float(diff / scale) if scale > 0 else float("inf")


def fisher_scale(F):
    """``max F`` floored at the smallest positive float (a scale to divide by)."""
    return max(float(np.max(F)), np.finfo(float).tiny)


def gradient_scale(s, extra=0.0, score_scale=0.0):
    r"""Natural scale of a gradient :math:`E[A h]`: :math:`(\sqrt{E[R^2]} + |b| + extra)
    \max(\sqrt{\max_i F_i}, score\_scale)`, a Cauchy–Schwarz bound on its size.

    ``score_scale`` (the square root of
    :func:`fisher_ref.checks.identities.state_score_scale`) is the size of a score at
    a single state: rounding in :math:`\bar j` is of that size even where the policy is
    so peaked that ``F`` is tiny."""
    rms_R = np.hypot(s.reward_std, s.expected_reward)  # no underflow for tiny rewards
    rF = np.sqrt(max(np.max(s.sequence_fisher), 0.0))
    return float((rms_R + abs(s.baseline) + extra) * max(rF, score_scale))


def rel_error(a, b, scale=None):
    """``(max|a-b|, max_i |a_i-b_i| / s_i)``; ``s`` is ``max|b|`` unless ``scale`` (a number
    or an array broadcast against ``b``) is given. An entry with ``s_i = 0`` counts its
    absolute error (0 where both agree exactly); ``s_i = inf`` counts 0.

    Example:
        >>> rel_error(np.array([1.0, 2.5]), np.array([1.0, 2.0]))
        (0.5, 0.25)
        >>> rel_error(np.array([1.0, 2.5]), np.array([1.0, 2.0]), np.array([1.0, np.inf]))
        (0.5, 0.0)
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: torch {a.shape} vs fisher_ref {b.shape}")
    if not a.size:
        return 0.0, 0.0
    diff = np.abs(a - b)
    err = float(np.max(diff))
    if not np.isfinite(err):
        return err, float("inf")
    s = np.broadcast_to(np.max(np.abs(b)) if scale is None else np.asarray(scale, float),
                        b.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(s > 0, diff / np.where(s > 0, s, 1.0), diff)
    return err, float(np.max(rel))


def correlation_scale(stream):
    r""":math:`s_i = (\max|\mathrm{Cov}| + \rho_i \max B) / B_i` (``inf`` where :math:`B_i = 0`).

    Example:
        >>> from types import SimpleNamespace as S
        >>> st = S(covariance=np.array([0.5, 0.001]), bound=np.array([1.0, 0.002]),
        ...        correlation=np.array([0.5, 0.5]))
        >>> correlation_scale(st).tolist()
        [1.0, 500.0]
    """
    B, rho = np.asarray(stream.bound, float), np.asarray(stream.correlation, float)
    top = np.max(np.abs(stream.covariance)) + rho * np.max(B)  # (P,)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(B > 0, top / np.where(B > 0, B, 1.0), np.inf)


def score_mean_scale(stream, jmax, max_len):
    r""":math:`s_i = \max(\max|E[h]|, \sqrt{\max F}, T\,\max_{s,a}|j_{i,a}(s)|)`.

    Args:
        stream: the exact stream (``score_mean``, ``sequence_fisher``).
        jmax: ``(P,)`` largest ``|j|`` of each parameter over states and tokens.
        max_len: ``T``.
    """
    base = max(float(np.max(np.abs(stream.score_mean))),
               float(np.sqrt(np.max(stream.sequence_fisher))))
    return np.maximum(base, max_len * np.asarray(jmax, float))


def scale(quantity, stream, jmax=None, max_len=None):
    """The scale of a stream quantity (``None``: its largest entry); see the module docstring.

    Args:
        quantity: a name of :data:`fisher_ref.torch.exact.STREAM_QUANTITIES`.
        stream: the exact :class:`fisher_ref.results.StreamResult`.
        jmax, max_len: for ``score_mean`` (:func:`score_mean_scale`); without them its
            scale is ``max(max|b|, sqrt(max F))``.
    """
    if quantity == "correlation":
        return correlation_scale(stream)
    if quantity == "score_mean":
        return score_mean_scale(stream, 0.0 if jmax is None else jmax, max_len or 0)
    if quantity in GRADIENT_QUANTITIES:
        return gradient_judge_scale(getattr(stream, quantity), stream)
    return None


def gradient_judge_scale(values, stream):
    """``max(max|values|, gradient_scale(stream))`` for a gradient ``values (P,)`` of ``stream``."""
    return max(float(np.max(np.abs(values))), gradient_scale(stream))
