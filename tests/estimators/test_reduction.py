"""The reward-class reduction against tuple enumeration, and GRPO's difficulty weight
against enumeration of all 2^G binary outcomes."""
import itertools
import math

import numpy as np
import pytest

import cases
from fisher_ref import exact, task_from_json
from fisher_ref.estimators.gradient import expected_loss_gradient
from fisher_ref.estimators import presets as P
from fisher_ref.estimators.reduction import (class_advantages, difficulty_weight,
                                             difficulty_weight_large_g, reduced_gradient)

from .brute import TINY, tiny_task

STALE = {"kind": "perturbed", "scale": 0.4, "seed": 3}
RTOL_REDUCTION = 1e-12  # two finite sums of the same terms, regrouped


@pytest.mark.parametrize("G", [2, 3])
@pytest.mark.parametrize("advantage", ["grpo", "rloo", "group_mean"])
@pytest.mark.parametrize("aggregation", ["seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("sampler,weight", [(None, None), (STALE, None), (STALE, "sequence")])
def test_reduction_is_tuple_enumeration(G, advantage, aggregation, sampler, weight):
    task = tiny_task(sampler)
    loss = P.policy_gradient_loss(advantage, "sequence" if weight else None, aggregation)
    tuples = expected_loss_gradient(task, loss, group_size=G).mean
    reduced = reduced_gradient(task, G, advantage, aggregation, weight)
    assert cases.rel(-reduced, tuples) <= RTOL_REDUCTION


def _plain_grpo_first(r):
    G = len(r)
    m = sum(r) / G
    s = math.sqrt(sum((x - m) ** 2 for x in r) / (G - 1))
    return (r[0] - m) / (s + 1e-6)


@pytest.mark.parametrize("G", [2, 3, 5, 8])
@pytest.mark.parametrize("p", [0.02, 0.3, 0.9])
def test_difficulty_weight_is_enumeration_of_all_outcomes(G, p):
    e1 = e0 = 0.0
    for o in itertools.product((0, 1), repeat=G):
        k = sum(o)
        prob = p ** k * (1 - p) ** (G - k)
        if o[0]:
            e1 += prob * _plain_grpo_first(o) / p
        else:
            e0 += prob * _plain_grpo_first(o) / (1 - p)
    assert difficulty_weight(p, G) == pytest.approx(e1 - e0, rel=1e-12)


def test_difficulty_weight_at_small_p_is_far_from_the_large_g_formula():
    assert difficulty_weight(0.02, 8) == pytest.approx(2.41, abs=5e-3)
    assert difficulty_weight_large_g(0.02, 8) == pytest.approx(6.25, abs=5e-3)


def test_difficulty_weight_tends_to_one_over_the_reward_std():
    p, limit = 0.3, 1 / math.sqrt(0.3 * 0.7)
    gaps = [limit - difficulty_weight(p, G) for G in (16, 64, 256)]
    assert gaps[0] > gaps[1] > gaps[2] > 0 and gaps[2] < 0.01 * limit


def test_binary_rewards_give_the_weight_times_grad_p():
    spec = {"model": TINY, "prompts": [[1]], "max_len": 2,
            "reward": {"name": "match", "target": [1]}}
    task = task_from_json(spec)
    p = exact(task, progress=False).expected_reward
    grad_p = exact(task, progress=False).gradient
    for G in (2, 4, 8):
        assert cases.rel(reduced_gradient(task, G), difficulty_weight(p, G) * grad_p) <= 1e-12


def test_rloo_class_advantage_is_the_reward_minus_the_mean():
    vals, probs = np.array([0.0, 1.0, 2.0]), np.array([0.2, 0.5, 0.3])
    a = class_advantages(vals, probs, 4, "rloo")
    assert np.allclose(a, vals - vals @ probs, rtol=1e-13, atol=1e-15)


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="p must be"):
        difficulty_weight(1.0, 8)
    with pytest.raises(ValueError, match="group_size"):
        difficulty_weight(0.5, 1)
    with pytest.raises(ValueError, match="aggregation"):
        reduced_gradient(tiny_task(), 2, aggregation="token-mean")
