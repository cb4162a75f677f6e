r"""The natural scale of a score at a single state (docs/theory.md §9.3): the largest
:math:`f(s)`, :math:`f_\mu(s)` and :math:`f_{unif}(s)` over the reachable states,
against which :mod:`fisher_ref.checks.identities` measures the scores that must vanish.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import softmax, token_fisher, uniform_token_fisher

__all__ = ["state_score_scale"]

_SCALE_BYTES = 2 ** 26  # sensitivities held at once when the score scale is recomputed


def state_score_scale(result):
    r"""Largest token-level score scale over the states: :math:`\max_s` of ``f(s)``,
    :math:`f_\mu(s)` and :math:`f_{unif}(s)` (the spread of ``j`` over tokens), from the
    kept per-state arrays, or, when they were not kept, recomputed on every distinct
    window of the task (:func:`distinct_windows`): the scale never depends on what
    was kept.

    :math:`\max_s |E[\xi|s]|` runs over every reachable state, however unlikely, and
    its rounding is that of :math:`\bar j` at such a state; on a peaked policy
    :math:`\max_i F_i` (reach-weighted) can be 1e-24 while a rarely reached state has
    ``f(s)`` near 0.03, so ``F`` alone is not its scale.
    """
    st = result.states
    if st is None:
        return window_score_scale(result.task, distinct_windows(result.task))
    keys = [k for k in ("token_fisher", "sampler_token_fisher", "uniform") if k in st]
    return float(max(np.max(st[k], initial=0.0) for k in keys))


def distinct_windows(task):
    """``(U, k)`` the distinct windows of every state of ``task`` (depth ``< T``), found
    depth by depth keeping one token row per distinct window: a state's window decides
    its children's (the last ``context`` tokens; GPT-2's window is the whole prefix)."""
    model, T = task.model, task.max_len
    lengths = np.array([len(p) for p in task.prompts], dtype=np.int64)  # (B,)
    rows = np.full((len(task.prompts), int(lengths.max()) + T), -1, dtype=np.int64)
    for i, p in enumerate(task.prompts):
        rows[i, :len(p)] = p
    go_on = np.arange(1 if model.eos else 0, model.vocab_size)  # tokens a state continues after
    seen = []
    for depth in range(T):
        W, first = np.unique(model.windows(rows, lengths), axis=0, return_index=True)
        rows, lengths = rows[first], lengths[first]
        seen.append(W)
        if depth + 1 < T:
            n = len(rows)
            rows, lengths = np.repeat(rows, len(go_on), axis=0), np.repeat(lengths, len(go_on))
            rows[np.arange(len(rows)), lengths] = np.tile(go_on, n)
            lengths = lengths + 1
    return np.unique(np.concatenate(seen), axis=0)


def window_score_scale(task, W):
    r""":math:`\max` of ``f``, :math:`f_\mu` and :math:`f_{unif}` over windows ``W (U, k)``,
    in blocks of at most ``_SCALE_BYTES`` of sensitivities."""
    model, theta = task.model, task.theta
    chunk = max(1, _SCALE_BYTES // (8 * model.num_params * model.vocab_size))
    best = 0.0
    for a in range(0, len(W), chunk):
        w = W[a:a + chunk]
        J = sensitivities(model, theta, w)  # (B, P, V)
        fs = [token_fisher(softmax(np.asarray(model.logits(theta, w), float)), J),
              uniform_token_fisher(J)]
        if task.sampler is not None:
            mu = softmax(np.asarray(task.sampler.logits(model, theta, w), float))  # (B, V)
            fs.append(token_fisher(mu, J))
        best = max(best, *(float(np.max(f, initial=0.0)) for f in fs))
    return best


