r"""The formulas every part names: softmax and log-softmax, the token Fisher of one state
from its next-token probabilities and sensitivities, and top-``k`` centering.

Softmax and log-softmax normalise by a row shift (autograd-safe, finite for logits of
size 1e3, probability 0 for a ``-inf`` logit).

Centered form (the seeds' snippet):

.. math:: f_i(s) = \sum_a p_a (j_{i,a} - \bar j_i)^2,\qquad \bar j_i = \sum_b p_b j_{i,b}

Pairwise form:

.. math:: f_i(s) = \tfrac12 \sum_{a,b} p_a p_b (j_{i,a} - j_{i,b})^2

Both take ``probs`` of shape ``(..., V)`` and ``sens`` of shape ``(..., P, V)``
and return ``(..., P)``. Tokens of probability 0 contribute 0 (their
sensitivities must be finite).
"""
from __future__ import annotations

import autograd.numpy as anp
import numpy as np
from autograd.tracer import getval

__all__ = ["TANH_CLIP", "softmax", "log_softmax", "topk_center", "topk_weights", "mean_sensitivity", "token_scores", "token_fisher", "token_fisher_pairwise",
           "uniform_token_fisher", "token_second_moment"]


TANH_CLIP = 20.0  # |y| beyond which float64 tanh(y) is exactly +-1 (the models clip there)


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


def _row_shift(z):
    """Row maximum of the plain value of ``z`` (0 for a row that is all ``-inf``): ``(B, 1)``.

    Softmax and log-softmax do not depend on the shift, so treating it as a
    constant under autograd leaves their derivatives exact.
    """
    m = np.max(getval(z), axis=-1, keepdims=True)  # (B, 1)
    return np.where(np.isfinite(m), m, 0.0)


def log_softmax(z):
    r"""Row-wise :math:`\log p = z - \operatorname{logsumexp}(z)` (autograd-safe).

    A row that is all ``-inf`` gives NaN, as logsumexp would (callers refuse such rows).

    Example:
        >>> import numpy as np
        >>> np.round(np.exp(log_softmax(np.array([[0.0, np.log(3.0)]]))), 6)
        array([[0.25, 0.75]])
    """
    shifted = z - _row_shift(z)  # (B, V), at most 0 on a finite row
    return shifted - anp.log(anp.sum(anp.exp(shifted), axis=-1, keepdims=True))


def softmax(z):
    r"""Row-wise :math:`p = e^{z - \max z} / \sum e^{z - \max z}` (autograd-safe).

    Finite for :math:`|z| \sim 10^3`; a ``-inf`` logit gives probability 0.

    Example:
        >>> import numpy as np
        >>> softmax(np.array([[1e3, 1e3 + np.log(3.0), -np.inf]])).round(6)
        array([[0.25, 0.75, 0.  ]])
    """
    e = anp.exp(z - _row_shift(z))  # (B, V)
    return e / anp.sum(e, axis=-1, keepdims=True)


def topk_center(q, sens, k):
    r"""Mean sensitivity under the top-``k`` tokens of ``q``, renormalised: ``(B, P)``.

    .. math:: c_i = \sum_{a \in K} q_a j_{i,a} / \sum_{a \in K} q_a,
       \quad K = \text{the } k \text{ most likely tokens (ties: lowest id first)}

    Example:
        >>> topk_center(np.array([[0.5, 0.3, 0.2]]), np.array([[[1.0, 2.0, 4.0]]]), 2)
        array([[1.375]])
    """
    return mean_sensitivity(topk_weights(q, k), sens)


def topk_weights(q, k):
    """``q (B, V)`` kept on its ``k`` largest entries (ties: lowest id first), renormalised.

    Example:
        >>> topk_weights(np.array([[0.5, 0.3, 0.2]]), 2)
        array([[0.625, 0.375, 0.   ]])
    """
    if k >= q.shape[-1]:
        return q
    order = np.argsort(-q, axis=-1, kind="stable")  # (B, V)
    keep = np.zeros_like(q, dtype=bool)
    np.put_along_axis(keep, order[:, :k], True, axis=-1)
    qk = np.where(keep, q, 0.0)  # (B, V)
    return qk / qk.sum(axis=-1, keepdims=True)
