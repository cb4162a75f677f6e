"""Merged: the chunk-by-chunk (Chan) mean, variance and co-moment equal the one-pass
weighted moments of all rows at 1e-10, whatever the chunking; Collected keeps every row."""
import numpy as np
import pytest

import cases
from fisher_ref.estimators.moments import Collected, Merged


@pytest.mark.parametrize("sizes", [[40], [1, 39], [7, 0, 13, 20], [5] * 8])
def test_merged_chunks_are_the_one_pass_moments(sizes):
    rng = np.random.default_rng(len(sizes))
    w = rng.random(40) ** 3  # (n,) uneven weights
    g = rng.normal(size=(40, 6)) * [1, 10, 0.1, 1, 1, 3] + 5  # (n, P), offset mean
    acc, col, at = Merged(6, covariance=True), Collected(), 0
    for n in sizes:
        acc.add(w[at:at + n], g[at:at + n].copy())
        col.add(w[at:at + n], g[at:at + n])
        at += n
    W = w.sum()
    mean = w @ g / W
    d = g - mean
    cov = (w[:, None] * d).T @ d / W
    assert cases.rel(acc.mean, mean) <= cases.RTOL
    assert cases.rel(acc.M2 / acc.W, np.diag(cov)) <= cases.RTOL
    assert cases.rel(acc.covariance, cov) <= cases.RTOL
    assert np.array_equal(acc.covariance, acc.covariance.T)
    rows, probs = col.arrays(6)
    assert np.array_equal(rows, g) and np.array_equal(probs, w)


def test_no_covariance_unless_asked():
    acc = Merged(3)
    acc.add(np.ones(2), np.ones((2, 3)))
    assert acc.covariance is None and acc.C is None
    assert Collected().arrays(3)[0].shape == (0, 3)
