"""Rewards: built-ins by hand, custom callables, and bad values through exact()."""
import math

import numpy as np
import pytest

from fisher_ref import exact, load_config
from fisher_ref.rewards import (CountReward, FunctionReward, LengthReward, MatchReward,
                                evaluate_reward, make_reward)


def test_builtin_rewards_by_hand():
    assert CountReward(2)((1,), (2, 3, 2, 0)) == 2.0
    assert MatchReward([1, 2])((), (1, 2, 0)) == 1.0
    assert MatchReward([1, 2])((), (1, 2)) == 1.0
    assert MatchReward([1, 2], eos=False)((), (1, 2, 0)) == 0.0
    assert LengthReward()((5,), (1, 2, 0)) == 2.0
    assert LengthReward(eos=False)((5,), (1, 2, 0)) == 3.0


def test_make_reward_from_json_and_callables():
    assert make_reward({"name": "count", "token": 3}).to_json() == {"name": "count", "token": 3}
    r = make_reward(lambda p, y: len(y) * 0.5)
    assert isinstance(r, FunctionReward) and r((), (1, 2)) == 1.0
    same = CountReward(1)
    assert make_reward(same) is same


@pytest.mark.parametrize("spec, words", [
    ({"name": "bleu"}, "unknown reward 'bleu'"),
    ({"name": "count", "token": -1}, "non-negative integer token"),
    ({"name": "count", "token": 1.5}, "non-negative integer token"),
    ({"name": "match", "target": "12"}, "list of integer tokens"),
    ({"name": "length", "scale": 2}, "bad arguments for reward 'length'"),
    ("count", "must be a dict with a 'name'"),
])
def test_bad_reward_specs(spec, words):
    with pytest.raises(ValueError, match=words):
        make_reward(spec)


def test_function_reward_needs_a_callable():
    with pytest.raises(TypeError, match="must be callable"):
        FunctionReward(3)


@pytest.mark.parametrize("value, words", [
    (float("nan"), "non-finite value nan"),
    (float("inf"), "non-finite value inf"),
    ("high", "'high' \\(not a number\\)"),
    (None, "None \\(not a number\\)"),
    (np.array([1.0, 2.0]), "not a number"),
], ids=["nan", "inf", "string", "none", "array"])
def test_bad_reward_values_are_refused_by_exact(value, words):
    task = load_config("default").with_(reward=FunctionReward(lambda p, y: value))
    with pytest.raises(ValueError, match="reward returned .*" + words):
        exact(task, progress=False)
    with pytest.raises(ValueError, match="for prompt \\[1, 2\\] and response"):
        evaluate_reward(FunctionReward(lambda p, y: value), (1, 2), (3,))


def test_reward_sees_prompt_and_response_with_eos():
    seen = []

    def spy(prompt, response):
        seen.append((prompt, response))
        return 0.0

    task = load_config("default").with_(reward=FunctionReward(spy))
    r = exact(task, progress=False)
    assert len(seen) == r.n_responses
    assert ((1, 2), (0,)) in seen and ((3,), (4, 4, 4)) in seen
    assert all(math.isfinite(x) for x in r.gradient)
