r"""Exact policy-gradient steps on a task's parameters, and bf16 rounding.

Each step takes the exact on-policy gradient :math:`G = E[A h] = \nabla_\theta E[R]`
from :func:`fisher_ref.exact.exact` and ascends it:

- SGD: :math:`\theta \leftarrow \theta + \eta\, G`;
- Adam (Kingma & Ba, bias-corrected):
  :math:`m \leftarrow \beta_1 m + (1-\beta_1) G`,
  :math:`v \leftarrow \beta_2 v + (1-\beta_2) G^2`,
  :math:`\theta \leftarrow \theta + \eta\, \hat m / (\sqrt{\hat v} + \epsilon)`.

:func:`bf16_round` rounds float32 values to bfloat16 (round to nearest, ties to
even) by bit manipulation, so "which parameters changed at bf16 precision" can
be counted without a bf16 dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fisher_ref.engine.fast import exact
from fisher_ref.engine.plan import EngineOptions

__all__ = ["Trajectory", "policy_gradient", "bf16_round", "bf16_changed"]

OPTIMIZERS = ("sgd", "adam")


@dataclass
class Trajectory:
    """Parameters and exact quantities along a run.

    Attributes:
        thetas: ``(steps + 1, P)`` parameters, ``thetas[0]`` the start.
        gradients: ``(steps, P)`` exact gradient used at each step.
        fishers: ``(steps, P)`` exact sequence Fisher at each step's parameters.
        expected_rewards: ``(steps + 1,)`` exact :math:`E[R]` at each ``thetas[k]``.
        optimizer: ``"sgd"`` or ``"adam"``.
    """

    thetas: np.ndarray
    gradients: np.ndarray
    fishers: np.ndarray
    expected_rewards: np.ndarray
    optimizer: str


#: A step needs the sums only, not the per-state and per-response arrays.
_NOTHING_KEPT = EngineOptions(keep_states=False, keep_sequences=False)


def _exact_step(task, theta):
    r = exact(task.with_(theta=theta), progress=False, options=_NOTHING_KEPT)
    return r.gradient, r.sequence_fisher, r.expected_reward


def policy_gradient(task, steps, lr, optimizer="sgd", betas=(0.9, 0.999), eps=1e-8):
    r"""Run ``steps`` exact policy-gradient ascent steps on ``task.theta``.

    The gradient is the policy stream's :math:`E[A h]` (with a constant baseline
    it equals :math:`\nabla_\theta E[R]`); a sampler on the task is ignored for
    the update (the policy stream is always on-policy).

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        steps: number of updates (>= 1).
        lr: step size :math:`\eta` (> 0).
        optimizer: ``"sgd"`` or ``"adam"``.
        betas, eps: Adam's constants.

    Returns:
        :class:`Trajectory`.

    Example:
        >>> from fisher_ref import load_config
        >>> tr = policy_gradient(load_config("tabular"), steps=2, lr=0.1)
        >>> tr.thetas.shape, bool(tr.expected_rewards[-1] > tr.expected_rewards[0])
        ((3, 12), True)
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    b1, b2 = betas
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ValueError(f"Adam betas must lie in [0, 1), got {betas!r}")
    theta = np.array(task.theta, dtype=float)  # (P,)
    P = theta.size
    thetas, grads, fishers, rewards = [theta.copy()], [], [], []
    m, v = np.zeros(P), np.zeros(P)
    for k in range(1, steps + 1):
        G, F, ER = _exact_step(task, theta)  # (P,), (P,), scalar
        grads.append(G)
        fishers.append(F)
        rewards.append(ER)
        if optimizer == "sgd":
            theta = theta + lr * G
        else:
            m = b1 * m + (1 - b1) * G
            v = b2 * v + (1 - b2) * G * G
            m_hat = m / (1 - b1 ** k)
            v_hat = v / (1 - b2 ** k)
            theta = theta + lr * m_hat / (np.sqrt(v_hat) + eps)
        thetas.append(theta.copy())
    rewards.append(exact(task.with_(theta=theta), progress=False,
                         options=_NOTHING_KEPT).expected_reward)
    return Trajectory(np.array(thetas), np.array(grads), np.array(fishers), np.array(rewards),
                      optimizer)


def bf16_round(x):
    """Round to bfloat16 (nearest, ties to even), returned as float32.

    ``x`` is first cast to float32; the low 16 bits of each float32 are rounded
    away: ``u + 0x7FFF + ((u >> 16) & 1)`` then masked with ``0xFFFF0000``.
    NaN stays NaN; values that round past the largest bf16 become inf.

    Example:
        >>> bf16_round(np.array([1.0, 1.00390625, 1.01171875, 3.14159])).tolist()
        [1.0, 1.0, 1.015625, 3.140625]
    """
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)  # widen so the carry cannot wrap
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(f), f, out)


def bf16_changed(before, after):
    """Boolean mask of parameters whose bf16-rounded value differs after the update.

    Example:
        >>> bf16_changed(np.array([1.0, 1.0]), np.array([1.001, 1.01]))
        array([False,  True])
    """
    before, after = np.asarray(before), np.asarray(after)
    if before.shape != after.shape:
        raise ValueError(f"before and after differ in shape: {before.shape} vs {after.shape}")
    return bf16_round(before) != bf16_round(after)
