"""Parameter shards (fisher_ref.engine.param_shards): the whole tree for a slice of the
parameters, placed side by side; what exact(task, workers=N) runs."""
import pytest
from hypothesis import given, settings, strategies as st

from cases import CASES
from fisher_ref import load_config
from fisher_ref.engine.fast import exact
from fisher_ref.engine.shards import ShardError, merge
from tests.engine.test_identities_exact import small_tasks
from tests.engine.test_shards import assert_merged_equal


@pytest.mark.parametrize("case", sorted(CASES))
def test_merged_parameter_shards_match_a_single_run(case):
    """Parameter shards (what workers=N runs): every quantity at 1e-12, the per-state and
    per-response arrays in the same order, for 1 to 5 slices (and one per parameter)."""
    task = CASES[case]()
    for n in (1, 2, 3, 5):
        assert_merged_equal(task, n, case, by="param_shard")
    for q in ("all", "fisher"):
        assert_merged_equal(task, min(7, task.model.num_params), case, by="param_shard",
                            quantities=q)


@settings(derandomize=True, database=None, deadline=None, max_examples=15)
@given(small_tasks(), st.integers(1, 4))
def test_merged_parameter_shards_match_on_random_tasks(task, n):
    assert_merged_equal(task, min(n, task.model.num_params), "random task", by="param_shard")


def test_parameter_shards_tile_the_parameters_and_refuse_mixing():
    from fisher_ref.engine.shards import param_columns
    for P, n in ((10, 3), (7, 7), (4376, 2)):
        cols = param_columns(P, n)
        assert cols[0].start == 0 and cols[-1].stop == P
        assert all(a.stop == b.start for a, b in zip(cols, cols[1:]))
        assert max(c.stop - c.start for c in cols) - min(c.stop - c.start for c in cols) <= 1
    task = load_config("default")
    tree = [exact(task, progress=False, shard=(i, 2)) for i in range(2)]
    cols = [exact(task, progress=False, param_shard=(i, 2)) for i in range(2)]
    with pytest.raises(ShardError, match="different runs"):
        merge(task, [tree[0], cols[1]])
    with pytest.raises(ShardError, match="each of the 2 shards once"):
        merge(task, [cols[0], cols[0]])
    with pytest.raises(ValueError, match="give one of them"):
        exact(task, progress=False, shard=(0, 2), param_shard=(0, 2))
    with pytest.raises(ValueError, match="neither"):
        exact(task, progress=False, reference=True, param_shard=(0, 2))
    with pytest.raises(ValueError, match="shard must be a pair"):
        exact(task, progress=False, param_shard=(2, 2))


def test_more_parameter_shards_than_parameters_are_refused():
    task = load_config("tabular")
    P = task.model.num_params
    with pytest.raises(ValueError, match=f"{P} parameters into more slices"):
        exact(task, progress=False, param_shard=(0, P + 1))
    assert_merged_equal(task, P, "one parameter each", by="param_shard")


@pytest.mark.parametrize("keep", [(False, False), (True, False), (False, True)])
def test_parameter_shards_with_some_arrays_kept(keep):
    task = load_config("offpolicy_temperature")
    merged, _ = assert_merged_equal(task, 3, f"keep {keep}", by="param_shard",
                                    keep_states=keep[0], keep_sequences=keep[1])
    assert (merged.states is not None) == keep[0]
    assert (merged.sequences is not None) == keep[1]


def test_parameter_shards_of_different_walks_are_refused():
    task = load_config("default")
    parts = [exact(task, progress=False, param_shard=(i, 2)) for i in range(2)]
    parts[1].moments["policy"]["mass"] *= 1.5
    with pytest.raises(ShardError, match="did not walk the same tree"):
        merge(task, parts)
