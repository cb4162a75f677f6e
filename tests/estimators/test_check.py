"""check_loss: right verdicts on right and wrong losses, usable as a pytest assertion."""
import pytest
import torch

from fisher_ref.estimators.check import check_loss
from fisher_ref.estimators import presets as P
from fisher_ref.estimators.check import judge

from .brute import tiny_task

STALE = {"kind": "perturbed", "scale": 0.4, "seed": 3}
REF = {"kind": "perturbed", "scale": 0.3, "seed": 5}


@pytest.fixture(scope="module")
def on():
    return tiny_task(reference=REF)


@pytest.fixture(scope="module")
def off():
    return tiny_task(STALE, REF)


def _seq(b, mask=None):
    return (b.logp * (b.mask if mask is None else mask)).sum(1)


def seq_is(b):  # the unbiased sequence-IS loss, written as a trainer would
    rho = torch.exp(_seq(b) - (b.sampler_logp * b.mask).sum(1)).detach()
    return -(rho * b.rewards * _seq(b)).mean()


def ratio_against_current_policy(b):  # the bug: old_logp (the trainer's) for the sampler's
    rho = torch.exp(_seq(b) - (b.old_logp * b.mask).sum(1)).detach()
    return -(rho * b.rewards * _seq(b)).mean()


def ratio_not_detached(b):  # exp(logp - logp): a ratio against itself, no gradient left
    return -(torch.exp(b.logp - b.logp) * b.rewards[:, None] * b.mask).sum()


def leaked_mask(b):  # the mask shifted by one: the final token (EOS) leaks out of the loss
    m = torch.zeros_like(b.mask)
    m[:, :-1] = b.mask[:, 1:]
    return -(b.rewards * _seq(b, m)).mean()


def flipped_kl(b):
    return -P.kl_in_reward(0.5)(b)


def test_unbiased_losses_pass(on, off):
    assert check_loss(off, seq_is)
    assert check_loss(on, P.reinforce())
    assert check_loss(on, P.rloo(), 2, symmetric=True)
    assert not check_loss(off, P.rloo(), 2, symmetric=True)  # no correction for mu
    check_loss(on, P.group_mean_reinforce(), 3, "unbiased-up-to-scale", symmetric=True).assert_ok()
    check_loss(on, P.dr_grpo(), 2, "unbiased-up-to-scale").assert_ok()
    assert check_loss(on, P.kl_in_reward(0.5), expect="kl")


@pytest.mark.parametrize("loss,task_id", [(ratio_against_current_policy, "off"),
                                          (ratio_not_detached, "on"), (leaked_mask, "on"),
                                          (P.token_is(), "off")])
def test_wrong_losses_fail(loss, task_id, on, off):
    task = {"on": on, "off": off}[task_id]
    for expect in ("unbiased", "unbiased-up-to-scale"):
        v = check_loss(task, loss, expect=expect)
        assert not v and not v.passed
        with pytest.raises(AssertionError, match="FAIL"):
            v.assert_ok()


def test_group_mean_is_not_unbiased_and_says_its_scale(on):
    v = check_loss(on, P.group_mean_reinforce(), 2)
    assert not v and v.scale == pytest.approx(-0.5, rel=1e-10)
    assert "-0.5" in v.message


def test_flipped_kl_sign_fails(on):
    v = check_loss(on, flipped_kl, expect="kl")
    assert not v and v.scale == pytest.approx(-0.5, rel=1e-10)
    assert "wrong sign" in v.message


def test_per_token_kl_gives_a_partial_gradient_and_says_how_much(on):
    v = check_loss(on, P.kl_loss("k2"), expect="kl")
    assert not v and v.scale > 0 and v.relative_bias > 1e-3
    assert f"{v.relative_bias:.3g}" in v.message


def test_bad_expectation_is_refused(on):
    with pytest.raises(ValueError, match="expect must be one of"):
        check_loss(on, P.reinforce(), expect="biased")
    with pytest.raises(ValueError, match="reference"):
        check_loss(tiny_task(), P.reinforce(), expect="kl")


def test_a_vanishing_target_fails_scale_fits(on):
    lg = check_loss(on, P.reinforce()).gradient
    lg.policy_gradient = 0 * lg.policy_gradient
    assert "vanishes" in judge(lg, "unbiased-up-to-scale").message


@pytest.mark.parametrize("rtol,error", [(-1, ValueError), (float("nan"), ValueError),
                                        (0, ValueError), (2.0, ValueError),
                                        ("1e-10", TypeError), (None, TypeError)])
def test_a_bad_rtol_is_refused(on, rtol, error):
    """issue 46 item 12: rtol=-1 and rtol=nan were accepted and gave verdicts that
    always fail."""
    with pytest.raises(error, match="rtol"):
        check_loss(on, P.reinforce(0.3), rtol=rtol)
