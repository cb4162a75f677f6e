r"""The second route to the policy gradient: the derivative of the exact expected reward
:math:`\sum_y P(y) R(y)` by the chain rule, with autograd's vector-Jacobian product for the
model's logits. It reads nothing of the sensitivities or scores the moment sums use, so
``ExactResult.gradient_autodiff`` checks the score-function gradient independently."""
from __future__ import annotations

import numpy as np
from autograd import make_vjp

from fisher_ref.numerics import log_softmax, softmax

__all__ = ["reward_gradient", "parts_gradient"]


def reward_gradient(task, theta, Wu, win, nxt, live, weights, R):
    r"""grad_theta of :math:`\sum_m w_m \exp(\sum_{t\,\text{live}} \log p(y_{m,t} | s_{m,t})) R_m`.

    The chain rule, one step at a time: the derivative with respect to each
    log-probability :math:`\ell_{u,a}` is :math:`\sum c_m` over the live slots that read
    it, :math:`c_m = w_m P(y_m) R_m` (a ``bincount``); through the log-softmax
    :math:`\partial/\partial z_{u,b} = g_{u,b} - p_{u,b} \sum_a g_{u,a}`; through the
    model, autograd's vector-Jacobian product of its logits at ``theta``. Nothing here
    reads the sensitivities or scores the moment sums use.

    Args:
        Wu: ``(U, k)`` distinct windows; their logits are evaluated once.
        win, nxt: ``(M, T)`` window (row of ``Wu``) and next token of every slot.
        live: ``(M, T)`` slots holding a generated token; the others are dropped with
            a ``where``, not multiplied by 0 (a slot's log-probability may be
            ``-inf``, a masked token, and ``0 * -inf`` is NaN).
        weights, R: ``(M,)`` prompt weights and rewards.
    """
    M, T = win.shape
    flat = win * task.model.vocab_size + nxt  # (M, T) into the (U*V,) log-probs
    vjp, z, lp = _forward(task, theta, Wu)
    logP = np.where(live, lp[flat], 0.0).sum(axis=1)  # (M,)
    c = weights * np.exp(logP) * R  # (M,) the derivative with respect to logP
    g = np.bincount(flat[live], np.broadcast_to(c[:, None], (M, T))[live], minlength=lp.size)
    return _backward(vjp, z, g)


def _forward(task, theta, Wu):
    """The model's logits at the windows ``Wu`` (their vector-Jacobian product ``vjp``,
    ``z (U, V)``) and the flat log-probabilities ``(U V,)``."""
    vjp, z = make_vjp(lambda th: task.model.logits(th, Wu))(theta)
    z = np.asarray(z, dtype=float)
    return vjp, z, log_softmax(z).reshape(-1)


def _backward(vjp, z, g):
    r"""The gradient of the derivatives ``g (U V,)`` by the log-probabilities: through the
    log-softmax, :math:`\partial/\partial z_{u,b} = g_{u,b} - p_{u,b} \sum_a g_{u,a}`, then
    through the model (``vjp``)."""
    g = g.reshape(z.shape)
    return vjp(g - softmax(z) * g.sum(axis=1, keepdims=True))


def parts_gradient(task, theta, Wu, parts):
    r""":func:`reward_gradient` of responses given in parts
    ``[(win, nxt, wlast, K, weights, R), ...]``, each the children ending with the tokens
    ``K (k,)`` of ``B`` parents whose every slot holds a generated token: the parents'
    windows and next tokens ``win``, ``nxt`` ``(B, d)`` (``d`` their length, maybe 0), the
    window the last token is drawn at ``wlast (B,)`` (a row of ``Wu``), ``weights (B,)``
    and the rewards ``R (B, k)``. No slot is dropped, so no mask is formed; the
    log-probabilities of every part are read from one forward pass; a parent's slots take
    the derivatives of its children summed (one entry per parent and slot), and every
    part's go into one ``bincount`` and one vector-Jacobian product."""
    V = task.model.vocab_size
    vjp, z, lp = _forward(task, theta, Wu)
    flats, cs = [], []
    for win, nxt, wlast, K, weights, R in parts:
        pre = win * V + nxt  # (B, d) into the log-probs
        last = wlast[:, None] * V + K[None, :]  # (B, k)
        logP = lp[pre].sum(axis=1)[:, None] + lp[last]  # (B, k)
        c = weights[:, None] * np.exp(logP) * R  # (B, k): the derivative by log P
        flats += [pre.ravel(), last.ravel()]
        cs += [np.repeat(c.sum(axis=1), pre.shape[1]), c.ravel()]
    return _backward(vjp, z, np.bincount(np.concatenate(flats), np.concatenate(cs),
                                         minlength=lp.size))
