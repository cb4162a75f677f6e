"""enumerated_gradients: every batch's gradient and probability, whose moments are
expected_loss_gradient's and the independent brute force's (tests/estimators/brute.py)."""
import numpy as np
import pytest

import cases
from fisher_ref.engine.plan import EnumerationTooLarge
from fisher_ref.estimators import enumerated_gradients, expected_loss_gradient

from .brute import brute_force, tiny_task
from .test_gradient import REF, STALE, grpo_token_mean, reinforce


def _moments(g, p):
    mean = p @ g
    d = g - mean
    return mean, (p[:, None] * d).T @ d


@pytest.mark.parametrize("G,symmetric,K", [(2, False, 1), (3, True, 1), (1, False, 2),
                                           (2, True, 2)])
def test_moments_are_the_exact_ones(G, symmetric, K):
    task = tiny_task(STALE, REF, one_prompt=G == 3)
    g, p = enumerated_gradients(task, grpo_token_mean, G, symmetric, groups_per_batch=K)
    lg = expected_loss_gradient(task, grpo_token_mean, G, symmetric, groups_per_batch=K,
                                covariance=True)
    assert len(p) == len(g) == lg.n_batches and abs(p.sum() - 1) <= 1e-12
    mean, cov = _moments(g, p)
    assert cases.rel(mean, lg.mean) <= cases.RTOL
    assert cases.rel(cov, lg.covariance) <= cases.RTOL


def test_rows_are_the_brute_forces_groups():
    """Ordered groups: the same rows as the brute force's, up to order."""
    task = tiny_task(STALE, REF)
    g, p = enumerated_gradients(task, grpo_token_mean, 2)
    bg, bw = brute_force(task, grpo_token_mean, 2, per_group=True)
    def order(rows, probs):  # rounded keys: rounding must not reorder equal rows
        return np.lexsort(np.c_[np.round(rows, 8), np.round(probs, 12)].T[::-1])
    order, border = order(g, p), order(bg, bw)
    assert cases.rel(g[order], bg[border]) <= cases.RTOL
    assert cases.rel(p[order], bw[border]) <= cases.RTOL


def test_too_many_rows_are_refused():
    with pytest.raises(EnumerationTooLarge, match=r"enumerated_gradients refused: .*max_bytes"):
        enumerated_gradients(tiny_task(), reinforce, 2, max_bytes=10_000)
