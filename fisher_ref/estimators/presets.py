r"""The policy losses trainers ship, as ``loss(batch)`` functions to be minimised.

Every policy-gradient preset is one formula with three choices,

.. math:: L = \mathrm{agg}_{i,t}\big(-\,\mathrm{sg}(w_{i,t})\,A_i\,\log p(y_{i,t}|s_{i,t})\big),

the advantage :math:`A_i` (:func:`advantages`), the importance weight :math:`w_{i,t}`
against the sampler :math:`\mu` (:func:`importance_weights`; ``sg`` stops the gradient)
and the aggregation over tokens and responses (:func:`aggregate`). On policy and with
``w = 1``, ``agg = seq-mean-token-sum`` this is REINFORCE, whose expected gradient is
:math:`-\nabla E_p[R]`. GSPO and the KL terms are written out separately.

**Which reading of a batch.** A preset computes on the batch it is given, ``K`` groups of
``G`` responses (``groups_per_batch``): advantages are taken per group
(:func:`group_advantages`), and the aggregation says what is normalised over what. A
mean over responses (``seq-mean-token-sum``, ``seq-mean-token-mean``: REINFORCE, RLOO,
GRPO's default, the IS presets, GSPO) has the same expectation at every ``K``. A divisor
read on the batch (``token-mean``: DAPO, TRL's ``dapo``, verl's ``token-mean``, CISPO,
PPO-clip; ``seq-mean-token-sum-norm``'s padded width) models the **per-group** reading
at ``K = 1`` and the **per-mini-batch** reading at ``K > 1``; its bias shrinks with ``K``
towards the **large-batch** reading, ``token-mean-limit``, which divides by the
constant the divisor tends to (``batch.limit``).

Sources of the conventions (each docstring names the trainer): TRL's ``GRPOTrainer``
(``loss_type`` "grpo", "dapo", "dr_grpo"; the k3 KL term ``beta * (exp(ref - logp) -
(ref - logp) - 1)``), verl's ``core_algos`` (``loss_agg_mode`` "token-mean",
"seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"; GRPO's
``(R - mean) / (std + 1e-6)`` with a group of one left as ``R``; rollout correction
with truncated and masked weights at token and sequence level), OpenRLHF (KL
estimators k1/k2/k3 in the loss or k1 in the reward; REINFORCE++ and RLOO baselines).
"""
from __future__ import annotations

import functools

import torch

from ..limits import check_real
from .loss_parts import (ADVANTAGES, AGGREGATIONS, GRPO_EPS, RATIOS, aggregate,  # noqa: F401
                         advantages, check_band, check_baseline, check_cap, check_kl_kind,
                         group_advantages, importance_weights)

__all__ = ["AGGREGATIONS", "ADVANTAGES", "RATIOS", "aggregate", "advantages",
           "group_advantages", "importance_weights", "policy_gradient_loss", "reinforce",
           "group_mean_reinforce",
           "rloo", "grpo", "dr_grpo", "dapo", "sequence_is", "token_is", "prefix_is",
           "sequence_tis", "token_tis", "sequence_mis", "token_mis", "ppo_clip", "dual_clip",
           "gspo", "cispo",
           "centered", "topk_centered", "kl_loss", "rho_k3", "kl_in_reward", "PRESETS",
           "preset"]


def policy_gradient_loss(advantage="constant", ratio=None, aggregation="seq-mean-token-sum",
                         baseline=0.0, cap=None, band=None):
    r"""The loss :math:`\mathrm{agg}(-\,\mathrm{sg}(w_{i,t})\,A_i\,\log p_{i,t})` with the
    advantage, the importance weight and the aggregation named (see the module)."""
    for value, known, what in ((advantage, ADVANTAGES, "advantage"),
                               (aggregation, AGGREGATIONS, "aggregation"),
                               (ratio, RATIOS, "ratio")):
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; known: {known}")
    baseline, cap, band = check_baseline(baseline), check_cap(cap), check_band(band)

    def loss(batch):
        A = group_advantages(batch, advantage, baseline).detach()  # (B,)
        w = importance_weights(batch, ratio, cap, band)  # (B, T)
        return aggregate(-w * A[:, None] * batch.logp, batch.mask, aggregation,
                         getattr(batch, "limit", None))
    loss.__name__ = f"pg_{advantage}_{ratio or 'none'}_{aggregation}"
    return loss


def reinforce(baseline=0.0):
    r"""REINFORCE with a constant baseline: :math:`L = -\frac1B\sum_i (R_i - b)\sum_t
    \log p_{i,t}`; :math:`E[\nabla L] = -\nabla E_p[R]` on policy, at every
    ``groups_per_batch`` (a mean over responses; OpenRLHF's ``reinforce``; verl's
    ``seq-mean-token-sum``)."""
    return policy_gradient_loss("constant", baseline=baseline)


def group_mean_reinforce():
    r"""The group-mean baseline including self, :math:`A_i = R_i - \bar R`:
    :math:`E[\nabla L] = -(1 - 1/G)\,\nabla E_p[R]` (GRPO without the std, Dr. GRPO's
    advantage)."""
    return policy_gradient_loss("group_mean")


def rloo():
    r"""RLOO: :math:`A_i = R_i - \frac{1}{G-1}\sum_{j\ne i} R_j`, unbiased (TRL
    ``RLOOTrainer``, OpenRLHF ``advantage_estimator=rloo``)."""
    return policy_gradient_loss("rloo")


def grpo(aggregation="seq-mean-token-mean"):
    r"""GRPO: :math:`A_i = (R_i - \bar R)/(\mathrm{std}(R) + 10^{-6})` with the 1/|y|
    length normalisation by default (DeepSeekMath; TRL ``loss_type="grpo"``; verl
    ``seq-mean-token-mean``), the advantage per group of the batch;
    ``aggregation="token-mean"`` divides by the tokens of the batch it is given (DAPO,
    TRL's ``dapo``, verl's ``token-mean``: the per-group reading at ``groups_per_batch=1``,
    the per-mini-batch reading at ``K``), ``"token-mean-limit"`` by their large-batch
    limit, ``"seq-mean-token-sum-norm"`` by the padded width (Dr. GRPO in verl)."""
    return policy_gradient_loss("grpo", aggregation=aggregation)


def dr_grpo():
    r"""Dr. GRPO: the group-mean advantage without the std and the constant
    :math:`1/(B\,T)` normalisation (TRL ``loss_type="dr_grpo"``); unbiased up to the scale
    :math:`(1 - 1/G)/T`. verl's ``seq-mean-token-sum-norm`` divides by ``T`` only
    (:func:`aggregate`), ``B`` times this."""
    inner = policy_gradient_loss("group_mean", aggregation="seq-mean-token-sum-norm")

    def loss(batch):
        return inner(batch) / batch.logp.shape[0]
    loss.__name__ = "dr_grpo"
    return loss


def dapo():
    r"""DAPO's token-mean aggregation of the GRPO advantage (TRL ``loss_type="dapo"``,
    which divides by ``num_items_in_batch``, the tokens of its generation batch): the
    divisor is the token count of the batch the loss is given, one group at
    ``groups_per_batch=1``, ``K`` groups otherwise; ``grpo("token-mean-limit")`` is its
    large-batch reading."""
    return grpo("token-mean")


def sequence_is(advantage="constant", baseline=0.0):
    r"""Sequence-level IS: :math:`-\,\mathrm{sg}(\prod_t\rho_t)\,A\sum_t\log p_t`; unbiased
    where :math:`\mu` covers :math:`p` (verl rollout correction ``rollout_is=sequence``)."""
    return policy_gradient_loss(advantage, "sequence", baseline=baseline)


def token_is(advantage="constant", baseline=0.0):
    r"""Token-level IS: :math:`-\sum_t \mathrm{sg}(\rho_t)\,A\log p_t`; equals REINFORCE on
    policy, biased off policy (verl ``rollout_is=token``; the PPO ratio of vLLM
    mismatch corrections)."""
    return policy_gradient_loss(advantage, "token", baseline=baseline)


def prefix_is(advantage="constant", baseline=0.0):
    r"""Cumulative-prefix (per-decision) IS: :math:`-\sum_t \mathrm{sg}(\prod_{u\le t}
    \rho_u)\,A\log p_t`."""
    return policy_gradient_loss(advantage, "prefix", baseline=baseline)


def sequence_tis(cap=2.0, advantage="constant", baseline=0.0):
    r"""Truncated sequence IS: weight :math:`\min(\prod_t\rho_t, C)`; bias
    :math:`-E_p[(1 - C/\rho)_+ A h]` (verl ``rollout_is=sequence`` with a threshold)."""
    return policy_gradient_loss(advantage, "sequence", baseline=baseline, cap=cap)


def token_tis(cap=2.0, advantage="constant", baseline=0.0):
    r"""Truncated token IS: weight :math:`\min(\rho_t, C)` (TIS; verl, OpenRLHF
    ``vllm_is_truncated_threshold``, slime)."""
    return policy_gradient_loss(advantage, "token", baseline=baseline, cap=cap)


def sequence_mis(band=(0.5, 2.0), advantage="constant", baseline=0.0):
    r"""Masked sequence IS: weight :math:`\rho\,1[a\le\rho\le b]`, :math:`\rho = \prod_t\rho_t`
    (verl ``rollout_rs=sequence``); bias :math:`-E_p[1[\rho\notin[a,b]] A h]`."""
    return policy_gradient_loss(advantage, "sequence", baseline=baseline, band=band)


def token_mis(band=(0.5, 2.0), advantage="constant", baseline=0.0):
    r"""Masked token IS: weight :math:`\rho_t\,1[a\le\rho_t\le b]` (MIS / IcePop)."""
    return policy_gradient_loss(advantage, "token", baseline=baseline, band=band)


def _old(batch):
    r""":math:`\log p_{\theta_{old}}` of the generated tokens: the task's ``old_policy``
    when it has one, else the sampler's (the policy that drew the responses)."""
    return batch.sampler_logp if getattr(batch, "old_logp_all", None) is None \
        else batch.old_logp


def ppo_clip(eps_low=0.2, eps_high=0.2, dual_clip=None, advantage="grpo",
             aggregation="token-mean", clip=True):
    r"""PPO's clipped surrogate with the ratio :math:`r_{i,t} = p_\theta/p_{\theta_{old}}`
    (``old_logp``, differentiable in :math:`\theta`):
    :math:`\ell = \max(-A r, -A\,\mathrm{clip}(r, 1-\epsilon_l, 1+\epsilon_h))`, and with
    ``dual_clip = c > 1`` :math:`\min(\ell, -cA)` where :math:`A < 0` (verl's vanilla
    policy loss with ``clip_ratio_c``; OpenRLHF's ``PolicyLoss`` with ``dual_clip``; TRL
    GRPO's token-level loss). ``clip=False`` is the unclipped surrogate :math:`-A r`, whose
    gradient is :math:`-r A\nabla\log p` (token-level importance sampling), the reference
    of :func:`fisher_ref.estimators.gradient.clipped_share`. At the first step
    (:math:`\theta_{old} = \theta`) the clip is inactive; set the task's ``old_policy``
    for a later step. Aggregated over the batch as ``aggregation`` (:func:`aggregate`)."""
    eps_low = check_real(eps_low, "eps_low", positive=True)
    eps_high = check_real(eps_high, "eps_high", positive=True)
    if dual_clip is not None and not check_real(dual_clip, "dual_clip") > 1:
        raise ValueError(f"dual_clip must be a number above 1 (the bound -c A on a "
                         f"negative advantage), got {dual_clip!r}")
    for value, known, what in ((advantage, ADVANTAGES, "advantage"),
                               (aggregation, AGGREGATIONS, "aggregation")):
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; known: {known}")

    def loss(batch):
        A = group_advantages(batch, advantage).detach()[:, None]  # (B, 1)
        r = torch.exp(batch.logp - batch.old_logp)  # (B, T)
        if not clip:
            return aggregate(-A * r, batch.mask, aggregation, batch.limit)
        pg = torch.maximum(-A * r, -A * torch.clamp(r, 1 - eps_low, 1 + eps_high))
        if dual_clip is not None:
            pg = torch.where(A < 0, torch.minimum(pg, -A * dual_clip), pg)
        return aggregate(pg, batch.mask, aggregation, batch.limit)
    loss.__name__ = "ppo_clip" if dual_clip is None else "dual_clip"
    return loss


def dual_clip(c=3.0, eps_low=0.2, eps_high=0.2, advantage="grpo", aggregation="token-mean"):
    r"""Dual-clip PPO (Ye et al. 2020): :func:`ppo_clip` with ``dual_clip = c``."""
    return ppo_clip(eps_low, eps_high, c, advantage, aggregation)


def gspo(eps_low=3e-4, eps_high=4e-4, advantage="grpo", clip=True):
    r"""GSPO: the geometric-mean sequence ratio against :math:`\theta_{old}` (the task's
    ``old_policy``, else the sampler)
    :math:`s_i = \exp(\frac{1}{|y_i|}\sum_t(\log p_t - \log p_{old,t}))`, differentiable,
    :math:`L = -\frac1B\sum_i\min(s_iA_i, \mathrm{clip}(s_i, 1-\epsilon_l, 1+\epsilon_h)A_i)`
    (Qwen's GSPO; TRL ``importance_sampling_level="sequence"``). Its gradient is
    :math:`s_i A_i \frac{1}{|y_i|}\sum_t\nabla\log p_t` inside the band; ``clip=False`` is
    :math:`-\frac1B\sum_i s_iA_i`, the reference of
    :func:`fisher_ref.estimators.gradient.clipped_share`."""
    eps_low = check_real(eps_low, "eps_low", positive=True)
    eps_high = check_real(eps_high, "eps_high", positive=True)
    if advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage {advantage!r}; known: {ADVANTAGES}")

    def loss(batch):
        A = group_advantages(batch, advantage).detach()
        m = batch.mask.to(batch.logp.dtype)
        s = torch.exp(((batch.logp - _old(batch)) * m).sum(-1) / m.sum(-1))  # (B,)
        if not clip:
            return -(s * A).mean()
        clipped = torch.clamp(s, 1 - eps_low, 1 + eps_high)
        return -torch.minimum(s * A, clipped * A).mean()
    loss.__name__ = "gspo"
    return loss


def cispo(eps_high=0.2, advantage="grpo", clip=True):
    r"""CISPO: :math:`L = -\sum_{i,t}\mathrm{sg}(\min(r_{i,t},
    1+\epsilon_h))A_i\log p_{i,t}/\sum_i|y_i|`, :math:`r = p/p_{old}` (``old_logp``: 1
    at the first step, the task's ``old_policy`` after it; MiniMax-M1; verl and slime
    ``cispo``); token-mean over the whole batch (the per-batch reading). ``clip=False``
    weighs by :math:`\mathrm{sg}(r)` uncapped, the reference of
    :func:`fisher_ref.estimators.gradient.clipped_share`."""
    eps_high = check_real(eps_high, "eps_high", positive=True)
    if advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage {advantage!r}; known: {ADVANTAGES}")

    def loss(batch):
        A = group_advantages(batch, advantage).detach()
        r = torch.exp(batch.logp - batch.old_logp)
        r = (r.clamp(max=1 + eps_high) if clip else r).detach()
        return aggregate(-r * A[:, None] * batch.logp, batch.mask, "token-mean")
    loss.__name__ = "cispo"
    return loss


def _centered_loss(center, baseline, name):
    baseline = check_baseline(baseline)

    def loss(batch):
        A = (batch.rewards - baseline).detach()
        c = (center(batch).detach() * batch.logp_all).sum(-1)  # (B, T): sum_b c_b log p_b
        score = ((batch.logp - c) * batch.mask).sum(-1)  # (B,)
        return -(A * score).mean()
    loss.__name__ = name
    return loss


def centered(baseline=0.0):
    r"""Score centering under :math:`\mu`, without reweighting:
    :math:`L = -\frac1B\sum_i (R_i - b)\sum_t(\log p_{i,t} - \sum_b\mu_b\log p_b(s_{i,t}))`,
    whose gradient uses :math:`j_{y_t} - \sum_b \mu_b j_b` (the ``centered`` stream of
    :func:`fisher_ref.exact`)."""
    return _centered_loss(lambda b: torch.exp(b.sampler_logp_all), baseline, "centered")


def topk_centered(k, baseline=0.0):
    r"""Score centering with only the top-``k`` tokens of :math:`\mu` known, renormalised
    (ties: lowest id first): the ``top{k}`` stream of :func:`fisher_ref.exact`."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (tokens of mu kept), got {k!r}")

    def weights(b):
        mu = torch.exp(b.sampler_logp_all)  # (B, T, V)
        if k >= mu.shape[-1]:
            return mu
        order = torch.sort(mu, dim=-1, descending=True, stable=True).indices
        keep = torch.zeros_like(mu).scatter(-1, order[..., :k], 1.0)
        top = mu * keep
        return top / top.sum(-1, keepdim=True).clamp(min=torch.finfo(mu.dtype).tiny)
    return _centered_loss(weights, baseline, f"top{k}_centered")


def _kl_terms(batch, kind):
    d = batch.logp - batch.ref_logp  # log p - log ref, (B, T)
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    return torch.exp(-d) - 1 + d  # k3 (the kind is checked when the loss is built)


def _need_reference(batch):
    if batch.ref_logp is None:
        raise ValueError("a KL loss needs a reference policy: add a 'reference' to the task")


def kl_loss(kind="k3", beta=1.0):
    r"""A KL penalty in the loss, :math:`L = \beta\frac1B\sum_i\sum_t k(\delta_{i,t})`,
    :math:`\delta = \log p - \log p_{ref}`: k1 :math:`=\delta` (expected gradient 0 on
    policy), k2 :math:`=\delta^2/2` (per state :math:`\nabla KL_s(p\|ref)`), k3
    :math:`= e^{-\delta} - 1 + \delta` (per state :math:`\nabla KL_s(ref\|p)`, the forward
    KL). TRL GRPO's ``beta`` term is k3, token-mean; verl ``kl_loss_type``
    (``kl``/``mse``/``low_var_kl``); OpenRLHF ``kl_estimator`` k1/k2/k3."""
    kind, beta = check_kl_kind(kind), check_real(beta, "beta", positive=True)

    def loss(batch):
        _need_reference(batch)
        return beta * aggregate(_kl_terms(batch, kind), batch.mask)
    loss.__name__ = f"{kind}_loss"
    return loss


def rho_k3(beta=1.0):
    r""":math:`L = \beta\frac1B\sum_{i,t}\rho_{i,t}\,k_3(\delta_{i,t})` with the ratio
    :math:`\rho = p/p_{old}` differentiable (1 in value at the first step; TRL #6503):
    its gradient adds :math:`k_3\nabla\log p` to k3's."""
    beta = check_real(beta, "beta", positive=True)

    def loss(batch):
        _need_reference(batch)
        rho = torch.exp(batch.logp - batch.old_logp)
        return beta * aggregate(rho * _kl_terms(batch, "k3"), batch.mask)
    loss.__name__ = "rho_k3"
    return loss


def kl_in_reward(beta=1.0):
    r"""k1 summed into the reward: the KL part of REINFORCE on
    :math:`R - \beta\sum_t\delta_t`, :math:`L = \beta\frac1B\sum_i \mathrm{sg}(\sum_t
    \delta_{i,t})\sum_t\log p_{i,t}`; on policy :math:`E[\nabla L] = \beta\nabla
    KL(p_{seq}\|ref_{seq})` (OpenRLHF and verl ``use_kl_in_reward``)."""
    beta = check_real(beta, "beta", positive=True)

    def loss(batch):
        _need_reference(batch)
        d = ((batch.logp - batch.ref_logp) * batch.mask).sum(-1).detach()  # (B,)
        return beta * (d * (batch.logp * batch.mask).sum(-1)).mean()
    loss.__name__ = "k1_in_reward"
    return loss


#: name -> (factory, needs a reference, smallest group size), the rows of the CLI report.
PRESETS = {
    "reinforce": (reinforce, False, 1),
    "group_mean": (group_mean_reinforce, False, 2),
    "rloo": (rloo, False, 2),
    "grpo": (grpo, False, 2),
    "grpo_token_mean": (functools.partial(grpo, "token-mean"), False, 2),
    "dr_grpo": (dr_grpo, False, 2),
    "sequence_is": (sequence_is, False, 1),
    "token_is": (token_is, False, 1),
    "prefix_is": (prefix_is, False, 1),
    "sequence_tis": (sequence_tis, False, 1),
    "token_tis": (token_tis, False, 1),
    "sequence_mis": (sequence_mis, False, 1),
    "token_mis": (token_mis, False, 1),
    "ppo_clip": (ppo_clip, False, 2),
    "dual_clip": (dual_clip, False, 2),
    "gspo": (gspo, False, 2),
    "cispo": (cispo, False, 2),
    "centered": (centered, False, 1),
    "k1_loss": (functools.partial(kl_loss, "k1"), True, 1),
    "k2_loss": (functools.partial(kl_loss, "k2"), True, 1),
    "k3_loss": (functools.partial(kl_loss, "k3"), True, 1),
    "rho_k3": (rho_k3, True, 1),
    "k1_in_reward": (kl_in_reward, True, 1),
}


def preset(name, **kwargs):
    """The preset loss ``name`` (a key of :data:`PRESETS`) built with ``kwargs``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name][0](**kwargs)
