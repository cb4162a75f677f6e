"""The parts the presets are built from: each aggregation's formula on a hand-made batch,
the advantages' closed forms, and the argument checks run when a loss is built."""
import math

import pytest
import torch

from fisher_ref.estimators import loss_parts as LP


def test_each_aggregation_is_its_formula():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert LP.aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 15) / 2)
    assert LP.aggregate(loss, mask, "seq-mean-token-mean").item() == \
        pytest.approx((3 / 2 + 15 / 3) / 2)
    assert LP.aggregate(loss, mask, "token-mean").item() == pytest.approx(18 / 5)
    assert LP.aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(18 / 3)
    with pytest.raises(ValueError, match="aggregation"):
        LP.aggregate(loss, mask, "token-sum")


def test_advantages_are_their_closed_forms():
    R = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    assert torch.allclose(LP.advantages(R, "constant", 0.5), R - 0.5)
    assert torch.allclose(LP.advantages(R, "group_mean"), R - 1.0)
    rloo = torch.tensor([1 - 1.0, 0 - 1.5, 2 - 0.5], dtype=torch.float64)
    assert torch.allclose(LP.advantages(R, "rloo"), rloo)
    assert torch.allclose(LP.advantages(R, "grpo"), (R - 1) / (R.std() + LP.GRPO_EPS))


@pytest.mark.parametrize("check,value,match", [
    (LP.check_cap, -1, "cap"), (LP.check_cap, math.nan, "cap"),
    (LP.check_band, (2, 1), "band"), (LP.check_band, "ab", "band"),
    (LP.check_baseline, "mean", "baseline"), (LP.check_baseline, math.inf, "baseline"),
    (LP.check_kl_kind, "k4", "KL estimator"),
])
def test_bad_arguments_are_refused_naming_them(check, value, match):
    with pytest.raises((ValueError, TypeError), match=match):
        check(value)


def test_good_arguments_pass_through():
    assert LP.check_cap(None) is None and LP.check_cap(2) == 2.0
    assert LP.check_band((0, 1.5)) == (0.0, 1.5)
    assert LP.check_baseline(-0.25) == -0.25 and LP.check_kl_kind("k2") == "k2"
