"""Parameter shards (fisher_ref.parallel.param_shards): the whole tree for a slice of the
parameters, placed side by side; what exact(task, workers=N) runs."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases import CASES, with_options
from fisher_ref import load_config
from fisher_ref.parallel.run import exact
from fisher_ref.parallel.shards import ShardError, merge
from fisher_ref.engine.plan import EngineOptions
from fisher_ref.parallel import exact_param_shard, exact_shard
from tests.engine.test_identities_exact import small_tasks
from tests.parallel.test_shards import assert_merged_equal


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
    from fisher_ref.engine.columns import param_columns
    for P, n in ((10, 3), (7, 7), (4376, 2)):
        cols = param_columns(P, n)
        assert cols[0].start == 0 and cols[-1].stop == P
        assert all(a.stop == b.start for a, b in zip(cols, cols[1:]))
        assert max(c.stop - c.start for c in cols) - min(c.stop - c.start for c in cols) <= 1
    task = load_config("default")
    tree = [exact_shard(task, (i, 2)) for i in range(2)]
    cols = [exact_param_shard(task, (i, 2)) for i in range(2)]
    with pytest.raises(ShardError, match="different runs"):
        merge(task, [tree[0], cols[1]])
    with pytest.raises(ShardError, match="each of the 2 shards once"):
        merge(task, [cols[0], cols[0]])
    with pytest.raises(ValueError, match="shard must be a pair"):
        exact_param_shard(task, (2, 2))


def test_shards_that_do_not_hold_each_parameter_once_are_refused():
    """Parameter shards whose sets overlap or leave a parameter out (shards of plans that
    differ), or whose sums are not as wide as the parameters they name, are refused by
    name, never placed over one another."""
    import dataclasses
    from fisher_ref.engine.mlp_columns import UnitColumns
    from fisher_ref.perf.scaling import load_scale_config
    medium = load_scale_config("medium")
    spec, P = medium.model.spec, medium.model.num_params
    parts = [exact_param_shard(medium, (i, 2)) for i in range(2)]
    held = [p.columns for p in parts]
    assert all(isinstance(c, UnitColumns) for c in held)
    kd1 = spec.context * spec.embed_dim + 1  # one hidden unit's parameters
    wider = UnitColumns(spec, held[0].lo, held[0].hi + kd1, held[0].h0, held[0].h1 + 1)
    for bad, distinct, twice in ((wider, P, kd1), (slice(0, 10), 10 + held[1].width, 0)):
        with pytest.raises(ShardError, match=f"hold {distinct} distinct of the {P} "
                           f"parameters, {twice} of them in more than one shard"):
            merge(medium, [dataclasses.replace(parts[0], columns=bad, checksum=None), parts[1]])
    swapped = [dataclasses.replace(p, columns=c, checksum=None)  # checksums of the swap
               for p, c in zip(parts, held[::-1])]
    with pytest.raises(ShardError, match=r"parameter shard 0 of 2 names \d+ parameters "
                       r".* but holds sums \[\d+\] wide"):
        merge(medium, swapped)  # every parameter once, but each shard's sums elsewhere
    assert merge(medium, parts).sequence_fisher.shape == (P,)


def _columns_index(task, cols):
    from fisher_ref.engine.columns import column_index
    return [column_index(c, task.model.num_params) for c in cols]


def test_mlp_parameter_shards_are_cut_between_hidden_units():
    """For the MLP, two shards of medium and v16 meet between two hidden units: the first
    holds E and W1's family for units 0..u, the second the rest of W1's family and all of
    W2's, each forming ghat of its own units only; together they hold every parameter once
    and merged give the single run. Three shards of v16 leave W2's family to the last
    (the cut within reach of its start moves there). The GPT-2's shards are consecutive
    slices."""
    from fisher_ref.engine.factored import shard_columns
    from fisher_ref.engine.columns import param_columns
    from fisher_ref.engine.mlp_columns import UnitColumns, mlp_blocks
    from fisher_ref.perf.scaling import load_scale_config
    for name in ("medium", "v16"):
        task = load_scale_config(name)
        spec, P = task.model.spec, task.model.num_params
        at = {b: (start, stop) for b, start, stop in mlp_blocks(spec)}
        first, second = shard_columns(task, 2)
        assert isinstance(first, UnitColumns) and isinstance(second, UnitColumns)
        assert first.h0 == 0 and first.h1 == second.h0 and second.h1 == spec.hidden
        assert spec.hidden // 2 < first.h1 < spec.hidden  # E and most units: W2's is cheap
        idx = _columns_index(task, (first, second))
        assert set(range(at["E"][1])) <= set(idx[0]) and set(range(at["W2"][0], P)) <= set(idx[1])
        assert np.array_equal(np.sort(np.concatenate(idx)), np.arange(P))
        assert exact_param_shard(task, (1, 2)).columns == second
    v16 = load_scale_config("v16")
    third = shard_columns(v16, 3)[2]
    assert third == slice(mlp_blocks(v16.model.spec)[3][1], v16.model.num_params)
    gpt2 = load_config("gpt2_small")
    assert shard_columns(gpt2, 2) == param_columns(gpt2.model.num_params, 2)
    assert_merged_equal(load_scale_config("medium"), 2, "medium, cut between units",
                        by="param_shard")


def test_a_parameter_shard_keeps_only_its_families_factors(monkeypatch):
    """medium cut at n=2: the second shard (the last hidden units and W2's family) keeps no
    factor of E's family (the centered E block, its moments) in its window cache, and ghat
    and its moments of its own units only; the first no moment of D; both keep the
    factors every run reads."""
    from fisher_ref.engine import fast
    from fisher_ref.perf.scaling import load_scale_config
    caches = []

    class Recorded(fast.WindowCache):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            caches.append(self)
    monkeypatch.setattr(fast, "WindowCache", Recorded)
    medium = load_scale_config("medium")
    held = []
    for i in range(2):
        exact_param_shard(medium, (i, 2))
        held.append({n.rstrip("0123456789_") for n in caches[-1].arrays})
        units = caches[-1].columns.h1 - caches[-1].columns.h0
        assert caches[-1].arrays["gc0"].shape[-1] == units < medium.model.spec.hidden
        assert caches[-1].arrays["mG0_1"].shape[-1] == units
    exact(medium, progress=False)
    whole = {n.rstrip("0123456789_") for n in caches[-1].arrays}
    assert {"gc", "Ec", "mG", "mE", "mD", "c", "e", "hid"} <= whole
    assert not held[1] & {"Ec", "mE"} and {"gc", "mG", "mD", "c", "hid"} <= held[1]
    assert "mD" not in held[0] and {"gc", "Ec", "mG", "mE", "c"} <= held[0]


def test_more_parameter_shards_than_parameters_are_refused():
    task = load_config("tabular")
    P = task.model.num_params
    with pytest.raises(ValueError, match=f"{P} parameters into more slices"):
        exact_param_shard(task, (0, P + 1))
    assert_merged_equal(task, P, "one parameter each", by="param_shard")


@pytest.mark.parametrize("keep", [(False, False), (True, False), (False, True)])
def test_parameter_shards_with_some_arrays_kept(keep):
    task = load_config("offpolicy_temperature")
    merged, _ = assert_merged_equal(task, 3, f"keep {keep}", by="param_shard",
                                    keep_states=keep[0], keep_sequences=keep[1])
    assert (merged.states is not None) == keep[0]
    assert (merged.sequences is not None) == keep[1]


def test_parameter_shards_of_different_walks_are_refused():
    import dataclasses
    task = load_config("default")
    parts = [exact_param_shard(task, (i, 2)) for i in range(2)]
    parts[1].moments["policy"]["mass"] *= 1.5
    parts[1] = dataclasses.replace(parts[1], checksum=None)  # past its checksum: to the walk
    with pytest.raises(ShardError, match="did not walk the same tree"):
        merge(task, parts)


def test_only_the_last_parameter_shard_carries_the_records():
    """Shards before the last (what workers run) send their sums and their own columns'
    window arrays, and no per-state or per-response record; a merge whose last shard holds
    none of the records its run kept is refused, not returned without them."""
    from fisher_ref.engine.columns import column_count
    task = load_config("default")
    parts = [exact_param_shard(task, (i, 3),
                               options=EngineOptions(keep_states=True, keep_sequences=True))
             for i in range(3)]
    for p in parts[:-1]:
        assert p.states is None and p.sequences is None
        assert not np.any(p.grad_ad)
        width = column_count(p.columns, task.model.num_params)
        assert p.window_tables and all(v.shape[-1] == width for v in p.window_tables.values())
    assert parts[-1].states is not None and parts[-1].sequences is not None
    assert np.any(parts[-1].grad_ad)
    merge(task, parts)
    for field in ("states", "sequences"):
        bad = [parts[0], parts[1], parts[2]]
        bad[-1] = type(parts[2])(**{**vars(parts[2]), field: None, "checksum": None})
        with pytest.raises(ShardError, match="did not run as the last shard"):
            merge(task, bad)


@pytest.mark.parametrize("name, chunk, cache_bytes", [("context3", 2, 10_000),
                                                      ("default", 2, 40_000)])
def test_shards_numbering_windows_apart_keep_each_states_rows(name, chunk, cache_bytes):
    """A small window cache and small blocks make each parameter slice (whose width sets
    its cache's capacity, and so its blocks and the windows it computes ahead) number the
    windows in its own order: the merged per-state arrays still read each state's own
    window in every slice's columns, as one run does (tables matched by window)."""
    from fisher_ref import task_from_json
    from fisher_ref.engine.plan import Budgets
    task = load_config("default") if name == "default" else task_from_json(
        {"model": {"vocab_size": 3, "context": 3, "embed_dim": 2, "hidden": 3, "eos": True,
                   "init_seed": 4, "init_scale": 1.0},
         "prompts": [[1, 1], [2]], "max_len": 4, "reward": {"name": "count", "token": 1}})
    kw = dict(progress=False, chunk=chunk, budgets=Budgets(window_cache_bytes=cache_bytes),
              keep_states=True, keep_sequences=True)
    n = 3
    parts = [exact_param_shard(task, (i, n), **with_options(kw)) for i in range(n)]
    orders = {tuple(map(tuple, p.windows)) for p in parts}
    assert len(orders) > 1, "the slices numbered the windows alike: the case tests nothing"
    got, want = merge(task, parts), exact(task, **with_options(kw))
    # to rounding, on the scale of the largest per-state array (a state's E[xi | s] is 0
    # to rounding, far below the token Fisher)
    scale = max(np.abs(want.states[key]).max() for key in want.states)
    for key in want.states:
        assert np.allclose(got.states[key], want.states[key], rtol=1e-12, atol=1e-12 * scale), key


def test_a_slice_whose_tables_lack_their_windows_is_refused():
    """Tables that cannot be matched by window are an error that names the slice, not a
    silent misreading of the states' rows."""
    import dataclasses
    task = load_config("default")
    kw = dict(progress=False, keep_states=True, keep_sequences=True)
    parts = [exact_param_shard(task, (i, 2), **with_options(kw)) for i in range(2)]
    parts[0] = dataclasses.replace(parts[0], windows=None, checksum=None)
    with pytest.raises(ShardError, match=r"parameter shard 0 of 2 keeps its window tables"):
        merge(task, parts)
