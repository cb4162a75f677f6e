r"""What the walk over every group (or batch) of :func:`expected_loss_gradient` feeds:
weighted moments merged chunk by chunk, or every gradient kept.

Each chunk brings its probabilities ``w (n,)`` and gradients ``g (n, P)``;
:class:`Merged` keeps :math:`W = \sum w`, the mean and the sums of squared deviations
(Chan et al.'s pairwise merge, so chunks of any size give the same numbers to rounding),
:class:`Collected` keeps every row.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Merged", "Collected"]


class Merged:
    r"""Weighted mean and sum of squared deviations, merged chunk by chunk (Chan et al.);
    with ``covariance`` also the co-moment :math:`\sum_n w_n (g_n - m)(g_n - m)^T`
    ``(P, P)``, merged the same way (the cross term :math:`d d^T W_a W_c / W`); and the
    range ``low``, ``high`` ``(P,)`` of the gradients of positive weight."""

    def __init__(self, P, covariance=False):
        self.W, self.mean, self.M2 = 0.0, np.zeros(P), np.zeros(P)
        self.low, self.high = np.full(P, np.inf), np.full(P, -np.inf)
        self.C = np.zeros((P, P)) if covariance else None

    def add(self, w, g):
        Wc = w.sum()
        if Wc == 0:
            return
        live = g[w > 0]
        np.minimum(self.low, live.min(axis=0), out=self.low)
        np.maximum(self.high, live.max(axis=0), out=self.high)
        mc = np.einsum("n,np->p", w, g) / Wc  # einsum: no BLAS threads to contend
        g -= mc  # in place: g is this chunk's own array
        Cc = None if self.C is None else g.T @ (w[:, None] * g)  # (P, P)
        np.square(g, out=g)
        M2c = np.einsum("n,np->p", w, g)
        d, W = mc - self.mean, self.W + Wc
        if Cc is not None:
            self.C += Cc
            self.C += np.outer(d, d) * (self.W * Wc / W)
        self.mean = self.mean + d * (Wc / W)
        self.M2 = self.M2 + M2c + d * d * (self.W * Wc / W)
        self.W = W

    @property
    def covariance(self):
        """:math:`C / W` ``(P, P)``, symmetric to the bit, or ``None``."""
        if self.C is None:
            return None
        return (self.C + self.C.T) / (2 * self.W if self.W > 0 else 2.0)


class Collected:
    """Every chunk's probabilities and gradients, kept in order."""

    def __init__(self):
        self.w, self.g = [], []

    def add(self, w, g):
        self.w.append(np.array(w, dtype=np.float64))
        self.g.append(np.array(g, dtype=np.float64))

    def arrays(self, P):
        """``(gradients (N, P), probabilities (N,))``."""
        if not self.w:
            return np.zeros((0, P)), np.zeros(0)
        return np.concatenate(self.g), np.concatenate(self.w)
