"""The parameters a run sums over (fisher_ref.engine.columns): consecutive slices as even
as whole parameters allow, and the index and count of a slice or of a set cut between the
MLP's hidden units."""
import numpy as np

from fisher_ref.engine.columns import column_count, column_index, param_columns
from fisher_ref.engine.mlp_columns import UnitColumns, mlp_param_shards
from fisher_ref.models.base import ModelSpec


def test_param_columns_tile_the_parameters_evenly():
    for P, n in ((10, 3), (7, 7), (4376, 2), (5, 1)):
        cols = param_columns(P, n)
        assert cols[0].start == 0 and cols[-1].stop == P
        assert all(a.stop == b.start for a, b in zip(cols, cols[1:]))
        sizes = [c.stop - c.start for c in cols]
        assert max(sizes) - min(sizes) <= 1


def test_index_and_count_of_a_slice_and_of_unit_columns():
    P = 10
    assert np.array_equal(column_index(slice(3, 7), P), [3, 4, 5, 6])
    assert column_count(slice(3, 7), P) == 4 == len(column_index(slice(3, 7), P))
    spec = ModelSpec(vocab_size=3, context=2, embed_dim=2, hidden=4)
    shards = mlp_param_shards(spec, 2)
    units = [s for s in shards if isinstance(s, UnitColumns)]
    assert units, "the planner cut no shard between hidden units: the case tests nothing"
    P = spec.num_params
    index = [column_index(s, P) for s in shards]
    for s, i in zip(shards, index):
        assert column_count(s, P) == len(i)
    assert np.array_equal(np.sort(np.concatenate(index)), np.arange(P))  # each once
