"""Running sums of a stream in torch (fisher_ref.torch.moments): the reward spread merged
by Chan's update keeps std(A) and the bound under a large reward offset, and the Ranges
bound the exact variances."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

from fisher_ref import load_config  # noqa: E402
from fisher_ref.rewards import FunctionReward  # noqa: E402
from fisher_ref.torch.exact import torch_exact  # noqa: E402
from tests.torch.test_exact import _ref  # noqa: E402

pytestmark = pytest.mark.torch


def test_reward_offset_leaves_std_and_bound_unchanged():
    """std(A) from block means merged by Chan's update: rewards 1e8 + count against count
    give the same std and bound to 1e-8 (a sum of R^2 minus E[R]^2 would lose it all)."""
    task = load_config("default")
    shifted = task.with_(reward=FunctionReward(lambda p, r: 1e8 + float(list(r).count(2))))
    a = torch_exact(task)["streams"]["policy"]
    b = torch_exact(shifted)["streams"]["policy"]
    assert abs(b["reward_std"] - a["reward_std"]) <= 1e-8 * a["reward_std"]
    np.testing.assert_allclose(b["bound"], a["bound"], rtol=1e-8, atol=0)
    np.testing.assert_allclose(b["covariance"], a["covariance"], rtol=1e-6,
                               atol=1e-8 * np.max(np.abs(a["covariance"])))


def test_ranges_bound_the_exact_variances():
    """Var(X) <= b^2 for |X - E X| <= b: the ranges are consistent with fisher_ref."""
    task = load_config("default")
    ranges, pol = torch_exact(task)["ranges"], _ref(task).streams["policy"]
    for q, var_key in (("sequence_fisher", "h2"), ("token_fisher_sum", "token_sum")):
        assert np.all(pol.variances[var_key] <= ranges[q] ** 2 * (1 + 1e-9) + 1e-300)


def test_tiny_rewards_keep_std_bound_and_correlation():
    """issue 46 item 1: rewards of 1e-170 x a count. The squared deviations underflowed:
    std(A) and the bound came out 0. Against exact rationals over the kept responses."""
    from tests.engine.test_moments import _exact_std
    task = load_config("default")
    count, scale = task.reward, 1e-170
    tiny = task.with_(reward=FunctionReward(lambda p, r: scale * count(p, r)))
    unit = torch_exact(task)["streams"]["policy"]
    out = torch_exact(tiny)
    pol, seqs = out["streams"]["policy"], out["sequences"]
    want = _exact_std(seqs["prob"], seqs["reward"])
    assert want > 0
    assert abs(float(pol["reward_std"]) - want) <= 1e-10 * want, (pol["reward_std"], want)
    np.testing.assert_allclose(pol["bound"], want * np.sqrt(pol["sequence_fisher"]),
                               rtol=1e-10, atol=0)
    np.testing.assert_allclose(pol["correlation"], unit["correlation"], rtol=1e-10, atol=0)
