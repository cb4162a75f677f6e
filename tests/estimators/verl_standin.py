"""A STAND-IN for verl 0.9.1's ``verl.trainer.ppo.core_algos``, hand-written for the tests
of :func:`fisher_ref.estimators.trainers.verl_loss`: verl's package does not install beside
this project's test environment (it pins ``transformers<5.11``; see
``docs/check/trainers.md``). Only the functions the adapter calls, with verl's names,
signatures and conventions: the GRPO outcome advantage (``index`` groups rows, a group of
one has mean 0 and std 1, ``epsilon`` 1e-6, advantages broadcast over ``response_mask``),
the vanilla (dual-clip PPO) policy loss and ``agg_loss``. It is not verl's code.
"""
import torch

EPS = 1e-6


def grpo_advantage(token_level_rewards, response_mask, index, epsilon=EPS,
                   norm_adv_by_std_in_grpo=True, config=None):
    scores = token_level_rewards.sum(-1)  # (B,)
    out = torch.zeros_like(scores)
    for uid in set(index.tolist()):
        rows = torch.tensor([i for i, u in enumerate(index) if u == uid])
        s = scores[rows]
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(rows) == 1 \
            else (s.mean(), s.std())
        out[rows] = (s - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else s - mean
    adv = out[:, None] * response_mask
    return adv, adv


def agg_loss(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None,
             global_batch_size=None, loss_scale_factor=None):
    seq = (loss_mat * loss_mask).sum(-1)  # (B,)
    n = loss_mask.sum(-1)
    if loss_agg_mode == "token-mean":
        return seq.sum() / (loss_mask.sum() if batch_num_tokens is None else batch_num_tokens)
    live = (n > 0).to(loss_mat.dtype)
    B = live.sum() if global_batch_size is None else global_batch_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        out = (seq * live).sum() / B
        if loss_agg_mode == "seq-mean-token-sum-norm":
            out = out / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return out
    if loss_agg_mode == "seq-mean-token-mean":
        return (seq / (n + 1e-8) * live).sum() / B
    raise ValueError(loss_agg_mode)


def vanilla_policy_loss(old_log_prob, log_prob, advantages, response_mask,
                        loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    lo = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    hi = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1 - lo, 1 + hi)
    clipped = torch.maximum(l1, l2)
    dual = torch.minimum(-advantages * config.clip_ratio_c, clipped)
    pg = torch.where(advantages < 0, dual, clipped)
    return agg_loss(pg, response_mask, loss_agg_mode, **config.global_batch_info), {}


def get_adv_estimator_fn(name):
    return {"grpo": grpo_advantage}[name]


def get_policy_loss_fn(name):
    return {"vanilla": vanilla_policy_loss}[name]
