r"""TRL's GRPO losses written from their formulas, sharing no code with TRL: the target of
:func:`fisher_ref.estimators.trl_expected` and the reference of
:func:`fisher_ref.estimators.check_trainer_loss`, so that a bug inside the trainer's own
loss method shows in both.

At the first PPO step (old policy = policy, TRL's ``num_iterations=1``) and without a KL
term, TRL 1.16's per-token loss is :math:`-r_{i,t} A_i` with :math:`r = \exp(\log p -
\mathrm{sg}(\log p)) = 1` (the clip is inactive at 1), so its gradient is
:math:`-A_i\nabla\log p_{i,t}`; the advantage is

.. math:: A_i = \frac{R_i - \bar R_{g(i)}}{s + 10^{-4}}

with :math:`s` the Bessel-corrected std of row ``i``'s group (``scale_rewards="group"``),
of the whole batch (``"batch"``) or no division (``"none"``); and the aggregation over the
``B = K G`` rows of one optimizer step is

- ``grpo``: :math:`\frac1B\sum_i \frac{\sum_t m_{i,t}\ell_{i,t}}{\max(1, \sum_t m_{i,t})}`;
- ``bnpo``, ``dapo``: :math:`\sum_{i,t} m\ell / \max(1, \sum_{i,t} m)` (``dapo``'s
  ``num_items_in_batch`` is the step's tokens);
- ``dr_grpo``: :math:`\sum_{i,t} m\ell / (B\,T_{max})`.
"""
from __future__ import annotations

import torch

from fisher_ref.estimators.trainers import TRL_ADVANTAGE_EPS, TRL_SCALE_REWARDS

__all__ = ["REFERENCE_LOSS_TYPES", "reference_refusal", "trl_reference_loss"]

#: The loss types written here.
REFERENCE_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def reference_refusal(args):
    """Why the settings ``args`` (a ``GRPOConfig``) are outside what
    :func:`trl_reference_loss` states, or ``None``."""
    if args.loss_type not in REFERENCE_LOSS_TYPES:
        return f"loss_type={args.loss_type!r} (written here: {', '.join(REFERENCE_LOSS_TYPES)})"
    odd = [(n, v) for n, v in (
        ("importance_sampling_level", args.importance_sampling_level),
        ("off_policy_mask_threshold", args.off_policy_mask_threshold),
        ("top_entropy_quantile", args.top_entropy_quantile),
        ("entropy_coef", args.entropy_coef), ("beta", args.beta),
        ("delta", args.delta), ("num_iterations", args.num_iterations))
        if v != {"importance_sampling_level": "token", "top_entropy_quantile": 1.0,
                 "entropy_coef": 0.0, "beta": 0.0, "num_iterations": 1}.get(n)]
    if odd:
        return ", ".join(f"{n}={v!r}" for n, v in odd)
    if args.scale_rewards not in TRL_SCALE_REWARDS:
        return f"scale_rewards={args.scale_rewards!r}"
    return None


def trl_reference_loss(loss_type, scale_rewards, max_completion_length):
    """The loss of the module's equations as a ``loss(batch)`` over a
    :class:`fisher_ref.estimators.LossBatch` of ``K`` consecutive groups.

    Raises:
        ValueError: a loss type or ``scale_rewards`` not written here.
    """
    if loss_type not in REFERENCE_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {REFERENCE_LOSS_TYPES}, got {loss_type!r}")
    if scale_rewards not in TRL_SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {TRL_SCALE_REWARDS}, got "
                         f"{scale_rewards!r}")
    t_max = int(max_completion_length)

    def loss(batch):
        K = int(batch.groups_per_batch)
        R = batch.rewards.reshape(K, -1)  # (K, G), consecutive rows
        B = R.numel()
        A = R - R.mean(dim=1, keepdim=True)
        if scale_rewards == "group":
            A = A / (R.std(dim=1, keepdim=True) + TRL_ADVANTAGE_EPS)
        elif scale_rewards == "batch":
            A = A / (R.std() + TRL_ADVANTAGE_EPS)
        A = A.reshape(B).detach()
        m = batch.mask.to(batch.logp.dtype)  # (B, T)
        ratio = torch.exp(batch.logp - batch.old_logp.detach())
        per_token = -ratio * A[:, None] * m
        if loss_type == "grpo":
            return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
        if loss_type == "dr_grpo":
            return per_token.sum() / (B * t_max)
        return per_token.sum() / m.sum().clamp(min=1.0)
    loss.__name__ = f"reference_{loss_type}"
    return loss
