r"""What a task gives at a batch of states, checked: the next-token probabilities of the
policy :math:`p` and of the sampler :math:`\mu` (``(B, V)`` each) and the logit sensitivities
:math:`j_{i,a}(s) = \partial z_a(s)/\partial\theta_i` (``(B, P, V)``), each refused with a
message that names the problem (NaN or ``+inf`` logits, a state whose logits are all
``-inf``, logits of the wrong shape, non-finite sensitivities, a token the policy emits and
the sampler never draws).

Both exact engines read their states through these: the fast one
(:mod:`fisher_ref.engine`) and the readable judge (:mod:`fisher_ref.reference`).
"""
from __future__ import annotations

import numpy as np

from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import softmax

__all__ = ["check_logits", "model_probs", "checked_sensitivities", "check_support"]


def check_logits(z, W, V, who):
    """Raise ``ValueError`` unless the logits ``z`` that ``who`` (``"model"`` or
    ``"sampler"``) returned for the windows ``W (B, k)`` are ``(B, V)``."""
    if z.shape != (W.shape[0], V):
        raise ValueError(f"the {who} returned logits of shape {z.shape} for {W.shape[0]} "
                         f"windows; expected ({W.shape[0]}, {V}) (V={V})")


def model_probs(task, theta, W):
    """Policy and sampler probabilities ``(B, V)`` each, with the logits checked."""
    z = np.asarray(task.model.logits(theta, W), dtype=float)  # (B, V)
    check_logits(z, W, task.model.vocab_size, "model")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError("the model returned NaN or +inf logits")
    if np.isneginf(z).all(axis=-1).any():
        raise ValueError("the model returned a state whose logits are all -inf")
    p = softmax(z)  # (B, V)
    if task.sampler is None:
        return p, p
    zq = np.asarray(task.sampler.logits(task.model, theta, W), dtype=float)  # (B, V)
    check_logits(zq, W, task.model.vocab_size, "sampler")
    if np.isnan(zq).any() or np.isposinf(zq).any() or np.isneginf(zq).all(axis=-1).any():
        raise ValueError("the sampler returned NaN, +inf or all -inf logits")
    return p, softmax(zq)


def checked_sensitivities(task, W, tokens_first=False, out=None):
    """Logit sensitivities ``j (B, P, V)`` of windows ``W (B, k)`` (``(B, V, P)`` with
    ``tokens_first``, into ``out`` when given), checked finite."""
    J = sensitivities(task.model, task.theta, W, tokens_first, out)  # (B, P, V) or (B, V, P)
    if not np.isfinite(J).all():
        raise ValueError("non-finite logit sensitivities (check the model's derivatives)")
    return J


def check_support(block, p, q):
    """Raise ``ValueError`` naming the state and the token where the sampler gives
    probability 0 to a token the policy emits (``p (B, V)``, ``q (B, V)``) at a state the
    policy reaches. ``block``: the states, with ``rp (B,)`` their reach under the policy,
    ``prompt (B,)``, ``tokens (B, L)`` and ``length (B,)``."""
    bad = (p > 0) & (q == 0) & (block.rp[:, None] > 0)  # (B, V)
    if bad.any():
        b, a = map(int, np.argwhere(bad)[0])
        state = block.tokens[b, :block.length[b]].tolist()
        raise ValueError(
            f"the sampler gives probability 0 to token {a} at state {state} (prompt "
            f"{int(block.prompt[b])}), which the policy emits with probability {p[b, a]:.3g}; "
            "responses the policy can produce would never be sampled, so importance "
            "weights p/mu are undefined there")
