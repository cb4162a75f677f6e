"""Review cases: verdicts of check_loss on right and wrong losses the other tests do not
hold, and bad input refused with an error naming the argument."""
import numpy as np
import pytest
import torch

from fisher_ref.cli import main
from fisher_ref.engine.plan import EnumerationTooLarge
from fisher_ref.estimators import check_loss, expected_loss_gradient, presets as P

from .brute import tiny_task

STALE = {"kind": "perturbed", "scale": 0.4, "seed": 3}
HOT = {"kind": "temperature", "temperature": 0.7}
REF = {"kind": "perturbed", "scale": 0.3, "seed": 5}


def _seq(b):
    return (b.logp * b.mask).sum(1)


def reinforce(b):
    return -(b.rewards * _seq(b)).mean()


def no_reward(b):  # REINFORCE without the reward: E[grad L] = -E[h] = 0
    return -_seq(b).mean()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("G", [1, 2])
def test_a_vanishing_expected_gradient_never_passes(seed, G):
    """k1 in the loss has E[grad] = 0 on policy: the fitted scale is rounding, of either
    sign; it passed 'kl' when the rounding came out positive (seed 0, G = 1)."""
    task = tiny_task(reference=REF, seed=seed)
    v = check_loss(task, P.kl_loss("k1"), G, expect="kl")
    assert not v and "vanishes" in v.message, v.message
    v = check_loss(task, no_reward, G, expect="unbiased-up-to-scale")
    assert not v and "vanishes" in v.message, v.message


def test_a_ratio_against_the_current_policy_has_no_gradient_and_fails():
    def ppo_ratio_against_itself(b):  # old_logp taken from the live graph
        A = b.rewards - b.rewards.mean()
        ratio = torch.exp(b.logp - b.logp)
        return -(torch.minimum(ratio * A[:, None], ratio.clamp(0.8, 1.2) * A[:, None])
                 * b.mask).sum() / b.mask.sum()
    for expect in ("unbiased", "unbiased-up-to-scale"):
        v = check_loss(tiny_task(), ppo_ratio_against_itself, 2, expect)
        assert not v
    assert "vanishes" in v.message


def test_padding_counted_in_the_mean_is_a_scale_not_unbiased():
    def padded_token_mean(b):  # divides by B T, the padding counted
        return -(b.rewards[:, None] * b.logp).sum() / b.mask.numel()
    task = tiny_task()
    v = check_loss(task, padded_token_mean)
    assert not v and v.scale == pytest.approx(-1 / task.max_len, rel=1e-10)
    assert check_loss(task, padded_token_mean, expect="unbiased-up-to-scale")


@pytest.mark.parametrize("sampler", [STALE, HOT])
def test_sequence_is_with_leave_one_out_baseline_is_unbiased_off_policy(sampler):
    def seq_is_rloo(b):
        rho = torch.exp(_seq(b) - (b.sampler_logp * b.mask).sum(1)).detach()
        G = b.rewards.shape[0]
        A = b.rewards - (b.rewards.sum() - b.rewards) / (G - 1)
        return -(rho * A * _seq(b)).mean()
    task = tiny_task(sampler)
    check_loss(task, seq_is_rloo, 2).assert_ok()
    check_loss(task, seq_is_rloo, 2, symmetric=True).assert_ok()
    assert not check_loss(task, P.token_is())


@pytest.mark.parametrize("loss", [P.kl_loss("k3"), P.rho_k3(), P.kl_loss("k2")],
                         ids=["k3", "rho_k3", "k2"])
@pytest.mark.parametrize("sampler", [None, STALE])
def test_per_token_kl_terms_fail_kl_and_say_by_how_much(loss, sampler):
    v = check_loss(tiny_task(sampler, REF), loss, expect="kl")
    assert not v and v.relative_bias > 1e-3
    assert f"relative bias={v.relative_bias:.3g}" in v.message


def test_k1_in_reward_is_the_kl_on_policy_only():
    assert check_loss(tiny_task(reference=REF), P.kl_in_reward(0.2), expect="kl")
    assert not check_loss(tiny_task(STALE, REF), P.kl_in_reward(0.2), expect="kl")


def test_a_nan_gradient_is_refused_naming_the_group():
    def std_of_one(b):  # torch.std of one reward is NaN
        return -((b.rewards - b.rewards.mean()) / b.rewards.std() * _seq(b)).mean()
    with pytest.raises(ValueError, match=r"loss\(batch\) has a NaN or infinite gradient"):
        expected_loss_gradient(tiny_task(), std_of_one, 1)
    with pytest.raises(ValueError, match="prompt 0"):
        expected_loss_gradient(tiny_task(), lambda b: reinforce(b) * float("inf"), 1)


def test_a_nan_only_at_padding_is_no_error():
    def nan_past_the_end(b):  # 0/0 at padded positions, masked out with where
        per = torch.where(b.mask, b.logp / b.logp, 0.0)
        return -(b.rewards * (per * b.logp).sum(1)).mean()
    lg = expected_loss_gradient(tiny_task(), nan_past_the_end, 1)
    assert np.isfinite(lg.mean).all()


def test_symmetric_true_on_an_asymmetric_loss_is_refused():
    def first_counts_twice(b):
        w = torch.ones(b.rewards.shape[0], dtype=torch.float64)
        w = torch.cat([w[:1] * 2, w[1:]])
        return -(w * b.rewards * _seq(b)).mean()
    for G in (2, 3):
        with pytest.raises(ValueError, match="not symmetric in its responses"):
            expected_loss_gradient(tiny_task(), first_counts_twice, G, symmetric=True)
    a = expected_loss_gradient(tiny_task(), P.grpo(), 3)
    b = expected_loss_gradient(tiny_task(), P.grpo(), 3, symmetric=True)
    assert np.linalg.norm(a.mean - b.mean) <= 1e-10 * np.linalg.norm(a.mean)


@pytest.mark.parametrize("kw,error,match", [
    ({"symmetric": "yes"}, TypeError, "symmetric"),
    ({"symmetric": None}, TypeError, "symmetric"),
    ({"max_groups": 0}, ValueError, "max_groups"),
    ({"max_groups": True}, ValueError, "max_groups"),
    ({"max_bytes": "2GiB"}, ValueError, "max_bytes"),
    ({"group_size": True}, ValueError, "group_size"),
    ({"group_size": 10 ** 9}, EnumerationTooLarge, r"\de\+\d+ groups of 1000000000"),
])
def test_bad_arguments_are_named(kw, error, match):
    kw = {"group_size": 1, **kw}
    with pytest.raises(error, match=match):
        expected_loss_gradient(tiny_task(), reinforce, **kw)


def test_cli_max_groups_zero_exits_2(capsys):
    assert main(["estimators", "--config", "tabular", "--max-groups", "0"]) == 2
    assert "--max-groups" in capsys.readouterr().err


def test_cli_huge_group_size_exits_2_saying_how_many(capsys):
    assert main(["estimators", "--config", "tabular", "--group-size", "2e9"]) == 2
    assert "groups of 2000000000 responses" in capsys.readouterr().err
