r"""The batch a loss reads: one group of ``B`` responses to one prompt, as torch tensors.

A trainer's loss depends on the parameters only through the policy's log-probabilities.
:class:`LossBatch` holds them twice, inside one graph: ``logp_all (B, T, V)``, the whole
next-token distribution at each position (a leaf that requires grad), and ``logp (B, T)``
its gather at the generated tokens. Everything else is detached.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["LossBatch", "make_batch", "group_arrays"]


@dataclass
class LossBatch:
    """One group of ``B`` responses to the prompt ``prompt`` (``T = max_len``, ``V`` the
    vocabulary); float64 tensors.

    Attributes:
        logp: ``(B, T)`` :math:`\\log p_\\theta(y_t|s_t)`, requires grad; 0 past the end.
        old_logp: ``(B, T)`` ``logp.detach()`` (the first step, :math:`\\theta_{old} = \\theta`).
        sampler_logp: ``(B, T)`` :math:`\\log\\mu(y_t|s_t)`; ``old_logp`` on policy.
        ref_logp: ``(B, T)`` :math:`\\log p_{ref}(y_t|s_t)` or ``None`` (no reference).
        mask: ``(B, T)`` bool, real tokens (EOS included).
        rewards: ``(B,)`` :math:`R(x, y_i)`.
        lengths: ``(B,)`` int64, generated tokens (``mask.sum(1)``).
        tokens: ``(B, T)`` int64, ``-1`` padded.
        prompt: the prompt's index.
        logp_all: ``(B, T, V)`` :math:`\\log p_\\theta(\\cdot|s_t)`, requires grad; rows past
            the end 0; ``logp`` is its gather.
        sampler_logp_all: ``(B, T, V)`` :math:`\\log\\mu(\\cdot|s_t)`.
        ref_logp_all: ``(B, T, V)`` of the reference policy, or ``None``.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    sampler_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    mask: torch.Tensor
    rewards: torch.Tensor
    lengths: torch.Tensor
    tokens: torch.Tensor
    prompt: int
    logp_all: torch.Tensor
    sampler_logp_all: torch.Tensor
    ref_logp_all: torch.Tensor | None = None

    @property
    def group_size(self):
        return self.logp.shape[0]


def _gather(all_, tokens, mask):
    """``all_ (..., T, V)`` at ``tokens (..., T)``, 0 where ``mask`` is False."""
    g = all_.gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(mask, g, torch.zeros((), dtype=g.dtype))


def make_batch(logp_all, sampler_logp_all, ref_logp_all, tokens, mask, rewards, prompt):
    """A :class:`LossBatch` whose ``logp`` is the gather of ``logp_all`` (same graph)."""
    logp = _gather(logp_all, tokens, mask)
    lengths = mask.sum(-1)
    samp = _gather(sampler_logp_all, tokens, mask)
    ref = None if ref_logp_all is None else _gather(ref_logp_all, tokens, mask)
    # the loss gets its own mask: the graph of logp holds this one (a loss writing into
    # batch.mask in place must not change dL/dlogp's backward pass)
    return LossBatch(logp=logp, old_logp=logp.detach(), sampler_logp=samp, ref_logp=ref,
                     mask=mask.clone(), rewards=rewards, lengths=lengths, tokens=tokens, prompt=prompt,
                     logp_all=logp_all, sampler_logp_all=sampler_logp_all,
                     ref_logp_all=ref_logp_all)


def group_arrays(table, pr, idx):
    """Numpy arrays of the groups ``idx (n, G)`` of prompt responses ``pr``: a dict of
    ``logp_all, sampler_logp_all, ref_logp_all (n, G, T, V)`` (rows past the end 0),
    ``tokens, mask, rows (n, G, T)``, ``rewards (n, G)``."""
    rows, mask = pr.rows[idx], pr.mask[idx]  # (n, G, T)
    m = mask[..., None]

    def full(a):
        return None if a is None else np.where(m, a[rows], 0.0)  # (n, G, T, V)
    return {"logp_all": full(table.logp), "sampler_logp_all": full(table.sampler_logp),
            "ref_logp_all": full(table.ref_logp), "tokens": pr.tokens[idx], "mask": mask,
            "rows": rows, "rewards": pr.rewards[idx]}
