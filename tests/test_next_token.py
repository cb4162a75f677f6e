"""The checked next-token distributions both exact engines read (fisher_ref.next_token):
softmax of the logits of the policy and the sampler, and every refusal names its problem."""
from types import SimpleNamespace

import numpy as np
import pytest

from fisher_ref import FunctionModel, LogitsSampler, load_config
from fisher_ref.next_token import (check_logits, check_support, checked_sensitivities,
                                   model_probs)


def test_probabilities_are_the_softmax_of_the_logits():
    task = load_config("offpolicy_temperature")
    W = task.model.windows(np.array([[1, 2], [3, -1]]), np.array([2, 1]))  # (2, k)
    p, q = model_probs(task, task.theta, W)
    z = task.model.logits(task.theta, W)  # (2, V)
    np.testing.assert_allclose(p, np.exp(z) / np.exp(z).sum(axis=1, keepdims=True), rtol=1e-14)
    zq = task.sampler.logits(task.model, task.theta, W)
    np.testing.assert_allclose(q, np.exp(zq) / np.exp(zq).sum(axis=1, keepdims=True),
                               rtol=1e-14)
    on = load_config("default")
    p, q = model_probs(on, on.theta, W)
    assert q is p  # on-policy: the sampler is the policy


def _task(logits, sampler=None):
    base = load_config("default")
    model = FunctionModel(logits, base.model.num_params, base.model.vocab_size,
                          base.model.context, eos=True)
    return base.with_(model=model, sampler=sampler)


@pytest.mark.parametrize("logits, message", [
    (lambda th, w: np.full((w.shape[0], 5), np.nan), "model returned NaN or \\+inf logits"),
    (lambda th, w: np.full((w.shape[0], 5), -np.inf), "logits are all -inf"),
    (lambda th, w: np.zeros((w.shape[0], 4)), "model returned logits of shape \\(2, 4\\)"),
])
def test_bad_model_logits_are_refused_by_name(logits, message):
    task, W = _task(logits), np.zeros((2, 2), dtype=np.int64)
    with pytest.raises(ValueError, match=message):
        model_probs(task, task.theta, W)


def test_bad_sampler_logits_are_refused_by_name():
    task = _task(lambda th, w: np.zeros((w.shape[0], 5)),
                 LogitsSampler(lambda w: np.full((w.shape[0], 5), np.inf)))
    with pytest.raises(ValueError, match="sampler returned NaN, \\+inf or all -inf"):
        model_probs(task, task.theta, np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="sampler returned logits of shape"):
        check_logits(np.zeros((2, 3)), np.zeros((2, 2)), 5, "sampler")


def test_a_token_the_sampler_never_draws_is_named_with_its_state():
    states = SimpleNamespace(rp=np.array([0.5, 0.5]), prompt=np.array([0, 1]),
                             tokens=np.array([[1, 2, -1], [3, 4, 1]]), length=np.array([2, 3]))
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    q = np.array([[0.5, 0.5], [1.0, 0.0]])
    with pytest.raises(ValueError, match=r"probability 0 to token 1 at state \[3, 4, 1\] "
                                         r"\(prompt 1\)"):
        check_support(states, p, q)
    states.rp = np.array([0.5, 0.0])  # a state the policy never reaches: nothing to weight
    check_support(states, p, q)


def test_sensitivities_must_be_finite():
    task = load_config("default")
    W = np.zeros((1, task.model.context), dtype=np.int64)
    assert checked_sensitivities(task, W).shape == (1, task.model.num_params, 5)
    theta = task.theta.copy()
    theta[0] = np.inf  # a Task refuses it; the check stands behind any model and theta
    with pytest.raises(ValueError, match="non-finite logit sensitivities"), \
            np.errstate(invalid="ignore", over="ignore"):
        checked_sensitivities(SimpleNamespace(model=task.model, theta=theta), W)
