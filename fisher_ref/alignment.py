r"""Per-response and per-state views used by the lessons.

- :func:`response_token_scores`: the token scores
  :math:`\xi_{t,i} = j_{i,y_t}(s_t) - \bar j_i(s_t)` of one response, so a
  single response's cross terms :math:`\xi_{u,i}\xi_{t,i}` can be looked at;
- :func:`pairwise_terms`: the pair contributions
  :math:`\tfrac12 p_a p_b (j_{i,a} - j_{i,b})^2` whose sum is the token Fisher;
- :func:`fisher_ratio`: the alignment diagnostic :math:`f_i(s) / f^{unif}_i(s)`
  for every kept state of an :class:`~fisher_ref.results.ExactResult`;
- :func:`entropy`: the entropy of each state's next-token distribution.
"""
from __future__ import annotations

import numpy as np

from .model import model_windows, softmax
from .sensitivities import sensitivities
from .token_fisher import mean_sensitivity

__all__ = ["response_token_scores", "pairwise_terms", "fisher_ratio", "entropy",
           "RATIO_FLOOR"]

#: f_unif below this (relative to its largest value) counts as "no sensitivity":
#: the ratio is undefined there and returned as NaN.
RATIO_FLOOR = 1e-12


def response_token_scores(task, prompt, response):
    r"""Token scores of one response, :math:`\xi_{t,i} = \partial_i \log p(y_t|s_t)`.

    .. math:: \xi_{t,i} = j_{i,y_t}(s_t) - \sum_b p_b(s_t)\, j_{i,b}(s_t)

    Positions after the response ends hold 0 (DESIGN §1).

    Args:
        task: a :class:`fisher_ref.tasks.Task` (its model and ``theta`` are used).
        prompt: index into ``task.prompts``.
        response: the generated tokens (EOS included if it ended with EOS),
            ``-1`` padding allowed at the end.

    Returns:
        float64 ``(T, P)`` with ``T = task.max_len``.

    Example:
        >>> from fisher_ref import load_config
        >>> task = load_config("tabular")
        >>> response_token_scores(task, 0, [2, 0]).shape
        (3, 12)
    """
    model, theta = task.model, task.theta
    if not 0 <= int(prompt) < len(task.prompts):
        raise ValueError(f"prompt index {prompt} out of range 0..{len(task.prompts) - 1}")
    resp = [int(t) for t in response if int(t) >= 0]
    if len(resp) == 0 or len(resp) > task.max_len:
        raise ValueError(f"a response needs 1..{task.max_len} tokens, got {len(resp)}")
    V = model.vocab_size
    if any(not 0 <= t < V for t in resp):
        raise ValueError(f"response {resp} holds a token outside 0..{V - 1}")
    if model.eos and 0 in resp[:-1]:
        raise ValueError(f"response {resp} continues after EOS (token 0)")
    pr = list(task.prompts[int(prompt)])
    states = [pr + resp[:t] for t in range(len(resp))]
    W = model_windows(model, states)  # (n, k)
    p = softmax(np.asarray(model.logits(theta, W), dtype=float))  # (n, V)
    J = sensitivities(model, theta, W)  # (n, P, V)
    jbar = mean_sensitivity(p, J)  # (n, P)
    xi = np.zeros((task.max_len, model.num_params))  # (T, P)
    xi[:len(resp)] = J[np.arange(len(resp)), :, resp] - jbar
    return xi


def pairwise_terms(probs, sens):
    r"""Pair contributions :math:`\tfrac12 p_a p_b (j_{i,a} - j_{i,b})^2`.

    Their sum over ``a, b`` is the token Fisher :math:`f_i`.

    Args:
        probs: ``(V,)`` next-token probabilities of one state.
        sens: ``(P, V)`` sensitivities of that state.

    Returns:
        ``(P, V, V)``.

    Example:
        >>> float(pairwise_terms(np.array([0.5, 0.5]), np.array([[1.0, 0.0]])).sum())
        0.25
    """
    probs = np.asarray(probs, dtype=float)
    sens = np.asarray(sens, dtype=float)
    if probs.ndim != 1 or sens.ndim != 2 or sens.shape[1] != probs.shape[0]:
        raise ValueError(f"need probs (V,) and sens (P, V); got {probs.shape} and {sens.shape}")
    diff = sens[:, :, None] - sens[:, None, :]  # (P, V, V)
    return 0.5 * probs[None, :, None] * probs[None, None, :] * diff ** 2


def fisher_ratio(result, floor=RATIO_FLOOR):
    r"""The alignment diagnostic :math:`f_i(s) / f^{unif}_i(s)` at every kept state.

    Entries whose :math:`f^{unif}` is below ``floor`` times its largest value are
    NaN (the parameter does not move the logits there at all).

    Args:
        result: an :class:`~fisher_ref.results.ExactResult` with ``states`` kept.

    Returns:
        ``(N, P)`` float64.
    """
    if result.states is None:
        raise ValueError("the result kept no per-state arrays; run exact(..., keep_states=True)")
    f = result.states["token_fisher"]  # (N, P)
    fu = result.states["uniform"]  # (N, P)
    ok = fu > floor * max(float(fu.max()), np.finfo(float).tiny)
    return np.where(ok, f / np.where(ok, fu, 1.0), np.nan)


def entropy(probs):
    r""":math:`H = -\sum_a p_a \log p_a` (nats) of each row, ``(..., V) -> (...)``.

    Example:
        >>> round(float(entropy(np.array([0.5, 0.5]))), 6)
        0.693147
    """
    probs = np.asarray(probs, dtype=float)
    logp = np.log(np.where(probs > 0, probs, 1.0))
    return -(probs * logp).sum(axis=-1)
