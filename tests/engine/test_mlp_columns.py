"""Which parameters of the window MLP a run holds (fisher_ref.engine.mlp_columns): the
blocks tile the flat layout, a set cut between hidden units refuses what lies outside, and
the planned parameter shards hold every parameter once, each within reach of its share of
the fitted work (hypothesis, derandomized)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fisher_ref.engine.mlp_columns import UnitColumns, mlp_blocks, mlp_param_shards
from fisher_ref.engine.plan import LAST_SHARE, WORK
from fisher_ref.models.base import ModelSpec
from fisher_ref.models.mlp import MLPModel


def test_blocks_tile_the_parameters():
    spec = ModelSpec(vocab_size=5, context=3, embed_dim=2, hidden=4)
    blocks = mlp_blocks(spec)
    assert [b[0] for b in blocks] == ["E", "W1", "b1", "W2", "b2"]
    assert blocks[0][1] == 0 and all(a[2] == b[1] for a, b in zip(blocks, blocks[1:]))
    assert blocks[-1][2] == MLPModel(spec).num_params
    sizes = {name: stop - start for name, start, stop in blocks}
    assert {name: MLPModel(spec).unpack(np.zeros(blocks[-1][2]))[name].size
            for name in sizes} == sizes


def test_unit_columns_refuse_units_or_parameters_outside():
    spec = ModelSpec(vocab_size=3, context=2, embed_dim=2, hidden=4)
    with pytest.raises(ValueError, match="hidden units 3..2"):
        UnitColumns(spec, 0, 5, 3, 2)
    with pytest.raises(ValueError, match="hidden units 0..5"):
        UnitColumns(spec, 0, 5, 0, 5)
    P = mlp_blocks(spec, 2)[-1][2]
    with pytest.raises(ValueError, match=f"parameters 4..4 .* the {P} of the layout"):
        UnitColumns(spec, 4, 4, 0, 2)
    with pytest.raises(ValueError, match=f"parameters 0..{P + 1}"):
        UnitColumns(spec, 0, P + 1, 0, 2)


def _work(spec, index):
    """The work :data:`WORK` gives the parameters ``index`` (per parameter of each family)."""
    at = {name: (start, stop) for name, start, stop in mlp_blocks(spec)}
    index = np.asarray(index)
    per = np.where(index < at["E"][1], WORK["E"], np.where(index < at["b1"][1], WORK["G"],
                                                            WORK["D"]))
    return per.sum()


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(V=st.integers(2, 20), k=st.integers(1, 3), d=st.integers(1, 9),
       H=st.integers(1, 160), n=st.integers(1, 9))
def test_planned_parameter_shards_hold_each_parameter_once_with_their_share(V, k, d, H, n):
    """mlp_param_shards: n non-empty shards (None only past H + 2 shards) that together
    hold every parameter once, each
    within reach of its share of the work (the last LAST_SHARE of the others'): a cut
    moves at most a quarter of a shard's work (to a family's end) plus half a hidden
    unit's (between units), and a shard has two cuts."""
    spec = ModelSpec(vocab_size=V, context=k, embed_dim=d, hidden=H)
    P = MLPModel(spec).num_params
    shards = mlp_param_shards(spec, n)
    if shards is None:  # only with more shards than hidden units and two families
        assert n > H + 2  # (the caller then cuts consecutive slices instead)
        return
    assert len(shards) == n
    index = [np.arange(P)[s] if isinstance(s, slice) else s.index for s in shards]
    assert all(len(i) for i in index)
    assert np.array_equal(np.sort(np.concatenate(index)), np.arange(P))
    total = _work(spec, np.arange(P))
    shares = np.array([1.0] * (n - 1) + [LAST_SHARE])
    unit = (k * d + 1) * WORK["G"]
    reach = 2 * (total / (4 * n) + max(unit, WORK["E"], WORK["D"]) / 2) + 1e-9 * total
    for i, share in zip(index, shares / shares.sum()):
        assert abs(_work(spec, i) - share * total) <= reach
    for s in shards:  # a UnitColumns holds some, never all, of the units
        if isinstance(s, UnitColumns):
            assert 0 < s.h1 - s.h0 < H
