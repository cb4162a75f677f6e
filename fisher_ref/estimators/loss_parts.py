r"""The parts every policy-loss preset is built from: the aggregation over tokens and
responses (:func:`aggregate`), the advantage of a group's rewards (:func:`advantages`,
:func:`group_advantages`) and the detached importance weight against the sampler
(:func:`importance_weights`), with the checks of a preset's arguments (a baseline, a cap,
a band, a KL estimator), run when a loss is built. :mod:`.presets` assembles them.
"""
from __future__ import annotations

import torch

from ..limits import check_real

__all__ = ["AGGREGATIONS", "ADVANTAGES", "RATIOS", "GRPO_EPS", "aggregate", "advantages",
           "group_advantages", "importance_weights", "check_baseline", "check_cap",
           "check_band", "check_kl_kind"]

AGGREGATIONS = ("seq-mean-token-sum", "seq-mean-token-mean", "token-mean",
                "seq-mean-token-sum-norm", "token-mean-limit")
ADVANTAGES = ("constant", "group_mean", "rloo", "grpo")
RATIOS = (None, "sequence", "token", "prefix")
#: GRPO's std-normalisation epsilon (verl's ``compute_grpo_outcome_advantage``).
GRPO_EPS = 1e-6


def check_baseline(baseline):
    """A constant baseline: a finite number. ``"mean"`` (:func:`fisher_ref.exact`'s
    :math:`E_p[R]`) is not known inside a loss, which sees one group."""
    if isinstance(baseline, str):
        raise ValueError(f"baseline={baseline!r}: a loss sees one group, not E_p[R], so a "
                         f"preset takes a constant baseline (a number); for the group's own "
                         f"mean use advantage='group_mean' or 'rloo'")
    return check_real(baseline, "baseline")


def check_cap(cap):
    return None if cap is None else check_real(cap, "cap", positive=True)


def check_band(band):
    """``(a, b)`` with ``0 <= a < b``, finite: the kept range of the weights."""
    if band is None:
        return None
    if isinstance(band, (str, bytes)) or not hasattr(band, "__len__") or len(band) != 2:
        raise ValueError(f"band must be a pair (a, b) of numbers with 0 <= a < b, got "
                         f"{band!r}")
    lo, hi = (check_real(v, "band") for v in band)
    if not 0 <= lo < hi:
        raise ValueError(f"band must be a pair (a, b) of numbers with 0 <= a < b (weights "
                         f"outside it are masked), got {tuple(band)!r}")
    return lo, hi


def check_kl_kind(kind):
    if kind not in ("k1", "k2", "k3"):
        raise ValueError(f"unknown KL estimator {kind!r}; known: k1, k2, k3")
    return kind


def aggregate(loss_mat, mask, mode="seq-mean-token-sum", limit=None):
    r"""Reduce per-token losses ``(B, T)`` of a batch of ``B = K G`` rows to a scalar
    (verl's ``agg_loss`` names). Each divisor is read on the batch the loss is given, so
    its verdict depends on ``groups_per_batch`` (``K``) where the divisor is random:

    - ``"seq-mean-token-sum"``: :math:`\frac1B\sum_i\sum_t \ell_{i,t}` (REINFORCE);
    - ``"seq-mean-token-mean"``: :math:`\frac1B\sum_i\frac{1}{|y_i|}\sum_t \ell_{i,t}`
      (GRPO's 1/|y| length normalisation);
    - ``"token-mean"``: :math:`\sum_{i,t}\ell_{i,t}/\sum_i|y_i|`, the tokens of *this*
      batch: per group at ``K = 1``, per mini-batch of ``K`` groups otherwise (verl's
      ``token-mean`` over its mini-batch, ``batch_num_tokens``; TRL's ``dapo`` over
      ``num_items_in_batch``; DAPO). Its bias shrinks as ``K`` grows, towards
      ``"token-mean-limit"``;
    - ``"token-mean-limit"``: :math:`\sum_{i,t}\ell_{i,t}/(K\,G\,E|y|)`, the large-batch
      reading of token-mean (``limit`` a :class:`fisher_ref.estimators.batch.BatchLimit`,
      ``batch.limit``): a constant divisor, so unbiased up to scale wherever
      ``seq-mean-token-sum`` is;
    - ``"seq-mean-token-sum-norm"``: :math:`\sum_{i,t}\ell_{i,t}/T` with ``T`` the
      padded width, ``loss_mask.shape[-1]`` (Dr. GRPO as verl writes it: ``max_len``
      under ``pad="max_len"``, the batch's longest response under ``pad="longest"``;
      TRL's ``dr_grpo`` divides by :math:`B\,T_{max}` instead, :func:`dr_grpo`).
    """
    m = mask.to(loss_mat.dtype)
    lm = loss_mat * m
    B, T = loss_mat.shape
    if mode == "seq-mean-token-sum":
        return lm.sum(-1).mean()
    if mode == "seq-mean-token-mean":
        return (lm.sum(-1) / m.sum(-1)).mean()
    if mode == "token-mean":
        return lm.sum() / m.sum()
    if mode == "seq-mean-token-sum-norm":
        return lm.sum() / T
    if mode == "token-mean-limit":
        if limit is None:
            raise ValueError("aggregation 'token-mean-limit' needs the batch's limit "
                             "(batch.limit)")
        return lm.sum() / (B / limit.group_size * limit.tokens_per_group)
    raise ValueError(f"unknown aggregation {mode!r}; known: {', '.join(AGGREGATIONS)}")


def advantages(rewards, kind="constant", baseline=0.0):
    r"""Advantages of a group's rewards ``(G,)``, or of each row of ``(K, G)`` (one group a
    row; :func:`group_advantages` of a batch of ``K`` groups).

    - ``"constant"``: :math:`R_i - b` (REINFORCE with a constant baseline);
    - ``"group_mean"``: :math:`R_i - \bar R`, the mean including ``i`` (expectation
      :math:`(1 - 1/G)` times the policy gradient);
    - ``"rloo"``: :math:`R_i - \frac{1}{G-1}\sum_{j\ne i}R_j` (leave-one-out, unbiased;
      TRL's ``RLOOTrainer``, OpenRLHF's ``rloo``); needs ``G >= 2``;
    - ``"grpo"``: :math:`(R_i - \bar R)/(\mathrm{std}(R) + 10^{-6})`, ``torch.std``
      unbiased (verl, TRL); a group of one is :math:`R_i/(1 + 10^{-6})` (verl: mean 0,
      std 1).
    """
    G = rewards.shape[-1]
    if kind == "constant":
        return rewards - baseline
    if kind == "group_mean":
        return rewards - rewards.mean(-1, keepdim=True)
    if kind == "rloo":
        if G < 2:
            raise ValueError("the RLOO advantage needs group_size >= 2")
        return (rewards - rewards.mean(-1, keepdim=True)) * (G / (G - 1))
    if kind == "grpo":
        if G < 2:
            return rewards / (1 + GRPO_EPS)
        return (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True)
                                                              + GRPO_EPS)
    raise ValueError(f"unknown advantage {kind!r}; known: {', '.join(ADVANTAGES)}")


def group_advantages(batch, kind="constant", baseline=0.0):
    """:func:`advantages` of each group of a batch of ``K`` groups: ``(K G,)``."""
    K = getattr(batch, "groups_per_batch", 1)
    return advantages(batch.rewards.reshape(K, -1), kind, baseline).reshape(-1)


def importance_weights(batch, level=None, cap=None, band=None):
    r"""Detached importance weights ``(B, T)`` of the policy against the sampler.

    With :math:`\rho_t = p(y_t|s_t)/\mu(y_t|s_t)`:

    - ``None``: 1;
    - ``"sequence"``: :math:`\prod_t \rho_t` on every token of the response;
    - ``"token"``: :math:`\rho_t`;
    - ``"prefix"``: :math:`\prod_{u \le t}\rho_u` (per-decision, cumulative).

    ``cap = C`` truncates, :math:`\min(w, C)` (TIS); ``band = (a, b)`` masks,
    :math:`w\,1[a \le w \le b]` (MIS / IcePop): at the level chosen, so a sequence-level
    band drops whole responses.
    """
    log_r = ((batch.logp - batch.sampler_logp) * batch.mask).detach()  # (B, T)
    if level is None:
        w = torch.ones_like(log_r)
    elif level == "sequence":
        w = torch.exp(log_r.sum(-1, keepdim=True)).expand_as(log_r)
    elif level == "token":
        w = torch.exp(log_r)
    elif level == "prefix":
        w = torch.exp(torch.cumsum(log_r, -1))
    else:
        raise ValueError(f"unknown importance level {level!r}; known: {RATIOS}")
    if cap is not None:
        w = torch.clamp(w, max=cap)
    if band is not None:
        lo, hi = band
        w = torch.where((w >= lo) & (w <= hi), w, torch.zeros_like(w))
    return w
