"""The complete responses of the fast engine (fisher_ref.engine.complete): every response's
reward evaluated once, a block's at once, with its tokens and length; none evaluated for
quantities="fisher"; and parents cut into sub-blocks that cover a block within the
element budget."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases import all_responses
from fisher_ref import load_config
from fisher_ref.engine.complete import _sub_blocks
from fisher_ref.engine.fast import exact
from fisher_ref.engine.plan import count_states
from fisher_ref.engine.plan import EngineOptions


@pytest.mark.parametrize("name, chunk", [("default", None), ("weighted_prompts", 3),
                                         ("no_eos", 2)])
def test_every_response_is_rewarded_once_a_block_at_a_time(name, chunk, monkeypatch):
    task = load_config(name)
    real, calls = task.reward.batch, []

    def recording(resp, lengths, prompts, prompt_idx):
        calls.append([(int(i), tuple(int(a) for a in r[:n]))
                      for r, n, i in zip(resp, lengths, prompt_idx)])
        assert (resp[np.arange(task.max_len)[None, :] >= lengths[:, None]] == -1).all()
        return real(resp, lengths, prompts, prompt_idx)

    monkeypatch.setattr(task.reward, "batch", recording)
    exact(task, progress=False, options=EngineOptions(chunk=chunk))
    seen = [key for call in calls for key in call]
    ys = all_responses(task.model.vocab_size, task.max_len, task.model.eos)
    assert len(seen) == len(set(seen)) == count_states(
        task.model.vocab_size, task.max_len, task.model.eos, len(task.prompts))[1]
    assert set(seen) == {(i, y) for i in range(len(task.prompts)) for y in ys}
    assert len(calls) < len(seen)  # a block's responses at once, not one call each


@pytest.mark.parametrize("B, P, elements", [(10, 3, 9), (10, 3, 1), (7, 2, 100), (1, 5, 4),
                                            (0, 3, 9)])
def test_sub_blocks_cover_the_parents_within_the_budget(B, P, elements):
    _check_sub_blocks(B, P, elements)


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(st.integers(0, 5000), st.integers(1, 5000), st.integers(1, 2 ** 22))
def test_sub_blocks_are_even_and_within_half_again_the_budget(B, P, elements):
    _check_sub_blocks(B, P, elements)


def _check_sub_blocks(B, P, elements):
    """Consecutive slices that cover the parents once, of sizes that differ by one at
    most, each at most half again the budget's rows (``elements // P``, at least 1), as
    many as the budget's rows make rounded to the nearest (none for no parent)."""
    parts = _sub_blocks(B, P, elements)
    rows = [i for sl in parts for i in range(B)[sl]]
    assert rows == list(range(B))
    step = max(1, elements // P)
    sizes = [len(range(B)[sl]) for sl in parts]
    assert all(0 < n <= 1.5 * step for n in sizes)
    assert not sizes or max(sizes) - min(sizes) <= 1
    if B == 0:
        assert parts == []
    else:  # the nearest whole number of rows: one below 1.5 rows, else within half a row
        assert (len(parts) == 1 and B / step < 1.5) or abs(len(parts) - B / step) <= 0.5


def test_fisher_quantities_evaluate_no_reward(monkeypatch):
    """The Fisher quantities do not depend on the reward: it is never called."""
    task = load_config("offpolicy_stale")

    def refuse(*args, **kw):
        raise AssertionError("the reward was evaluated")

    monkeypatch.setattr(task.reward, "batch", refuse)
    r = exact(task, progress=False, quantities="fisher")
    assert np.isfinite(r.sequence_fisher).all()
    with pytest.raises(AssertionError, match="reward was evaluated"):
        exact(task, progress=False)
