"""The entry points of the parallel layer (fisher_ref.parallel.run): ``exact`` with
``workers``, and the runs of one shard, each returning what its name says."""
import numpy as np
import pytest

import fisher_ref
from fisher_ref import load_config
from fisher_ref.engine import fast
from fisher_ref.engine.plan import Budgets, EngineOptions
from fisher_ref.parallel import exact_param_shard, exact_shard, merge
from fisher_ref.parallel.run import exact
from fisher_ref.parallel.shard_result import ShardResult
from fisher_ref.results import ExactResult

RTOL = 1e-12  # merged shards against one run (tests/parallel/test_shards.py's measure)


def test_the_root_exact_is_the_parallel_layers():
    assert fisher_ref.exact is exact


def test_exact_always_returns_an_exact_result_and_the_shard_runs_a_shard_result():
    task = load_config("default")
    assert isinstance(exact(task, progress=False, workers=1), ExactResult)
    assert isinstance(exact(task, progress=False, reference=True), ExactResult)
    assert isinstance(exact_shard(task, (0, 2)), ShardResult)
    assert isinstance(exact_param_shard(task, (1, 2)), ShardResult)


def test_one_worker_is_the_engine_in_this_process():
    task = load_config("offpolicy_temperature")
    a = exact(task, topk=(1,), progress=False, workers=1)
    b = fast.exact(task, topk=(1,), progress=False)
    for name in a.streams:
        assert np.array_equal(a.streams[name].sequence_fisher, b.streams[name].sequence_fisher)


def test_shards_merge_to_the_single_run():
    task = load_config("default")
    one = exact(task, progress=False, workers=1)
    for run in (exact_shard, exact_param_shard):
        merged = merge(task, [run(task, (i, 3)) for i in range(3)])
        assert np.allclose(merged.sequence_fisher, one.sequence_fisher, rtol=RTOL, atol=0)
        assert np.allclose(merged.gradient, one.gradient, rtol=RTOL,
                           atol=RTOL * np.abs(one.gradient).max())


@pytest.mark.parametrize("name", ["chunk", "keep_states", "keep_sequences", "max_seconds",
                                  "max_bytes", "budgets"])
def test_a_knob_given_as_a_keyword_names_the_options(name):
    with pytest.raises(TypeError, match=rf"options=EngineOptions\({name}="):
        exact(load_config("default"), **{name: None})
    with pytest.raises(TypeError, match=rf"options=EngineOptions\({name}="):
        fast.exact(load_config("default"), **{name: None})


def test_what_is_computed_given_twice_and_differently_is_refused():
    task = load_config("offpolicy_temperature")
    with pytest.raises(ValueError, match="topk is given twice"):
        exact(task, topk=(1,), options=EngineOptions(topk=(2,)))
    with pytest.raises(TypeError, match="options must be a fisher_ref.engine.plan.EngineOptions"):
        exact(task, options={"chunk": 4})
    with pytest.raises(TypeError, match="budgets must be a fisher_ref.engine.plan.Budgets"):
        exact(task, options=EngineOptions(budgets={"defer_bytes": 1}))


def test_options_change_no_number():
    task = load_config("default")
    a = exact(task, progress=False, workers=1)
    b = exact(task, progress=False, workers=1,
              options=EngineOptions(chunk=3, budgets=Budgets(window_cache_bytes=1,
                                                             defer_bytes=1, sub_elements=1,
                                                             autodiff_rows=1)))
    assert np.allclose(a.sequence_fisher, b.sequence_fisher, rtol=1e-10, atol=0)
    assert np.allclose(a.gradient, b.gradient, rtol=1e-10, atol=1e-10 * np.abs(a.gradient).max())
