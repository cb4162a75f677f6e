r"""Group estimators whose advantage depends on the other responses only through their
rewards: the exact sum over reward classes.

If :math:`A_1 = a(R_1; R_2..R_G)` and the responses are i.i.d. from :math:`\mu`, then

.. math:: E[A_1 w_1 h_1] = \sum_c a_G(c)\,H(c), \qquad
   H(c) = \sum_{y:\,R(y)=c} \mu(y)\,w(y)\,h(y), \qquad
   a_G(c) = E[A_1 \mid R_1 = c],

the last over the other :math:`G-1` rewards, i.i.d. from the class probabilities
:math:`\pi_c = \sum_{y:R(y)=c}\mu(y)`. It costs one sum per class and one per multiset of
the others' classes, :math:`\binom{K+G-2}{G-1}` of them, so ``G = 8`` or ``16`` is exact
where tuple enumeration (:math:`M^G` groups) cannot go.

With binary rewards and :math:`w = 1` on policy, :math:`H(1) = -H(0) = \nabla p` with
:math:`p = P(R = 1)`, so each prompt contributes :math:`w_G(p)\,\nabla p`, GRPO's
difficulty weight (:func:`difficulty_weight`)

.. math:: w_G(p) = E_{K\sim\mathrm{Bin}(G-1,p)}[a(1, K) - a(0, K)],

which tends to :math:`1/\sqrt{p(1-p)}` as ``G`` grows but is far from the large-``G``
formula :math:`(1 - 1/G)/\sqrt{p(1-p)}` at small ``G``.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from ..tasks import require_task
from .groups import response_table
from .presets import advantages

__all__ = ["reward_classes", "class_advantages", "reduced_gradient", "difficulty_weight",
           "difficulty_weight_large_g"]


def _advantage_fn(advantage, baseline=0.0):
    if callable(advantage):
        return advantage
    return lambda r: advantages(r, advantage, baseline)


def _log_multinomial(counts, probs):
    n = sum(counts)
    out = math.lgamma(n + 1)
    for k, q in zip(counts, probs):
        if k:
            if q == 0:
                return -math.inf
            out += k * math.log(q) - math.lgamma(k + 1)
    return out


def _compositions(n, K):
    """Every ``(n_1..n_K)`` of non-negative integers summing to ``n``."""
    for cut in itertools.combinations(range(n + K - 1), K - 1):
        edges = (-1,) + cut + (n + K - 1,)
        yield tuple(edges[i + 1] - edges[i] - 1 for i in range(K))


def class_advantages(values, probs, group_size, advantage="grpo", baseline=0.0):
    r""":math:`a_G(c) = E[A_1 | R_1 = c]` for each reward value ``c`` of ``values (K,)``,
    the others' rewards i.i.d. with probabilities ``probs (K,)``: ``(K,)``.

    Args:
        advantage: a name of :func:`fisher_ref.estimators.presets.advantages`
            (``"grpo"``, ``"rloo"``, ``"group_mean"``, ``"constant"``) or a callable
            ``rewards (G,) tensor -> advantages (G,)``.
    """
    fn, G = _advantage_fn(advantage, baseline), int(group_size)
    values = np.asarray(values, dtype=float)
    out = np.zeros(len(values))
    for counts in _compositions(G - 1, len(values)):
        lw = _log_multinomial(counts, probs)
        if lw == -math.inf:
            continue
        others = np.repeat(values, counts)
        for c, v in enumerate(values):
            r = torch.tensor(np.r_[v, others], dtype=torch.float64)
            out[c] += math.exp(lw) * float(fn(r)[0])
    return out


def reward_classes(task, aggregation="seq-mean-token-sum", weight=None):
    r"""Per prompt: ``(w_x, values (K,), probs (K,), H (K, P))``, the reward classes of the
    prompt's responses, their probabilities under the sampler and
    :math:`H(c) = \sum_{y \in c}\mu(y)\,w(y)\,h(y)`.

    Args:
        aggregation: ``h`` is :math:`\sum_t\xi_t` (``"seq-mean-token-sum"``) or
            :math:`\frac{1}{|y|}\sum_t\xi_t` (``"seq-mean-token-mean"``).
        weight: ``None`` (:math:`w = 1`) or ``"sequence"``, :math:`w = p(y)/\mu(y)`.
    """
    if aggregation not in ("seq-mean-token-sum", "seq-mean-token-mean"):
        raise ValueError(f"the reward-class reduction takes aggregation 'seq-mean-token-sum' "
                         f"or 'seq-mean-token-mean' (per response), got {aggregation!r}")
    if weight not in (None, "sequence"):
        raise ValueError(f"weight must be None or 'sequence', got {weight!r}")
    table = response_table(require_task(task))
    out = []
    for pr in table.prompts:
        tok = np.where(pr.mask, pr.tokens, 0)
        xi = np.where(pr.mask[..., None], table.xi[pr.rows, tok], 0.0)  # (M, T, P)
        h = xi.sum(axis=1)  # (M, P)
        if aggregation == "seq-mean-token-mean":
            h = h / pr.lengths[:, None]
        q = np.exp(pr.sampler_logp)  # (M,)
        c = q if weight is None else np.exp(pr.logp)  # mu w = p for sequence IS
        values, cls = np.unique(pr.rewards, return_inverse=True)
        probs = np.bincount(cls, q, minlength=len(values))
        H = np.zeros((len(values), h.shape[1]))
        np.add.at(H, cls, c[:, None] * h)
        out.append((pr.weight, values, probs, H))
    return out


def reduced_gradient(task, group_size, advantage="grpo", aggregation="seq-mean-token-sum",
                     weight=None, baseline=0.0):
    r""":math:`\sum_x w_x \sum_c a_G(c) H_x(c) = E[A_1 w_1 h_1]`: ``(P,)``. The preset loss
    ``policy_gradient_loss(advantage, aggregation=...)`` has expected gradient minus
    this (its responses are exchangeable)."""
    total = 0.0
    for wx, values, probs, H in reward_classes(task, aggregation, weight):
        total = total + wx * class_advantages(values, probs, group_size, advantage,
                                              baseline) @ H
    return total


def _check_p(p, G):
    if not (isinstance(p, (int, float, np.floating)) and 0 < p < 1):
        raise ValueError(f"p must be a probability strictly between 0 and 1, got {p!r}")
    if isinstance(G, bool) or not isinstance(G, (int, np.integer)) or G < 2:
        raise ValueError(f"group_size must be an integer >= 2, got {G!r}")


def difficulty_weight(p, group_size, advantage="grpo"):
    r""":math:`w_G(p) = E_{K\sim\mathrm{Bin}(G-1,p)}[a(1,K) - a(0,K)]`, binary rewards.

    Example:
        >>> round(difficulty_weight(0.02, 8), 2)
        2.41
    """
    _check_p(p, group_size)
    a = class_advantages([0.0, 1.0], [1 - p, p], group_size, advantage)
    return float(a[1] - a[0])


def difficulty_weight_large_g(p, group_size):
    r"""The large-``G`` formula :math:`(1 - 1/G)/\sqrt{p(1-p)}` (limit
    :math:`1/\sqrt{p(1-p)}`).

    Example:
        >>> round(difficulty_weight_large_g(0.02, 8), 2)
        6.25
    """
    _check_p(p, group_size)
    return (1 - 1 / group_size) / math.sqrt(p * (1 - p))
