r"""The off-policy rows of :func:`fisher_ref.checks.identities.exact_checks`: the raw
score's bias under the sampler (centering matters) and the constant :math:`c` added to
every advantage past which the uncentered gradient breaks the centered bound.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.checks.table import Check
from fisher_ref.checks.tolerances import fisher_scale
from fisher_ref.monte_carlo.ztests import ROUNDING_RTOL

__all__ = ["sampler_gap", "raw_bias_row", "constant_rows", "bound_broken_at_zero",
           "constant_breaking_bound"]

SAMPLER_GAP = 1e-8  # the raw score's bias must exceed this; and below it mu ~ p


def sampler_gap(result):
    r""":math:`\max_s \pi_\mu(s)\,\mathrm{TV}(p(s), \mu(s))` over the kept states: how far
    the sampler is from the policy where it goes (``None`` when states were not kept)."""
    st = result.states
    if st is None or "sampler_probs" not in st:
        return None
    tv = 0.5 * np.abs(st["probs"] - st["sampler_probs"]).sum(axis=1)  # (N,)
    return float(np.max(st["sampler_reach"] * tv, initial=0.0))


def raw_bias_row(result, raw, centered):
    """The raw score's mean under ``mu`` must be non-zero: centering matters. Where the
    sampler equals the policy to ``SAMPLER_GAP`` (a peaked model whose ``mu`` and ``p``
    are both one-hot on the same tokens) there is no bias to show: an info row."""
    rF = np.sqrt(fisher_scale(centered.sequence_fisher))
    value = float(np.abs(raw.score_mean).max() / rF)
    check = "max |E_mu[h]| / sqrt(max F_mu) (must be > 0)"
    gap = sampler_gap(result)
    if gap is not None and gap <= SAMPLER_GAP:
        return Check("off-policy", "raw", check, value, SAMPLER_GAP, "info",
                     f"mu equals p to {gap:.1e} (reach x total variation) on every state: "
                     "no bias to show")
    return Check("off-policy", "raw", check, value, SAMPLER_GAP, "nonzero")


def constant_rows(raw, centered):
    """Rows on the constant ``c`` past which the uncentered gradient breaks the bound:
    the parameters already over it at ``c = 0``, and a check that the reported
    ``c`` is where the crossing is (within bound just below, over it just above)."""
    c_break, n0 = constant_breaking_bound(raw, centered), bound_broken_at_zero(raw, centered)
    rows = [Check("off-policy", "raw", "parameters with |E_mu[A h]| > bound already at c = 0",
                  float(n0), 0.0, "info", "the uncentered gradient need not respect the bound")]
    if n0 or not 0 < c_break < np.inf:
        why = ("broken at c = 0" if n0 else "E_mu[h] = 0: never broken" if c_break == np.inf
               else "the bound is 0 where E_mu[h] != 0: broken for any c != 0")
        rows.append(Check("off-policy", "raw", "smallest |c| with |E_mu[(A+c)h]| > bound",
                          c_break, 0.0, "info", why))
        return rows
    B = centered.bound
    excess = [float(np.max(np.abs(raw.gradient_with_constant(s * k * c_break)) - B))
              for s in (1, -1) for k in (1 - 1e-6, 1 + 1e-6)]
    inside = max(excess[0], excess[2])  # just below |c|: within the bound on both signs
    outside = max(excess[1], excess[3])  # just above: over it for some parameter and sign
    rows.append(Check("off-policy", "raw",
                      f"smallest |c| with |E_mu[(A+c)h]| > bound: c = {c_break:.6g}; "
                      "max excess at 1.000001 c (must be > 0)", outside, 0.0, "nonzero",
                      f"at 0.999999 c: {inside:.3g}"))
    return rows


def bound_broken_at_zero(raw, centered):
    r"""Number of parameters whose uncentered gradient :math:`|E_\mu[A h]|` already
    exceeds the centered bound :math:`std_\mu(A)\sqrt{F_\mu}` at ``c = 0`` by more
    than rounding (``ROUNDING_RTOL`` of the larger of the two's maxima)."""
    g, B = np.abs(raw.gradient), centered.bound
    tol = ROUNDING_RTOL * max(g.max(initial=0.0), B.max(initial=0.0))
    return int(np.count_nonzero(g - B > tol))


def constant_breaking_bound(raw, centered):
    r"""Smallest :math:`|c| \ge 0` past which :math:`|E_\mu[(A+c) h]|` exceeds the centered
    bound :math:`B = std_\mu(A)\sqrt{F_\mu}` for some parameter.

    :math:`E_\mu[(A+c)h_i] = g_i + c\,m_i` with :math:`m = E_\mu[h]`. It is ``0.0`` when
    some parameter is over the bound already at ``c = 0`` (see
    :func:`bound_broken_at_zero`). Otherwise every :math:`|g_i| \le B_i` and
    parameter ``i`` stays within the bound for
    :math:`c \in [-(B_i + s_i g_i)/|m_i|,\ (B_i - s_i g_i)/|m_i|]`, :math:`s_i =
    \operatorname{sign} m_i` (both ends :math:`\ge 0` in size); the answer is the
    smallest end over parameters, ``inf`` when :math:`E_\mu[h] = 0` everywhere.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> raw = NS(score_mean=np.array([0.5, -1.0]), gradient=np.array([0.1, 0.2]),
        ...          sequence_fisher=np.array([1.0, 1.0]))
        >>> constant_breaking_bound(raw, NS(bound=np.array([1.0, 1.0])))
        0.8
        >>> constant_breaking_bound(raw, NS(bound=np.array([0.05, 1.0])))
        0.0
    """
    m, g0, B = raw.score_mean, raw.gradient, centered.bound
    if bound_broken_at_zero(raw, centered):
        return 0.0
    am, s = np.abs(m), np.sign(m)
    # E_mu[h_i] at rounding level (a parameter no response moves) is 0: never crosses
    am = np.where(am > ROUNDING_RTOL * np.sqrt(max(float(np.max(raw.sequence_fisher)), 0.0)), am, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        up = np.maximum(np.where(am > 0, (B - s * g0) / am, np.inf), 0.0)  # (P,) c s_i > 0
        down = np.maximum(np.where(am > 0, (B + s * g0) / am, np.inf), 0.0)  # (P,) c s_i < 0
    return float(min(up.min(initial=np.inf), down.min(initial=np.inf)))


