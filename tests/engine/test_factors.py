"""Score rows of the window MLP held as factors (fisher_ref.engine.factors): a weighted sum
over parents of outer-product rows, by matrix products, equals the same sum of the rows
written out (1e-12 relative), over every parent and per group; the padding of groups;
the bias entry of a first factor. tests/engine/test_factored.py holds the last level of
whole runs summed with them to the dense route."""
import numpy as np
import pytest

from fisher_ref.engine.factors import Layout, Rows, augment, groups, gsum, wsum
from fisher_ref.engine.mlp_columns import mlp_blocks
from fisher_ref.models.base import ModelSpec

RTOL = 1e-12
SPEC = ModelSpec(vocab_size=4, context=2, embed_dim=2, hidden=3)


def test_augment_holds_the_bias_row_after_the_weight_rows():
    a, b = np.array([2.0, 3.0]), np.array([5.0, 7.0, 11.0])
    block = np.outer(augment(a), b)  # (m + 1, l): the weight block, then its bias
    assert np.array_equal(block[:2], np.outer(a, b)) and np.array_equal(block[2], b)


def test_groups_pad_each_group_with_its_first_row():
    idx, valid = groups(np.array([0, 2, 3]), 6)  # groups of 2, 1 and 3 parents
    assert np.array_equal(valid, [[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    assert np.array_equal(idx, [[0, 1, 0], [2, 2, 2], [3, 4, 5]])


def _rows(rng, n, k):
    """Random rows of ``W1`` and ``W2`` with their biases, as factors and written out."""
    blocks = {name: (start, stop) for name, start, stop in mlp_blocks(SPEC)}
    lo = blocks["E"][1]  # the run's parameters: every one past E
    lay = Layout(SPEC, slice(lo, SPEC.num_params))
    H, V, kd = SPEC.hidden, SPEC.vocab_size, SPEC.context * SPEC.embed_dim
    a1, b1 = augment(rng.normal(size=(n, k, kd))), rng.normal(size=(n, k, H))
    a2, b2 = augment(rng.normal(size=(n, k, H))), rng.normal(size=(n, k, V))
    dense = np.zeros((n, k, SPEC.num_params))
    for (a, b), (first, last) in (((a1, b1), ("W1", "b1")), ((a2, b2), ("W2", "b2"))):
        outer = np.einsum("nkm,nkl->nkml", a, b).reshape(n, k, -1)  # the block, then its bias
        dense[..., blocks[first][0]:blocks[last][1]] = outer
    rows = Rows(lay.pair("W1", a1, b1), lay.pair("W2", a2, b2), None)
    return lay, rows, dense[..., lo:]


@pytest.mark.parametrize("n, k", [(1, 1), (3, 4), (5, 2)])
def test_weighted_sums_of_factored_rows_equal_the_rows_written_out(n, k):
    rng = np.random.default_rng(n * 10 + k)
    lay, rows, dense = _rows(rng, n, k)
    w = rng.normal(size=(n, k))
    want_all = np.einsum("nk,nkp->p", w, dense)  # (P,)
    want_groups = np.einsum("nk,nkp->np", w, dense)  # (n, P)
    got_all, got_groups = wsum(lay, w, rows), gsum(lay, w, rows)
    assert np.allclose(got_all, want_all, rtol=RTOL, atol=RTOL * np.abs(want_all).max())
    assert np.allclose(got_groups, want_groups, rtol=RTOL,
                       atol=RTOL * np.abs(want_groups).max())


def test_a_product_of_factored_rows_is_the_product_of_the_rows():
    rng = np.random.default_rng(7)
    lay, x, dx = _rows(rng, 2, 3)
    _, y, dy = _rows(rng, 2, 3)
    w = rng.normal(size=(2, 3))
    want = np.einsum("nk,nkp->p", w, dx * dy)
    for prod in (x * y, x.lazy(y)):
        got = wsum(lay, w, prod)
        assert np.allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())
