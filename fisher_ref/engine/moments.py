r"""Accumulated moments of one stream, and the stream's exact results built from them.

A :class:`Moments` accumulates, over complete responses ``y`` drawn with
probability ``w(y)`` and over states ``s`` reached with probability
:math:`\pi(s)`:

- :math:`E[h]`, :math:`E[h^2]`, :math:`E[h^4]` (response level);
- :math:`E[R]`, :math:`E[Rh]`, :math:`E[Rh^2]`, :math:`E[R^2h^2]`, each with ``R``
  taken relative to a reference reward ``r0`` (the first reward seen), so that no
  large reward offset (``1e8 + count``) enters a difference of sums;
- the weighted mean and spread of ``R``, merged block by block (Chan's update), for
  ``std(A)`` without cancellation;
- :math:`C_{u,t} = E[\xi_u\xi_t]` and :math:`E[\xi_u^2\xi_t^2]` (``T x T x P``);
- the token sum :math:`\sum_s \pi(s) m(s)` by states, and :math:`E[g]`,
  :math:`E[g^2]` for the per-response path sum :math:`g = \sum_t m(s_t)`;
- the largest conditional score mean :math:`\max_s |E[\xi | s]|`.

:func:`finish_stream` turns them into gradients, covariances, the bound, the
correlation and the exact variances the Monte Carlo z-tests use.
"""
from __future__ import annotations

import math

import numpy as np

from fisher_ref.results import FisherStreamResult, StreamResult

__all__ = ["Moments", "finish_stream", "finish_fisher", "importance_weighted"]


def _power_of_two(x):
    """The smallest power of two at least ``x`` (1 for ``x = 0``): dividing by it is exact."""
    return float(2.0 ** math.frexp(x)[1]) if x > 0 and math.isfinite(x) else 1.0


def importance_weighted(w, w_policy):
    r""":math:`w\,\rho` with the importance weight :math:`\rho = P(y)/w(y)` formed
    explicitly where :math:`w(y) > 0` (responses the sampler never draws get 0)."""
    rho = np.divide(w_policy, w, out=np.zeros_like(w, dtype=float), where=w > 0)  # (M,)
    return w * rho


class Moments:
    """Running sums for one stream (see module docstring)."""

    def __init__(self, P, T):
        self.mass = 0.0
        self.r0 = None  # reference reward: every R sum is of R - r0
        # weighted mean and sum of squared deviations of R, merged block by block; the
        # squares in units of spread_unit^2 (a power of two), so that rewards below
        # 1e-154 do not underflow when squared
        self.spread_mass = self.spread_mean = self.spread_m2 = 0.0
        self.spread_unit = 0.0  # no rewards yet
        self.R = 0.0
        self.h, self.h2, self.h4 = np.zeros(P), np.zeros(P), np.zeros(P)
        self.Rh, self.Rh2, self.R2h2 = np.zeros(P), np.zeros(P), np.zeros(P)
        self.cross, self.cross4 = np.zeros((T, T, P)), np.zeros((T, T, P))
        self.token_sum = np.zeros(P)
        self.token_sum_by_depth = np.zeros((T, P))
        self.g, self.g2 = np.zeros(P), np.zeros(P)
        self.cond_mean_max = np.zeros(P)
        self.is_Rh = np.zeros(P)
        self.is_h = np.zeros(P)

    def add_states(self, reach, m, cond_mean, depth):
        """States of one depth: reach ``(B,)``, second moments ``m`` and ``E[xi|s]`` ``(B, P)``."""
        contrib = reach @ m  # (P,)
        self.token_sum += contrib
        self.token_sum_by_depth[depth] += contrib
        live = reach > 0
        if live.any():
            self.cond_mean_max = np.maximum(self.cond_mean_max,
                                            np.abs(cond_mean[live]).max(axis=0))

    def centered(self, R):
        """``R - r0`` (fixing ``r0`` at the first reward seen)."""
        if self.r0 is None and len(R):
            self.r0 = float(R[0])
        return R - (self.r0 or 0.0)

    def add_reward_spread(self, w, R):
        r"""Merge a block's rewards ``R (M,)`` with weights ``w (M,)`` into the running
        weighted mean and sum of squared deviations (Chan, Golub and LeVeque's pairwise
        update): the block's own mean :math:`\bar R_b` and :math:`M_b = \sum w (R -
        \bar R_b)^2`, then :math:`M \mathrel{+}= M_b + \delta^2 W W_b / (W + W_b)` with
        :math:`\delta = \bar R_b - \bar R`. No difference of two large sums is taken,
        so ``std(A)`` is right to rounding however far rewards sit from 0 or from ``r0``.
        The rewards are divided by a power of two ``u`` of their size before any product
        (exact), and ``M`` is kept in units of ``u^2``: the spread is homogeneous
        in ``R``, so rewards of 1e-300 give the same digits as rewards of 1."""
        Wb = float(np.sum(w))
        if Wb <= 0:
            return
        top = float(np.max(np.abs(R)))
        if top == 0:  # all zero: no unit of its own, so it cannot coarsen a tiny one
            self.merge_spread(Wb, 0.0, 0.0, 0.0)
            return
        unit = _power_of_two(top)
        Rs = R / unit  # (M,) exact: a power of two
        r1 = float(Rs[0])  # a block whose rewards are all equal gets exactly that mean
        mean_b = r1 + float(w @ (Rs - r1)) / Wb
        self.merge_spread(Wb, mean_b * unit, float(w @ (Rs - mean_b) ** 2), unit)

    def merge_spread(self, mass, mean, m2, unit=1.0):  # unit: a power of two, 0: all zero
        """Merge another weighted spread (``mass``, ``mean``, ``m2`` in units of ``unit^2``,
        as this object's ``spread_*`` fields) into this one (Chan's update). A unit of 0
        marks rewards that are all 0 (mean and ``m2`` 0): it takes the other's unit, so
        that a block of zero rewards does not coarsen the unit of rewards of 1e-170
        (whose squares would then underflow)."""
        u = max(self.spread_unit, unit)  # both in the larger unit: squares cannot overflow
        total = self.spread_mass + mass
        if u == 0:  # every reward so far is 0
            self.spread_mass = total
            return
        delta = (mean - self.spread_mean) / u
        self.spread_m2 = (self.spread_m2 * (self.spread_unit / u) ** 2 + m2 * (unit / u) ** 2
                          + delta * delta * self.spread_mass * mass / total)
        # mass / total first: 1 exactly for the first spread, so equal means stay equal
        self.spread_mean += (mean - self.spread_mean) * (mass / total)
        self.spread_mass, self.spread_unit = total, u

    def reward_std(self):
        """The weighted standard deviation of ``R``: ``unit * sqrt(M / W)``."""
        if self.spread_mass <= 0:
            return 0.0
        return float(self.spread_unit * np.sqrt(self.spread_m2 / self.spread_mass))

    def add_sums(self, cross=None, cross4=None, **sums):
        """Add sums over responses (the fast engine's regrouped sums): ``sums`` maps attribute names (``mass``, ``R``, ``h``, ``h2``, ...) to
        values; ``cross``, ``cross4`` ``(n, n, P)`` add to the leading ``n x n`` slots."""
        for name, value in sums.items():
            setattr(self, name, getattr(self, name) + value)
        if cross is not None:
            n = cross.shape[0]
            self.cross[:n, :n] += cross
            self.cross4[:n, :n] += cross4


def finish_fisher(m):
    """The Fisher quantities of one stream (``exact(..., quantities="fisher")``)."""
    return FisherStreamResult(score_mean=m.h, sequence_fisher=m.h2, token_fisher_sum=m.token_sum,
                              token_fisher_by_depth=m.token_sum_by_depth,
                              cond_score_max=m.cond_mean_max, mass=float(m.mass))


def finish_stream(m, baseline):
    """Derived quantities of one stream; ``baseline`` is a number or ``"mean"``."""
    r0 = m.r0 or 0.0
    ERc = m.R / m.mass  # E[R - r0]
    ER = r0 + ERc
    b = ER if baseline == "mean" else float(baseline)
    std_A = m.reward_std()  # merged, no cancellation, no underflow
    var_R = std_A * std_A
    d = r0 - b  # A = (R - r0) + d
    G = m.Rh + d * m.h
    cov = m.Rh - ERc * m.h
    bound = std_A * np.sqrt(m.h2)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.where(bound > 0, np.abs(cov) / np.where(bound > 0, bound, 1.0), 0.0)
    A2h2 = m.R2h2 + 2 * d * m.Rh2 + d * d * m.h2
    variances = {
        "h": m.h2 - m.h ** 2,
        "h2": m.h4 - m.h2 ** 2,
        "token_sum": m.g2 - m.g ** 2,
        "Ah": A2h2 - G ** 2,
        "cross": m.cross4 - m.cross ** 2,
        "reward": var_R,
    }
    return StreamResult(
        score_mean=m.h, sequence_fisher=m.h2, token_fisher_sum=m.token_sum,
        token_fisher_sum_paths=m.g, token_fisher_by_depth=m.token_sum_by_depth,
        cross_terms=m.cross, cond_score_max=m.cond_mean_max, mass=float(m.mass),
        expected_reward=float(ER), reward_std=float(std_A), baseline=float(b), gradient=G,
        covariance=cov, gradient_shift=m.h.copy(), bound=bound, correlation=corr,
        importance_gradient=m.is_Rh + d * m.is_h, variances=variances)
