r"""Token Fisher of one state from its next-token probabilities and sensitivities.

Centered form (the seeds' snippet):

.. math:: f_i(s) = \sum_a p_a (j_{i,a} - \bar j_i)^2,\qquad \bar j_i = \sum_b p_b j_{i,b}

Pairwise form:

.. math:: f_i(s) = \tfrac12 \sum_{a,b} p_a p_b (j_{i,a} - j_{i,b})^2

Both take ``probs`` of shape ``(..., V)`` and ``sens`` of shape ``(..., P, V)``
and return ``(..., P)``. Tokens of probability 0 contribute 0 (their
sensitivities must be finite).
"""
from __future__ import annotations

import numpy as np

__all__ = ["mean_sensitivity", "token_scores", "token_fisher", "token_fisher_pairwise",
           "uniform_token_fisher", "token_second_moment"]


def mean_sensitivity(probs, sens):
    r""":math:`\bar j_i = \sum_b p_b j_{i,b}`, shape ``(..., P)``."""
    return np.einsum("...v,...pv->...p", probs, sens)


def token_scores(sens, center):
    r"""Scores of every candidate token, :math:`j_{i,a} - \bar j_i`, shape ``(..., P, V)``.

    ``center`` is the ``(..., P)`` mean sensitivity to subtract (under the policy
    for the score :math:`\partial_i \log p_a`, under a sampler for centering).
    """
    return sens - center[..., None]


def token_second_moment(q, sens, center):
    r""":math:`\sum_a q_a (j_{i,a} - c_i)^2`: the second moment, under ``q``, of
    scores centered at ``c``. With ``c = \bar j`` under ``q`` it is the token Fisher."""
    return np.einsum("...v,...pv->...p", q, token_scores(sens, center) ** 2)


def token_fisher(probs, sens):
    r"""Centered form :math:`f_i = \sum_a p_a (j_{i,a} - \bar j_i)^2`, shape ``(..., P)``.

    Example:
        >>> import numpy as np
        >>> p = np.array([0.25, 0.75]); j = np.array([[1.0, 0.0], [2.0, 2.0]])
        >>> token_fisher(p, j)   # p(1-p) for the first row; a shift for the second
        array([0.1875, 0.    ])
    """
    return token_second_moment(probs, sens, mean_sensitivity(probs, sens))


def token_fisher_pairwise(probs, sens):
    r"""Pairwise form :math:`\tfrac12\sum_{a,b} p_a p_b (j_{i,a} - j_{i,b})^2`, ``(..., P)``.

    Costs ``O(P V^2)`` per state; loops over ``a`` to keep memory at ``O(P V)``.
    """
    out = np.zeros(sens.shape[:-1])
    for a in range(sens.shape[-1]):
        diff2 = (sens[..., a:a + 1] - sens) ** 2  # (..., P, V)
        out += probs[..., a, None] * np.einsum("...v,...pv->...p", probs, diff2)
    return 0.5 * out


def uniform_token_fisher(sens):
    r"""The uniform reference :math:`f^{unif}`: :math:`f` with ``p`` replaced by ``1/V``."""
    V = sens.shape[-1]
    return token_fisher(np.full(sens.shape[:-2] + (V,), 1.0 / V), sens)
