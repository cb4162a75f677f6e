"""Evaluating a loss on a chunk of batches: the vectorised and the one-at-a-time paths
give the same coefficients, and what would make a sum silently wrong is refused."""
import numpy as np
import pytest
import torch

from fisher_ref.estimators.batch import group_arrays
from fisher_ref.estimators.evaluation import Coefficients, check_finite
from fisher_ref.estimators.groups import groups, response_table

from .brute import tiny_task


def _chunk(G=2):
    task = tiny_task()
    table = response_table(task, 2 ** 30)
    pr = table.prompts[0]
    idx, _ = next(iter(groups(len(pr), G, False, chunk=64)))
    return group_arrays(table, pr, idx), pr.prompt


def reinforce(b):
    return -(b.rewards * (b.logp * b.mask).sum(1)).mean()


def test_vmap_and_loop_give_the_same_coefficients():
    a, prompt = _chunk()
    vm = Coefficients(reinforce, vectorize=True)
    lp = Coefficients(reinforce, vectorize=False)
    C1, C2 = vm(a, prompt), lp(a, prompt)
    assert vm.evaluation == "vmap" and lp.evaluation == "loop"
    assert np.abs(C1 - C2).max() <= 1e-12 * np.abs(C1).max()
    assert vm.nonzero and lp.nonzero


def test_a_loss_without_a_path_to_logp_is_refused_after_the_probe():
    a, prompt = _chunk()
    c = Coefficients(lambda b: reinforce(b).detach(), vectorize=True)
    assert not c(a, prompt).any()
    with pytest.raises(ValueError, match="does not depend on the log-probabilities"):
        c.check_connected()


def test_a_nan_coefficient_is_refused_naming_the_responses():
    a, prompt = _chunk()
    C = np.zeros(a["logp_all"].shape)
    C[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        check_finite(a, C, prompt)


def test_an_exception_of_the_loss_names_its_batch():
    a, prompt = _chunk()

    def broken(b):
        raise KeyError("no such column")
    with pytest.raises(KeyError, match="response"):
        Coefficients(broken, vectorize=False)(a, prompt)
