"""The memory of a Monte Carlo run (fisher_ref.monte_carlo.memory): the closed-form
estimate is the documented formula and bounds the peak tracemalloc traces, and
check_mc_size refuses past the limit, naming an n that fits (or saying none does)."""
import re
import tracemalloc

import numpy as np
import pytest

from fisher_ref import load_config
from fisher_ref.monte_carlo.memory import check_mc_size, mc_bytes
from fisher_ref.monte_carlo.sampling import estimate


def documented(task, n, S, values):
    """mc_bytes' docstring formula, written out again."""
    m = task.model
    T, P, V, k = task.max_len, m.num_params, m.vocab_size, m.context
    L = max(len(p) for p in task.prompts) + T
    draws = 8 * n * (2 * L + k + T + 8 + 3 * V + L * (P // V) + L * L)
    est = 8 * n * (2 * S * T * P + (4 * S + 8) * P + T * (L + 4 * k + 8) + 2 * L) + 32 * P * V
    return max(draws, est) if values else draws


@pytest.mark.parametrize("name", ["default", "offpolicy_stale", "gpt2_small"])
def test_the_estimate_is_the_documented_formula(name):
    task = load_config(name)
    for n in (1, 1000, 10 ** 30):
        for use_sampler in ((False, True) if task.sampler is not None else (False,)):
            S = 2 if use_sampler else 1
            assert mc_bytes(task, n, use_sampler) == documented(task, n, S, True)
            assert mc_bytes(task, n, use_sampler, values=False) == documented(task, n, S, False)


@pytest.mark.parametrize("name, n", [("default", 4000), ("offpolicy_stale", 3000)])
def test_the_estimate_bounds_the_traced_peak(name, n):
    task = load_config(name)
    use_sampler = task.sampler is not None
    tracemalloc.start()
    try:
        estimate(task, n, np.random.default_rng(0), use_sampler=use_sampler)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= mc_bytes(task, n, use_sampler), (peak, mc_bytes(task, n, use_sampler))


def test_check_mc_size_refuses_past_the_limit_and_names_what_fits():
    task = load_config("default")
    limit = mc_bytes(task, 1000, False) + 1
    check_mc_size(task, 1000, False, max_bytes=limit)
    with pytest.raises(ValueError, match="Monte Carlo refused: n=5,000 samples") as info:
        check_mc_size(task, 5000, False, max_bytes=limit)
    fit = int(re.search(r"use n <= ([\d,]+)", str(info.value)).group(1).replace(",", ""))
    assert 1 <= fit < 5000
    check_mc_size(task, fit, False, max_bytes=limit)  # the n it names does fit
    with pytest.raises(ValueError, match="no n fits"):
        check_mc_size(task, 1, False, max_bytes=mc_bytes(task, 1, False) - 1)
    with pytest.raises(ValueError, match="max_bytes"):
        check_mc_size(task, 1, False, max_bytes=-1)
