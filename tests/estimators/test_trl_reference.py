"""fisher_ref.estimators.trl_reference: TRL's GRPO losses as fisher_ref writes them, held
to TRL's own installed ``_compute_loss`` (through trl_loss, code it does not share) on the
exact expected gradient, for every loss type and scale_rewards, one group and two groups
per batch; and the settings it does not cover."""
import warnings

import numpy as np
import pytest

from fisher_ref.checks.tolerances import EXACT_RTOL
from fisher_ref.estimators import expected_loss_gradient
from fisher_ref.estimators.trainers import trl_loss
from fisher_ref.estimators.trl_reference import (REFERENCE_LOSS_TYPES, reference_refusal,
                                                 trl_reference_loss)

from .brute import tiny_task

G = 2
#: TRL's nanstd takes its Bessel factor n/(n-1) in float32: 6/5 over a two-group batch of
#: 3 rows each is off by 4e-8 relative, so "batch" over two groups agrees to this only.
BATCH_STD_RTOL = 1e-7


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _gap(a, b):
    return np.abs(a.mean - b.mean).max() / np.abs(b.mean).max()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("loss_type", REFERENCE_LOSS_TYPES)
def test_reference_is_trls_own_loss_on_one_group(loss_type, scale):
    task = tiny_task(one_prompt=True)
    ours = expected_loss_gradient(task, trl_reference_loss(loss_type, scale, 2), G,
                                  symmetric=True)
    trls = expected_loss_gradient(task, trl_loss(loss_type, scale_rewards=scale,
                                                 max_completion_length=2), G, symmetric=True)
    assert _gap(ours, trls) <= EXACT_RTOL, (loss_type, scale, _gap(ours, trls))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("loss_type", REFERENCE_LOSS_TYPES)
def test_reference_is_trls_own_loss_on_two_groups(loss_type, scale):
    task = tiny_task(one_prompt=True)
    G3 = 3
    opts = dict(symmetric=True, groups_per_batch=2)
    ours = expected_loss_gradient(task, trl_reference_loss(loss_type, scale, 2), G3, **opts)
    trls = expected_loss_gradient(task, trl_loss(loss_type, scale_rewards=scale,
                                                 max_completion_length=2), G3, **opts)
    tol = BATCH_STD_RTOL if scale == "batch" else EXACT_RTOL
    assert _gap(ours, trls) <= tol, (loss_type, scale, _gap(ours, trls))


def test_what_the_reference_does_not_cover_is_named():
    from trl import GRPOConfig
    base = dict(report_to="none", use_cpu=True, bf16=False, output_dir="unused")
    assert reference_refusal(GRPOConfig(loss_type="grpo", **base)) is None
    for over, name in (({"loss_type": "sapo"}, "sapo"), ({"beta": 0.1}, "beta"),
                       ({"importance_sampling_level": "sequence"},
                        "importance_sampling_level"),
                       ({"entropy_coef": 0.01}, "entropy_coef")):
        why = reference_refusal(GRPOConfig(**{"loss_type": "grpo", **base, **over}))
        assert why is not None and name in why, (over, why)
    with pytest.raises(ValueError, match="loss_type"):
        trl_reference_loss("sapo", "group", 2)
    with pytest.raises(ValueError, match="scale_rewards"):
        trl_reference_loss("grpo", "rank", 2)
