"""The shared walk: closed-form places of states and responses against an ordering
computed here (lexsort of the brute-force enumeration)."""
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases import all_responses, get_task
from fisher_ref import exact, load_config
from fisher_ref.reference import exact_reference
from fisher_ref.engine.run import response_places, state_places
from fisher_ref.engine.tree import Block
from fisher_ref.engine.plan import EngineOptions


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
        block = Block(prompt=st["prompt"][rows], depth=int(d), rp=None, rq=None,
                      tokens=st["tokens"][rows], length=plen[rows] + d)
        assert np.array_equal(state_places(task, block), rows)


@settings(max_examples=40, deadline=None)
@given(V=st.integers(2, 5), T=st.integers(1, 4), eos=st.booleans(), n_prompts=st.integers(1, 3),
       seed=st.integers(0, 2 ** 31 - 1))
def test_response_places_are_the_lexicographic_order(V, T, eos, n_prompts, seed):
    """``response_places`` of every response, given in a random order, is its row in the
    (prompt, tokens) order of a lexsort written here (``-1`` pads sort first)."""
    task = SimpleNamespace(model=SimpleNamespace(vocab_size=V, eos=eos), max_len=T)
    ys = all_responses(V, T, eos)
    resp = np.full((len(ys) * n_prompts, T), -1)
    prompt = np.repeat(np.arange(n_prompts), len(ys))
    for i, y in enumerate(ys * n_prompts):
        resp[i, :len(y)] = y
    order = np.lexsort([resp[:, c] for c in range(T - 1, -1, -1)] + [prompt])
    rank = np.empty(len(order), dtype=int)
    rank[order] = np.arange(len(order))
    shuffle = np.random.default_rng(seed).permutation(len(order))
    assert np.array_equal(response_places(task, prompt[shuffle], resp[shuffle]), rank[shuffle])


def test_the_walk_refuses_rows_it_did_not_write(monkeypatch):
    """A walk that put two responses in one place (so left another place unwritten)
    raises instead of returning uninitialised rows."""
    import fisher_ref.engine.run as walk
    real = walk.response_places
    monkeypatch.setattr(walk, "response_places", lambda *a: np.minimum(real(*a), 3))
    try:
        exact(load_config("default"), progress=False, options=EngineOptions(keep_sequences=True))
    except RuntimeError as e:
        assert "places" in str(e)
    else:
        raise AssertionError("a walk that misses places must raise")


def test_run_carries_no_shard_plumbing():
    """The parallel layer wraps the engine: a run takes the part of the tree it walks as a
    generic cut (its own ``cut``), and neither a shard nor the process's memory settings
    (the budgets carry those)."""
    import inspect

    from fisher_ref.engine.plan import EngineOptions
    from fisher_ref.engine.run import Run
    assert list(inspect.signature(Run).parameters) == ["task", "options", "columns", "cut"]
    run = Run(load_config("default"), EngineOptions(progress=False))
    assert run.cut is None and not hasattr(run, "shard") and not hasattr(run, "memory_kept")
