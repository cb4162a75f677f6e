"""The shared walk: closed-form places of states against the sorted states of the
plain engine."""
import numpy as np
import pytest

from cases import get_task
from fisher_ref.exact_reference import exact_reference
from fisher_ref.walk import state_places


@pytest.mark.parametrize("case", ["config:default", "config:no_eos", "config:weighted_prompts",
                                  "zero_weight_prompt", "tabular_context2", "config:gpt2_small"])
def test_state_places_are_the_sorted_order(case):
    """The plain engine sorts its kept states by (prompt, depth, tokens); the place
    ``state_places`` gives each state of a block is its row there."""
    task = get_task(case)
    st = exact_reference(task, progress=False, keep_states=True).states
    plen = np.array([len(p) for p in task.prompts])[st["prompt"]]
    for d in np.unique(st["depth"]):
        rows = np.flatnonzero(st["depth"] == d)
        block = {"tokens": st["tokens"][rows], "length": plen[rows] + d,
                 "prompt": st["prompt"][rows], "depth": int(d)}
        assert np.array_equal(state_places(task, block), rows)
