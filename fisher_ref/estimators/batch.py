r"""The batch a loss reads: ``K`` groups of ``G`` responses each, as torch tensors.

A trainer's loss depends on the parameters only through the policy's log-probabilities.
:class:`LossBatch` holds them twice, inside one graph: ``logp_all (B, T, V)``, the whole
next-token distribution at each position (a leaf that requires grad), and ``logp (B, T)``
its gather at the generated tokens. Everything else is detached. The ``B = K G`` rows are
the ``K`` groups one after the other (``groups`` says which row is in which group).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["BatchLimit", "LossBatch", "make_batch", "group_arrays", "batch_arrays",
           "batch_limit"]


@dataclass(frozen=True)
class BatchLimit:
    r"""The constants a trainer's batch statistics tend to as its batch grows, responses
    drawn from the task's sampler :math:`\mu` (prompts from their weights :math:`w_x`).

    Attributes:
        tokens_per_response: :math:`E|y| = \sum_x w_x \sum_y \mu(y|x)\,|y|`, the expected
            number of unmasked tokens (EOS included) of one response.
        tokens_per_group: :math:`G\,E|y|`; a batch of ``K`` groups holds
            :math:`K G\,E|y|` tokens in the limit (verl's ``token-mean`` divisor, TRL's
            ``num_items_in_batch``).
        reward_mean: :math:`E[R] = \sum_x w_x \sum_y \mu(y|x) R(x, y)`, the limit of the
            batch's mean reward.
        reward_std: :math:`\sqrt{E[R^2] - E[R]^2}` over prompts and responses, the limit of
            the batch's reward standard deviation (biased or not: TRL's
            ``scale_rewards="batch"``, OpenRLHF's batch whitening).
        group_size: ``G``.
    """

    tokens_per_response: float
    tokens_per_group: float
    reward_mean: float
    reward_std: float
    group_size: int


@dataclass
class LossBatch:
    """A batch of ``K`` groups of ``G`` responses, ``B = K G`` rows (``T = max_len``, or the
    batch's longest response under ``pad="longest"``; ``V`` the vocabulary); float64.

    Attributes:
        logp: ``(B, T)`` :math:`\\log p_\\theta(y_t|s_t)`, requires grad; 0 past the end.
        old_logp: ``(B, T)`` :math:`\\log p_{\\theta_{old}}(y_t|s_t)` of the task's
            ``old_policy``; without one ``logp.detach()`` (the first step,
            :math:`\\theta_{old} = \\theta`).
        sampler_logp: ``(B, T)`` :math:`\\log\\mu(y_t|s_t)`; ``logp.detach()`` on policy.
        ref_logp: ``(B, T)`` :math:`\\log p_{ref}(y_t|s_t)` or ``None`` (no reference).
        mask: ``(B, T)`` bool, real tokens (EOS included).
        rewards: ``(B,)`` :math:`R(x, y_i)`.
        lengths: ``(B,)`` int64, generated tokens (``mask.sum(1)``).
        tokens: ``(B, T)`` int64, ``-1`` padded.
        prompt: the prompt's index when ``K == 1``; ``None`` when ``K > 1`` (read
            ``prompts``).
        logp_all: ``(B, T, V)`` :math:`\\log p_\\theta(\\cdot|s_t)`, requires grad; rows past
            the end 0; ``logp`` is its gather.
        sampler_logp_all: ``(B, T, V)`` :math:`\\log\\mu(\\cdot|s_t)`.
        ref_logp_all: ``(B, T, V)`` of the reference policy, or ``None``.
        old_logp_all: ``(B, T, V)`` of the old policy, or ``None`` (no ``old_policy``).
        prompts: ``(B,)`` int64, the prompt index of each row.
        groups: ``(B,)`` int64, the group of each row, ``0..K-1`` (rows ``kG..kG+G-1``).
        groups_per_batch: ``K``.
        limit: the :class:`BatchLimit` of the task (the large-batch constants), or ``None``.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    sampler_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    mask: torch.Tensor
    rewards: torch.Tensor
    lengths: torch.Tensor
    tokens: torch.Tensor
    prompt: int | None
    logp_all: torch.Tensor
    sampler_logp_all: torch.Tensor
    ref_logp_all: torch.Tensor | None = None
    old_logp_all: torch.Tensor | None = None
    prompts: torch.Tensor | None = None
    groups: torch.Tensor | None = None
    groups_per_batch: int = 1
    limit: BatchLimit | None = None

    @property
    def group_size(self):
        """``G``, responses per group."""
        return self.logp.shape[0] // self.groups_per_batch

    def per_group(self, x):
        """``x (B, ...)`` as ``(K, G, ...)``, one row per group."""
        return x.reshape(self.groups_per_batch, -1, *x.shape[1:])


def _gather(all_, tokens, mask):
    """``all_ (..., T, V)`` at ``tokens (..., T)``, 0 where ``mask`` is False."""
    g = all_.gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(mask, g, torch.zeros((), dtype=g.dtype))


def make_batch(logp_all, sampler_logp_all, ref_logp_all, tokens, mask, rewards, prompt, *,
               old_logp_all=None, prompts=None, groups=None, groups_per_batch=1, limit=None):
    """A :class:`LossBatch` whose ``logp`` is the gather of ``logp_all`` (same graph)."""
    logp = _gather(logp_all, tokens, mask)
    lengths = mask.sum(-1)
    samp = _gather(sampler_logp_all, tokens, mask)
    ref = None if ref_logp_all is None else _gather(ref_logp_all, tokens, mask)
    old = logp.detach() if old_logp_all is None else _gather(old_logp_all, tokens, mask)
    # the loss gets its own mask: the graph of logp holds this one (a loss writing into
    # batch.mask in place must not change dL/dlogp's backward pass)
    return LossBatch(logp=logp, old_logp=old, sampler_logp=samp, ref_logp=ref,
                     mask=mask.clone(), rewards=rewards, lengths=lengths, tokens=tokens,
                     prompt=prompt,
                     logp_all=logp_all, sampler_logp_all=sampler_logp_all,
                     ref_logp_all=ref_logp_all, old_logp_all=old_logp_all, prompts=prompts,
                     groups=groups, groups_per_batch=groups_per_batch, limit=limit)


def _full(table, rows, mask):
    m = mask[..., None]

    def full(a):
        return None if a is None else np.where(m, a[rows], 0.0)  # (n, B, T, V)
    return {"logp_all": full(table.logp), "sampler_logp_all": full(table.sampler_logp),
            "ref_logp_all": full(table.ref_logp), "old_logp_all": full(table.old_logp)}


def group_arrays(table, pr, idx):
    """Numpy arrays of the groups ``idx (n, G)`` of prompt responses ``pr``: a dict of
    ``logp_all, sampler_logp_all, ref_logp_all, old_logp_all (n, G, T, V)`` (rows past the
    end 0; ``None`` when the task has no such policy), ``tokens, mask, rows (n, G, T)``,
    ``rewards, prompts, groups (n, G)``."""
    rows, mask = pr.rows[idx], pr.mask[idx]  # (n, G, T)
    return {**_full(table, rows, mask), "tokens": pr.tokens[idx], "mask": mask, "rows": rows,
            "rewards": pr.rewards[idx], "prompts": np.full(idx.shape, pr.prompt),
            "groups": np.zeros(idx.shape, dtype=np.int64)}


def batch_arrays(table, units, pj, idx):
    """The arrays of :func:`group_arrays` for batches of ``K`` groups, ``(n, K G, ...)``:
    batch ``k`` holds the groups ``units[k] (K,)``, group ``u`` being the responses
    ``idx[u] (G,)`` of ``table.prompts[pj[u]]``."""
    n, K = units.shape
    G = idx.shape[1]
    p, r = pj[units][..., None], idx[units]  # (n, K, 1), (n, K, G)
    prs = table.prompts
    rows = np.stack([pr.rows for pr in prs])[p, r].reshape(n, K * G, -1)  # (n, K G, T)
    mask = prs[0].mask[r].reshape(n, K * G, -1)  # every prompt has the same responses
    R = np.stack([pr.rewards for pr in prs])[p, r].reshape(n, K * G)
    ids = np.array([pr.prompt for pr in prs])[p]  # (n, K, 1)
    return {**_full(table, rows, mask), "tokens": prs[0].tokens[r].reshape(n, K * G, -1),
            "mask": mask, "rows": rows, "rewards": R,
            "prompts": np.broadcast_to(ids, (n, K, G)).reshape(n, K * G),
            "groups": np.broadcast_to(np.arange(K)[None, :, None], (n, K, G)).reshape(n, K * G)}


def batch_limit(table, group_size):
    r"""The :class:`BatchLimit` of a :class:`fisher_ref.estimators.groups.ResponseTable`
    (moments under the sampler, prompts by weight)."""
    n = r1 = r2 = 0.0
    for pr in table.prompts:
        q = pr.weight * np.exp(pr.sampler_logp)  # (M,)
        n, r1, r2 = n + q @ pr.lengths, r1 + q @ pr.rewards, r2 + q @ pr.rewards ** 2
    return BatchLimit(tokens_per_response=float(n), tokens_per_group=float(group_size * n),
                      reward_mean=float(r1), reward_std=float(np.sqrt(max(r2 - r1 * r1, 0.0))),
                      group_size=int(group_size))
