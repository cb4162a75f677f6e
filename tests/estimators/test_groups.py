"""Every response and every group of responses (fisher_ref.estimators.groups): the
responses are the brute-force set in lexicographic order, the groups cover every ordered
tuple once or every multiset with its multiplicity, and the guards say how many groups or
bytes they refused."""
import itertools
import math
from collections import Counter

import numpy as np
import pytest

import cases
from fisher_ref.engine.plan import EnumerationTooLarge
from fisher_ref.estimators import expected_loss_gradient
from fisher_ref.estimators.groups import all_responses, count_groups, groups

from .brute import tiny_task
from .test_gradient import reinforce


@pytest.mark.parametrize("V, T, eos", [(3, 3, True), (2, 4, False), (4, 1, True), (2, 3, True)])
def test_all_responses_are_the_brute_force_set_in_lexicographic_order(V, T, eos):
    tok, n = all_responses(V, T, eos)  # (M, T), (M,)
    got = [tuple(row[:k]) for row, k in zip(tok.tolist(), n.tolist())]
    assert len(set(got)) == len(got) and set(got) == set(cases.all_responses(V, T, eos))
    assert (tok[np.arange(T)[None, :] >= n[:, None]] == -1).all()  # -1 past each end
    assert (tok[np.arange(T)[None, :] < n[:, None]] >= 0).all()
    assert tok.tolist() == sorted(tok.tolist())  # lexicographic, an ended response first


@pytest.mark.parametrize("M, G, chunk", [(3, 2, 4), (4, 3, 5), (5, 1, 2), (7, 3, 1)])
def test_groups_cover_every_tuple_once_and_every_multiset_with_its_multiplicity(M, G, chunk):
    parts = list(groups(M, G, chunk=chunk))
    assert all(len(i) <= chunk and np.all(m == 1) for i, m in parts)
    ordered = [tuple(r) for i, _ in parts for r in i.tolist()]
    assert ordered == list(itertools.product(range(M), repeat=G)) == sorted(ordered)
    assert len(ordered) == count_groups(M, G)
    parts = list(groups(M, G, symmetric=True, chunk=chunk))
    multisets = {tuple(r): float(m) for i, mult in parts for r, m in zip(i.tolist(), mult)}
    assert len(multisets) == count_groups(M, G, symmetric=True) == math.comb(M + G - 1, G)
    assert multisets == dict(Counter(tuple(sorted(t)) for t in ordered))


def test_group_count_guard_says_how_many():
    task = tiny_task()
    with pytest.raises(EnumerationTooLarge, match="98 groups"):  # 2 prompts x 7^2
        expected_loss_gradient(task, reinforce, group_size=2, max_groups=50)


def test_score_memory_guard_says_how_much():
    with pytest.raises(EnumerationTooLarge, match="max_bytes"):
        expected_loss_gradient(tiny_task(), reinforce, max_bytes=1000)
