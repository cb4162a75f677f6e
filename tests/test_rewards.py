"""Rewards: built-ins by hand, custom callables, bad values through exact(), and the
vectorised ``batch`` form against per-response calls."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

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


# ---------------------------------------------------------------- vectorised rewards

@st.composite
def response_blocks(draw):
    """A block of responses as the engines hold them: ``(M, T)`` tokens, -1 after each
    response's end, EOS (0) only as a last token when ``eos`` is on."""
    V, T, eos = draw(st.integers(2, 6)), draw(st.integers(1, 4)), draw(st.booleans())
    M = draw(st.integers(1, 12))
    tokens = np.full((M, T), -1, dtype=np.int64)
    lengths = np.zeros(M, dtype=np.int64)
    for m in range(M):
        n = draw(st.integers(1, T))
        body = draw(st.lists(st.integers(1 if eos else 0, V - 1), min_size=n, max_size=n))
        if eos and (n < T or draw(st.booleans())):
            body[-1] = 0
        tokens[m, :n], lengths[m] = body, n
    return V, T, eos, tokens, lengths


def _rewards_for(draw, V, T, eos, first):
    """Built-in rewards for a block; one match target is the block's first response
    (EOS stripped), so that matches occur."""
    target = draw(st.lists(st.integers(1 if eos else 0, V - 1), max_size=T + 1))
    own = list(first[:-1]) if eos and first[-1] == 0 else list(first)
    return [CountReward(draw(st.integers(0, V - 1))), CountReward(0), MatchReward(target, eos=eos),
            MatchReward(own, eos=eos), LengthReward(eos=eos)]


@settings(derandomize=True, database=None, deadline=None, max_examples=200)
@given(response_blocks(), st.data())
def test_vectorised_rewards_equal_per_response_calls(block, data):
    """``reward.batch`` on a block equals ``reward(prompt, response)`` response by response."""
    V, T, eos, tokens, lengths = block
    prompts = [(), (1,), (V - 1, 0)]
    ids = np.array(data.draw(st.lists(st.integers(0, 2), min_size=len(lengths),
                                      max_size=len(lengths))))
    for reward in _rewards_for(data.draw, V, T, eos, tokens[0, :lengths[0]].tolist()):
        got = reward.batch(tokens, lengths, prompts, ids)
        want = [reward(prompts[i], tuple(row[:n])) for i, row, n in zip(ids, tokens.tolist(),
                                                                         lengths)]
        assert got.dtype == float and got.shape == (len(lengths),)
        assert got.tolist() == want, reward


def test_custom_reward_batch_calls_the_function_per_response():
    seen = []

    def spy(prompt, response):
        seen.append((prompt, response))
        return float(len(prompt)) + sum(response)

    tokens = np.array([[1, 2, 0], [3, -1, -1]])
    got = FunctionReward(spy).batch(tokens, np.array([3, 1]), [(), (4, 4)], np.array([1, 0]))
    assert got.tolist() == [2.0 + 3, 3.0]
    assert seen == [((4, 4), (1, 2, 0)), ((), (3,))]
    with pytest.raises(ValueError, match="non-finite value nan"):
        FunctionReward(lambda p, y: float("nan")).batch(tokens, np.array([3, 1]), [()],
                                                        np.array([0, 0]))
