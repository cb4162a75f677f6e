r"""Running sums of one stream in torch, and the quantities derived from them.

For responses ``y`` drawn with weight ``w(y)`` (policy or sampler probability) and
states reached with :math:`\pi_w(s)`, a :class:`StreamSums` accumulates

- the reward's mass, mean and :math:`M_2 = \sum w (R - E[R])^2`, merged block by block
  (each block's own mean and :math:`M_2` in two passes, then Chan's update
  :math:`M_2 \mathrel{+}= M_{2,B} + \delta^2 W W_B/(W + W_B)`), so ``std(A)`` cancels
  neither under a large reward offset nor on a peaked model in low precision;
- per response, with :math:`R_c = R - r_0` (a reference reward, the first one seen):
  :math:`\sum w h`, :math:`\sum w h^2`, :math:`\sum w h^4`,
  :math:`\sum w R_c h`, :math:`\sum w R_c h^2`, :math:`\sum w R_c^2 h^2`, the importance
  weighted :math:`\sum w\rho h`, :math:`\sum w\rho R_c h` (:math:`w\rho = P(y)` where
  :math:`w > 0`), the path sums :math:`\sum w g`, :math:`\sum w g^2` of
  :math:`g = \sum_t m(s_t)`;
- cross terms :math:`C_{ut} = \sum w\,\xi_u\xi_t` and :math:`\sum w\,\xi_u^2\xi_t^2`,
  grouped by parent: the responses ending at one state's children share its history,
  so :math:`\sum_a w_a \xi_u \xi_t(a) = \xi_u \sum_a w_a \xi_t(a)` (the distributive law
  on a finite sum; no identity is used);
- per state: :math:`\sum_s \pi_w(s)\, m(s)` (the token sum by states).

:meth:`StreamSums.finish` gives, with :math:`d = r_0 - b` and :math:`A = R_c + d`,
:math:`\mathrm{std}(A) = \sqrt{M_2/W}` (``M2`` kept in units of a power of two of the rewards,
so that tiny rewards do not underflow when squared), :math:`G = E[R_c h] + d\,E[h]`,
:math:`\mathrm{Cov}(A,h) = E[R_c h] - E[R_c]E[h]`, the bound
:math:`\mathrm{std}(A)\sqrt{E[h^2]}`, the correlation ``|Cov| / bound`` (0 where the bound
is 0) and the exact variances of the per-response values.
"""
from __future__ import annotations

import torch

__all__ = ["StreamSums", "Ranges", "power_of_two"]


def power_of_two(x):
    """The smallest power of two at least ``x >= 0`` (a 0-d tensor; 0 for 0): dividing
    by it is exact, and it keeps ``x / unit`` in ``(1/2, 1]`` whatever ``x``'s size."""
    _, expo = torch.frexp(x)
    return torch.where(x > 0, torch.ldexp(torch.ones_like(x), expo), torch.zeros_like(x))


class StreamSums:
    r"""Running sums of one stream (see the module docstring); tensors on one device.
    With ``variances=False`` the fourth-moment sums (:math:`h^4`, :math:`R_c h^2`,
    :math:`R_c^2 h^2`, :math:`g^2`, :math:`\xi_u^2\xi_t^2`) are skipped and
    :meth:`finish` gives no ``variances``."""

    def __init__(self, P, T, device, dtype, variances=True):
        self.variances = variances
        z = lambda *shape: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        self.mass, self.mean, self.M2 = z(), z(), z()
        self.unit = z()  # M2 is in units of unit^2 (a power of two; 0: no reward yet)
        self.h, self.h2, self.h4, self.Rh, self.Rh2, self.R2h2 = (z(P) for _ in range(6))
        self.is_h, self.is_Rh, self.g, self.g2, self.token_sum = (z(P) for _ in range(5))
        self.token_sum_by_depth = z(T, P)
        self.cross, self.cross4 = z(T, T, P), z(T, T, P)

    def add_states(self, reach, m, depth):
        r""":math:`\sum_s \pi(s)\,m(s)` of a block: reach ``(B,)``, token moments ``m (B, P)``."""
        contrib = reach @ m  # (P,)
        self.token_sum += contrib
        self.token_sum_by_depth[depth] += contrib

    def add_rewards(self, w, R):
        """Merge a block's rewards ``R`` with weights ``w`` ``(C,)`` into mass, mean, M2.

        ``M2`` is kept in units of ``unit^2``, ``unit`` a power of two of the largest
        reward seen (0 while every reward is 0): deviations are divided by it (exactly)
        before they are squared, so rewards of 1e-170 do not underflow when squared."""
        wB = w.sum()
        r1 = R[:1].sum()  # the block's first reward: a constant block's mean is exact
        meanB = r1 + (w @ (R - r1)) / torch.where(wB > 0, wB, torch.ones_like(wB))
        u = torch.maximum(self.unit, power_of_two(R.abs().max()))
        us = torch.where(u > 0, u, torch.ones_like(u))  # all rewards 0: any unit will do
        M2B = w @ ((R - meanB) / us).square()  # in units of u^2
        W = self.mass + wB
        frac = wB / torch.where(W > 0, W, torch.ones_like(W))
        delta = meanB - self.mean
        self.mean = self.mean + delta * frac
        self.M2 = (self.M2 * (self.unit / us).square() + M2B
                   + (delta / us).square() * self.mass * frac)
        self.mass, self.unit = W, u

    def add_responses(self, w, Rc, wp, h):
        r"""Per-response sums: weights ``w``, rewards ``Rc = R - r0``, policy probabilities
        ``wp`` (``(C,)`` each) and each response's own score sum ``h (C, P)``."""
        wR = w * Rc
        rho_w = torch.where(w > 0, wp, torch.zeros_like(wp))  # (C,) w * P/w
        Eh, ERh, Erh, ErRh = torch.stack([w, wR, rho_w, rho_w * Rc]) @ h  # (P,) each
        self.h += Eh
        self.Rh += ERh
        self.is_h += Erh
        self.is_Rh += ErRh
        h2 = h * h  # (C, P)
        if not self.variances:
            self.h2 += w @ h2
            return h2
        Eh2, ERh2, ER2h2 = torch.stack([w, wR, wR * Rc]) @ h2  # (P,) each
        self.h2 += Eh2
        self.Rh2 += ERh2
        self.R2h2 += ER2h2
        self.h4 += w @ (h2 * h2)
        return h2

    def add_paths(self, Wg, g):
        """Path sums of one block's parents: group weights ``Wg (B,)``, ``g (B, P)``."""
        self.g += Wg @ g
        if self.variances:
            self.g2 += Wg @ (g * g)

    def add_last(self, depth, w, x):
        r"""Diagonal cross terms of responses ending at slot ``depth``, and their sums per
        parent for :meth:`add_history`.

        Args:
            w: ``(B, k)`` weights of the ``k`` ending children of each parent.
            x: ``(B, k, P)`` their last scores :math:`\xi_{depth}(a)`.

        Returns:
            ``(X1, X2)``: ``(B, P)`` each, :math:`\sum_a w_a \xi(a)` and
            :math:`\sum_a w_a \xi(a)^2` per parent (``X1`` is ``None`` at depth 0).
        """
        wb = w[:, None, :]  # (B, 1, k)
        x2 = x * x  # (B, k, P)
        X2 = torch.bmm(wb, x2)[:, 0]  # (B, P)
        self.cross[depth, depth] += X2.sum(0)
        if self.variances:
            self.cross4[depth, depth] += torch.bmm(wb, x2.square_())[:, 0].sum(0)
        X1 = torch.bmm(wb, x)[:, 0] if depth else None  # (B, P)
        return X1, X2

    def add_history(self, depth, Wg, X1, X2, hist):
        r"""Cross terms that involve the parents' scores, grouped by parent:
        :math:`\sum_a w_a \xi_u \xi_d(a) = \xi_u X_1`, and for ``u, t < d``
        :math:`\sum_a w_a \xi_u\xi_t = W \xi_u \xi_t` (fourth moments likewise).

        Args:
            Wg: ``(B,)`` total weight of each parent's ending children.
            X1, X2: ``(B, P)`` from :meth:`add_last`.
            hist: ``(B, depth, P)`` the parents' scores :math:`\xi_u`.
        """
        d, v = depth, self.variances
        c = (hist * X1[:, None]).sum(0)  # (d, P)
        self.cross[:d, d] += c
        self.cross[d, :d] += c
        hist2 = hist * hist if v else None  # (B, d, P)
        if v:
            c4 = (hist2 * X2[:, None]).sum(0)  # (d, P)
            self.cross4[:d, d] += c4
            self.cross4[d, :d] += c4
        Wg = Wg[:, None]  # (B, 1)
        for u in range(d):
            wu = Wg * hist[:, u]  # (B, P)
            wu2 = Wg * hist2[:, u] if v else None
            for t in range(u, d):
                pairs = [(self.cross, (wu * hist[:, t]).sum(0))]  # (P,)
                if v:
                    pairs.append((self.cross4, (wu2 * hist2[:, t]).sum(0)))
                for acc, c in pairs:
                    acc[u, t] += c
                    if t != u:
                        acc[t, u] += c

    def finish(self, r0, baseline):
        """Derived quantities (tensors); ``baseline`` a number or ``"mean"``."""
        m, ER = self.mass, self.mean
        ERc = ER - r0  # E[R - r0]
        b = ER if baseline == "mean" else torch.as_tensor(float(baseline), dtype=m.dtype,
                                                           device=m.device)
        std_A = self.unit * (self.M2 / m).sqrt()  # M2 in units of unit^2: no underflow
        var_R = std_A * std_A
        d = r0 - b  # A = (R - r0) + d
        G = self.Rh + d * self.h
        cov = self.Rh - ERc * self.h
        bound = std_A * self.h2.sqrt()
        corr = torch.where(bound > 0, cov.abs() / torch.where(bound > 0, bound, 1.0),
                           torch.zeros_like(bound))
        variances = None
        if self.variances:
            A2h2 = self.R2h2 + 2 * d * self.Rh2 + d * d * self.h2
            variances = {"h": self.h2 - self.h ** 2, "h2": self.h4 - self.h2 ** 2,
                         "token_sum": self.g2 - self.g ** 2, "Ah": A2h2 - G ** 2,
                         "cross": self.cross4 - self.cross ** 2, "reward": var_R}
        return {"score_mean": self.h, "sequence_fisher": self.h2,
                "token_fisher_sum": self.token_sum, "token_fisher_sum_paths": self.g,
                "token_fisher_by_depth": self.token_sum_by_depth,
                "cross_terms": self.cross, "gradient": G, "covariance": cov,
                "bound": bound, "correlation": corr, "expected_reward": ER,
                "reward_std": std_A, "baseline": b,
                "importance_gradient": self.is_Rh + d * self.is_h, "mass": m,
                "variances": variances}


class Ranges:
    r"""The largest :math:`|x(y) - E[x]|` over on-policy responses of positive probability,
    for :math:`x = h^2` and :math:`x = \sum_t f(s_t)` (the range ``b`` of a Bernstein
    test), from running maxima and minima: :math:`\max(\max x - E, E - \min x)`. For
    :math:`h^2` the minimum is taken as 0 (a lower bound), which gives an upper bound on
    the range, as valid for the test and one reduction cheaper."""

    def __init__(self, P, device, dtype):
        inf = torch.full((P,), float("inf"), dtype=dtype, device=device)
        self.hi = {"sequence_fisher": -inf, "token_fisher_sum": -inf.clone()}
        self.lo = {"sequence_fisher": inf.clone(), "token_fisher_sum": inf.clone()}

    def add(self, key, live, x):
        """Rows ``x (C, P)`` of which ``live (C,)`` have positive probability."""
        if live.any():
            x = x if live.all() else x[live]
            self.hi[key] = torch.maximum(self.hi[key], x.amax(0))
            if key != "sequence_fisher":
                self.lo[key] = torch.minimum(self.lo[key], x.amin(0))
            else:
                self.lo[key] = torch.zeros_like(self.lo[key])

    def finish(self, means):
        """``{key: (P,)}`` given the exact means ``{key: (P,)}``."""
        return {k: torch.maximum(self.hi[k] - means[k], means[k] - self.lo[k]) for k in self.hi}
