"""Mini-batches of K groups, an old policy and padding: expected_loss_gradient against the
independent brute force of tests/estimators/brute.py (every ordered tuple of K groups,
autograd per batch) at 1e-10, for presets and for losses written as trainers write them."""
import math

import numpy as np
import pytest
import torch

import cases
from fisher_ref.engine.plan import EnumerationTooLarge
from fisher_ref.estimators import check_loss, expected_loss_gradient, presets
from fisher_ref.estimators.gradient import clipped_share
from fisher_ref.estimators.groups import response_table
from fisher_ref.samplers import LogitsSampler, PerturbedSampler

from .brute import brute_force_batches, tiny_task

RTOL = cases.RTOL
STALE = {"kind": "perturbed", "scale": 0.4, "seed": 3}
OLD = {"kind": "perturbed", "scale": 0.6, "seed": 11}


# ------------------------------------------------- losses as trainers write them

def _group_mean_std(b):
    G = b.group_size
    R = b.rewards.view(-1, G)  # (K, G): TRL's rewards.view(-1, num_generations)
    return R.mean(1).repeat_interleave(G), R.std(1).repeat_interleave(G)


def verl_token_mean(b):
    """verl: GRPO advantages per group (uid), vanilla clipped PPO loss, agg_loss
    token-mean over the whole mini-batch."""
    mean, std = _group_mean_std(b)
    A = ((b.rewards - mean) / (std + 1e-6))[:, None]
    ratio = torch.exp(b.logp - b.old_logp)
    pg = torch.maximum(-A * ratio, -A * torch.clamp(ratio, 0.8, 1.2))
    m = b.mask.to(pg.dtype)
    return (pg * m).sum() / m.sum()


def trl_dapo(b):
    """TRL GRPOTrainer loss_type='dapo': divides by num_items_in_batch, the batch's tokens."""
    mean, std = _group_mean_std(b)
    adv = (b.rewards - mean) / (std + 1e-4)
    coef = torch.exp(b.logp - b.old_logp)
    per_token = -torch.minimum(coef * adv[:, None], torch.clamp(coef, 0.8, 1.28) * adv[:, None])
    num_items_in_batch = b.mask.sum()
    return (per_token * b.mask).sum() / num_items_in_batch.clamp(min=1.0)


def trl_dapo_limit(b):
    """The same, at its large-batch reading: the batch's tokens replaced by their limit."""
    mean, std = _group_mean_std(b)
    adv = (b.rewards - mean) / (std + 1e-4)
    coef = torch.exp(b.logp - b.old_logp)
    per_token = -torch.minimum(coef * adv[:, None], torch.clamp(coef, 0.8, 1.28) * adv[:, None])
    return (per_token * b.mask).sum() / (b.groups_per_batch * b.limit.tokens_per_group)


def batch_whitened(b):
    """TRL scale_rewards='batch': group-mean baseline, std over the whole batch."""
    mean, _ = _group_mean_std(b)
    adv = (b.rewards - mean) / (b.rewards.std() + 1e-4)
    return -(adv * (b.logp * b.mask).sum(1)).mean()


def limit_whitened(b):
    """Whitened by the large-batch reward statistics."""
    adv = (b.rewards - b.limit.reward_mean) / b.limit.reward_std
    return -(adv * (b.logp * b.mask).sum(1)).mean()


LOSSES = {"reinforce": presets.reinforce(), "grpo_token_mean": presets.grpo("token-mean"),
          "rloo": presets.rloo(), "ppo_clip": presets.ppo_clip(),
          "dual_clip": presets.dual_clip(), "gspo": presets.gspo(0.05, 0.05),
          "cispo": presets.cispo(), "token_mean_limit": presets.grpo("token-mean-limit"),
          "verl_token_mean": verl_token_mean, "trl_dapo": trl_dapo,
          "trl_dapo_limit": trl_dapo_limit, "batch_whitened": batch_whitened,
          "limit_whitened": limit_whitened}

TASKS = {  # V = 2 (3 responses per prompt), lengths 1 and 2
    "on": dict(vocab=2),
    "off": dict(vocab=2, sampler=STALE),
    "old_is_sampler": dict(vocab=2, sampler=STALE, old_policy="sampler"),
    "old_on": dict(vocab=2, old_policy=OLD),
}
_T = list(TASKS)
CASES = [(name, _T[i % 4], 2) for i, name in enumerate(LOSSES)] \
    + [(name, _T[(i + 2) % 4], 3) for i, name in enumerate(LOSSES)]


def _task(task_id, K):
    return tiny_task(**TASKS[task_id], one_prompt=K == 3)  # K = 3: 9^3 ordered batches


def _close(a, b):
    return np.abs(a - b).max() <= RTOL * max(np.abs(b).max(), 1e-300)


@pytest.mark.parametrize("name,task_id,K", CASES, ids=[f"{n}-{t}-K{k}" for n, t, k in CASES])
def test_mini_batch_is_brute_force(name, task_id, K):
    task, loss = _task(task_id, K), LOSSES[name]
    mean, var, limit = brute_force_batches(task, loss, 2, K)
    lg = expected_loss_gradient(task, loss, 2, groups_per_batch=K)
    assert _close(lg.mean, mean), np.abs(lg.mean - mean).max()
    assert _close(lg.variance, var), np.abs(lg.variance - var).max()
    for key, value in limit.items():
        assert abs(getattr(lg.limit, key) - value) <= RTOL * abs(value)
    n_units = len(task.prompts) * 3 ** 2
    assert lg.n_batches == math.comb(n_units + K - 1, K) and lg.groups_per_batch == K


@pytest.mark.parametrize("K", [2, 3])
def test_policy_gradient_does_not_depend_on_k(K):
    task = _task("off", K)
    lg = expected_loss_gradient(task, presets.reinforce(), 1, groups_per_batch=K)
    one = expected_loss_gradient(task, presets.reinforce(), 1)
    assert _close(lg.policy_gradient, one.policy_gradient)
    assert _close(lg.mean, one.mean)  # a per-row mean of i.i.d. groups: the same mean
    assert _close(lg.variance * K, one.variance)  # ... and 1/K of the variance


@pytest.mark.parametrize("name", ["reinforce", "trl_dapo"])
def test_symmetric_groups_of_k_is_brute_force(name):
    task = tiny_task(vocab=2, sampler=STALE, old_policy="sampler")
    mean, var, _ = brute_force_batches(task, LOSSES[name], 2, 2)
    lg = expected_loss_gradient(task, LOSSES[name], 2, True, groups_per_batch=2)
    assert _close(lg.mean, mean) and _close(lg.variance, var)


@pytest.mark.parametrize("mode", ["seq-mean-token-sum-norm", "token-mean"])
@pytest.mark.parametrize("K", [1, 2])
def test_pad_longest_is_brute_force(mode, K):
    task = tiny_task(vocab=2, sampler=STALE)
    loss = presets.policy_gradient_loss("group_mean", aggregation=mode)
    mean, var, _ = brute_force_batches(task, loss, 2, K, pad="longest")
    lg = expected_loss_gradient(task, loss, 2, groups_per_batch=K, pad="longest")
    assert _close(lg.mean, mean) and _close(lg.variance, var) and lg.pad == "longest"


def test_seq_mean_token_sum_norm_changes_verdict_under_pad_longest():
    """verl's seq-mean-token-sum-norm divides by loss_mask.shape[-1]: a constant at
    pad='max_len' (Dr. GRPO, unbiased up to scale), the batch's longest response when the
    trainer pads to it (biased)."""
    task = tiny_task(vocab=2, max_len=3)  # lengths 1, 2, 3, 3
    loss = presets.policy_gradient_loss("group_mean", aggregation="seq-mean-token-sum-norm")
    assert check_loss(task, loss, 2, "unbiased-up-to-scale").passed
    v = check_loss(task, loss, 2, "unbiased-up-to-scale", pad="longest")
    assert not v.passed and v.relative_bias > 1e-3, v


def test_batch_fields():
    seen = []

    def spy(b):
        seen.append(b)
        return -(b.rewards * b.logp.sum(1)).mean()
    task = tiny_task(vocab=2)
    expected_loss_gradient(task, spy, 2, groups_per_batch=3, vectorize=False)
    b = seen[0]
    assert b.groups.tolist() == [0, 0, 1, 1, 2, 2] and b.prompts.shape == (6,)
    assert b.prompt is None and b.groups_per_batch == 3 and b.group_size == 2
    seen.clear()
    expected_loss_gradient(task, spy, 2, vectorize=False)
    assert seen[0].prompt in (0, 1) and seen[0].groups.tolist() == [0, 0]
    assert seen[0].prompts.tolist() == [seen[0].prompt] * 2


# ------------------------------------------------- steps past the first: clipping

def _clip_mass(task, eps):
    """Probability mass of the tokens whose ratio p/p_old is outside [1-eps, 1+eps]:
    sum_x w_x sum_y mu(y) (1/|y|) sum_t 1[r_t outside]."""
    table = response_table(task)
    mass = 0.0
    for pr in table.prompts:
        tok = np.where(pr.mask, pr.tokens, 0)
        r = np.exp(table.logp[pr.rows, tok] - table.old_logp[pr.rows, tok])  # (M, T)
        out = (np.abs(r - 1) > eps) & pr.mask
        mass += pr.weight * np.exp(pr.sampler_logp) @ (out.sum(1) / pr.lengths)
    return mass


@pytest.mark.parametrize("name", ["ppo_clip", "dual_clip", "gspo", "cispo"])
def test_clipping_is_active_past_the_first_step(name):
    task = tiny_task(vocab=3, old_policy={"kind": "perturbed", "scale": 1.5, "seed": 2})
    assert _clip_mass(task, 0.2) > 0.10  # clipping is active on > 10% of the tokens' mass
    clipped, unclipped = {
        "ppo_clip": (presets.ppo_clip(), presets.ppo_clip(clip=False)),
        "dual_clip": (presets.dual_clip(1.5), presets.ppo_clip(clip=False)),
        "gspo": (presets.gspo(0.2, 0.2), presets.gspo(clip=False)),
        "cispo": (presets.cispo(0.2), presets.cispo(clip=False))}[name]
    v = check_loss(task, clipped, 2, "unbiased-up-to-scale", symmetric=True)
    share = clipped_share(v.gradient, expected_loss_gradient(task, unclipped, 2, True))
    assert not v.passed and 0.01 < abs(share) < 1, (v, share)
    first = check_loss(task.with_(old_policy=None), presets.ppo_clip(), 2,
                       "unbiased-up-to-scale", symmetric=True)
    assert clipped_share(first.gradient, expected_loss_gradient(
        task.with_(old_policy=None), presets.ppo_clip(clip=False), 2, True)) == 0


def test_old_policy_reaches_old_logp():
    task = tiny_task(vocab=2, sampler=STALE, old_policy="sampler")
    seen = []

    def spy(b):
        seen.append((b.old_logp.clone(), b.sampler_logp.clone(), b.logp.detach().clone()))
        return -(b.logp * b.mask).sum()
    expected_loss_gradient(task, spy, 1, vectorize=False)
    old, samp, logp = seen[0]
    assert torch.equal(old, samp) and not torch.equal(old, logp)


# ------------------------------------------------- bad input

@pytest.mark.parametrize("K", [0, -1, 1.5, True, "2", None])
def test_bad_groups_per_batch_is_refused(K):
    with pytest.raises(ValueError, match="groups_per_batch"):
        expected_loss_gradient(tiny_task(), presets.reinforce(), 1, groups_per_batch=K)


def test_too_many_batches_is_refused_before_enumerating():
    def never(b):
        raise AssertionError("the loss ran")
    with pytest.raises(EnumerationTooLarge, match=r"groups_per_batch=3: 560 batches \(the multisets of 3 groups out of 14\)"):
        expected_loss_gradient(tiny_task(), never, 1, groups_per_batch=3, max_groups=500)
    with pytest.raises(EnumerationTooLarge, match="groups_per_batch=9"):
        check_loss(load_default(), never, 2, groups_per_batch=9)


def load_default():
    from fisher_ref import load_config
    return load_config("default")


@pytest.mark.parametrize("pad", ["max", "", None, 3])
def test_unknown_pad_is_refused(pad):
    with pytest.raises(ValueError, match="pad must be one of"):
        expected_loss_gradient(tiny_task(), presets.reinforce(), 1, pad=pad)


def test_old_policy_of_another_vocabulary_is_refused():
    task = tiny_task().with_(old_policy=LogitsSampler(lambda w: np.zeros((len(w), 5))))
    with pytest.raises(ValueError, match="old_policy"):
        expected_loss_gradient(task, presets.reinforce(), 1)


def test_bad_old_policy_is_refused():
    with pytest.raises(ValueError, match="old_policy"):
        tiny_task(old_policy="policy")
    with pytest.raises(ValueError, match="old_policy: unknown sampler kind"):
        tiny_task(old_policy={"kind": "nope"})
    with pytest.raises(TypeError, match="old_policy must be"):
        tiny_task().with_(old_policy=3)
    t = tiny_task().with_(old_policy=PerturbedSampler(0.1, seed=1))
    assert t.to_json()["old_policy"] == {"kind": "perturbed", "scale": 0.1, "seed": 1}


def test_a_loss_not_symmetric_in_its_groups_is_refused():
    def first_group_counts_twice(b):
        w = torch.where(b.groups == 0, 2.0, 1.0)
        return -(w * b.rewards * (b.logp * b.mask).sum(1)).mean()
    with pytest.raises(ValueError, match="not symmetric in its groups"):
        expected_loss_gradient(tiny_task(), first_group_counts_twice, 1, groups_per_batch=2)


def test_a_loss_not_symmetric_in_its_responses_is_refused_at_k2():
    def first_response_counts_twice(b):
        w = torch.where(torch.arange(b.logp.shape[0]) % b.group_size == 0, 2.0, 1.0)
        return -(w * b.rewards * (b.logp * b.mask).sum(1)).mean()
    with pytest.raises(ValueError, match="not symmetric in its responses"):
        expected_loss_gradient(tiny_task(), first_response_counts_twice, 2, True,
                               groups_per_batch=2)
    lg = expected_loss_gradient(tiny_task(vocab=2), first_response_counts_twice, 2,
                                groups_per_batch=2)  # ordered tuples: fine
    assert lg.n_batches == math.comb(18 + 1, 2)


@pytest.mark.parametrize("name,symmetric", [("reinforce", False), ("trl_dapo", True)])
def test_covariance_of_k_groups_is_brute_force(name, symmetric):
    task = tiny_task(vocab=2, sampler=STALE, old_policy="sampler")
    mean, var, _, cov = brute_force_batches(task, LOSSES[name], 2, 2, covariance=True)
    lg = expected_loss_gradient(task, LOSSES[name], 2, symmetric, groups_per_batch=2,
                                covariance=True)
    assert _close(lg.covariance, cov), np.abs(lg.covariance - cov).max()
    np.testing.assert_allclose(np.diag(lg.covariance), lg.variance, rtol=1e-12, atol=0)
