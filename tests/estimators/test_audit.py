"""What expected_loss_gradient tells the user: how the loss was evaluated (vmap or the
loop, with the error and one warning), the casts below float64 it makes, the batch an
exception was raised on, and a failing scale within 1e-5 of the expected one."""
import warnings

import pytest
import torch

from fisher_ref.estimators import check_loss, expected_loss_gradient, presets
from fisher_ref.estimators.audit import VmapFallbackWarning

from .brute import tiny_task


def _seq(b):
    return (b.logp * b.mask).sum(1)


def with_item(b):  # logging a metric with .item(), as TRL and verl do
    metrics = {"mean_reward": b.rewards.mean().item()}
    assert metrics
    return -(b.rewards * _seq(b)).mean()


def mask_assign(b):  # boolean-mask assignment
    A = b.rewards.clone()
    A[b.rewards == 0] = 0.0
    return -(A * _seq(b)).mean()


@pytest.mark.parametrize("loss,cause", [(with_item, "item"), (mask_assign, "mask")])
def test_a_fallback_says_so_once(loss, cause):
    with pytest.warns(VmapFallbackWarning) as rec:
        lg = expected_loss_gradient(tiny_task(), loss, 1, groups_per_batch=2)
    assert len([w for w in rec if w.category is VmapFallbackWarning]) == 1
    assert lg.evaluation == "loop" and cause in lg.evaluation_error.lower()
    assert ".item()" in str(rec[0].message) and "symmetric=True" in str(rec[0].message)


def test_a_vectorised_loss_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error", VmapFallbackWarning)
        lg = expected_loss_gradient(tiny_task(), presets.reinforce(), 2)
    assert lg.evaluation == "vmap" and lg.evaluation_error is None and lg.casts == {}


def float32_ratio(b):  # sequence IS, its ratio computed in float32 (as compute_approx_kl does)
    log_ratio = ((b.logp - b.sampler_logp) * b.mask).sum(1).float()
    return -(torch.exp(log_ratio).double() * b.rewards).mean()


def test_casts_are_listed_and_named_in_the_verdict():
    v = check_loss(tiny_task(sampler={"kind": "perturbed", "scale": 0.4, "seed": 3}),
                   float32_ratio)
    assert v.gradient.casts.get("aten._to_copy to float32", 0) >= 1
    assert not v.passed and "the loss casts to float32: aten._to_copy" in v.message, v.message
    clean = check_loss(tiny_task(), presets.reinforce())
    assert clean.passed and clean.gradient.casts == {}


def test_an_exception_names_the_batch():
    def fails_on_long(b):
        if bool((b.lengths > 1).all()):
            raise ValueError("too long")
        return -(b.rewards * _seq(b)).mean()
    with pytest.raises(ValueError, match=r"too long -- on the batch of prompt") as info:
        expected_loss_gradient(tiny_task(), fails_on_long, 2, vectorize=False)
    assert "responses [[" in str(info.value) and isinstance(info.value.__cause__, ValueError)
    with pytest.raises(ValueError, match=r"on the batch of prompts \[0, 1\]|on the batch of "
                                         r"prompt"):
        expected_loss_gradient(tiny_task(), fails_on_long, 1, groups_per_batch=2)


def test_a_scale_within_1e5_says_the_direction_is_exact():
    """verl's GRPO with one response is R/(1+1e-6): unbiased fails by 1e-6 only."""
    v = check_loss(tiny_task(), presets.grpo("seq-mean-token-sum"), 1)
    assert not v.passed and "the direction is exact" in v.message, v.message
    assert check_loss(tiny_task(), presets.grpo("seq-mean-token-sum"), 1,
                      "unbiased-up-to-scale").passed
    far = check_loss(tiny_task(), presets.group_mean_reinforce(), 2)
    assert not far.passed and "direction is exact" not in far.message
