"""Exact policy-gradient steps and bf16 rounding (fisher_ref.teaching.training)."""
import doctest

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the torch extra is needed (CI installs it)")

import fisher_ref.teaching.training as training
from fisher_ref import exact, load_config
from fisher_ref.teaching.training import bf16_changed, bf16_round, policy_gradient
from fisher_ref.checks.tolerances import rel_err

RTOL = 1e-10       # exact float64 identities
ADAM_RTOL = 1e-12  # same float64 arithmetic as torch.optim.Adam, different order


def torch_bf16(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def test_bf16_round_matches_torch_on_random_values():
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.normal(size=20000),
        rng.normal(scale=1e-30, size=2000),                      # tiny and subnormal
        rng.normal(scale=1e30, size=2000),                       # large
        np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 3.3895e38, -3.3895e38]),
    ]).astype(np.float32)
    assert np.array_equal(bf16_round(x), torch_bf16(x))


def test_bf16_round_ties_go_to_even():
    bits = np.random.default_rng(1).integers(0x3F800000, 0x40000000, size=5000, dtype=np.uint32)
    ties = ((bits & 0xFFFF0000) | 0x8000).astype(np.uint32).view(np.float32)  # exactly halfway
    assert np.array_equal(bf16_round(ties), torch_bf16(ties))
    assert np.all((bf16_round(ties).view(np.uint32) >> 16) & 1 == 0)  # kept bits end even


def test_bf16_round_keeps_nan_and_is_idempotent():
    x = np.array([np.nan, 1.2345, -7.5e-3], dtype=np.float32)
    y = bf16_round(x)
    assert np.isnan(y[0]) and y.dtype == np.float32
    assert np.array_equal(bf16_round(y[1:]), y[1:])


def test_bf16_changed_counts_only_visible_changes():
    before = np.array([1.0, 1.0, 0.001, 100.0])
    after = before + np.array([1e-3, 1e-2, 1e-3, 0.1])
    assert bf16_changed(before, after).tolist() == [False, True, True, False]
    with pytest.raises(ValueError, match="differ in shape"):
        bf16_changed(np.zeros(3), np.zeros(4))


@pytest.fixture(scope="module")
def task():
    return load_config("default")


def test_sgd_step_is_theta_plus_lr_times_exact_gradient(task):
    tr = policy_gradient(task, steps=2, lr=0.05, optimizer="sgd")
    r0 = exact(task, progress=False)
    assert rel_err(tr.gradients[0], r0.gradient_autodiff) <= RTOL
    assert np.array_equal(tr.thetas[1], task.theta + 0.05 * tr.gradients[0])
    r1 = exact(task.with_(theta=tr.thetas[1]), progress=False)
    assert rel_err(tr.gradients[1], r1.gradient) <= RTOL
    assert rel_err(tr.fishers[1], r1.sequence_fisher) <= RTOL
    assert abs(tr.expected_rewards[1] - r1.expected_reward) <= RTOL * abs(r1.expected_reward)
    assert tr.thetas.shape == (3, task.model.num_params) and tr.expected_rewards.shape == (3,)


def test_small_steps_increase_the_expected_reward(task):
    for opt, lr in (("sgd", 0.05), ("adam", 1e-3)):
        tr = policy_gradient(task, steps=3, lr=lr, optimizer=opt)
        assert np.all(np.diff(tr.expected_rewards) > 0), opt


def test_adam_matches_torch_adam(task):
    """Same gradients through torch.optim.Adam (maximize=True, float64) give the same path."""
    lr, betas, eps = 1e-2, (0.9, 0.999), 1e-8
    tr = policy_gradient(task, steps=4, lr=lr, optimizer="adam", betas=betas, eps=eps)
    p = torch.tensor(task.theta.copy(), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([p], lr=lr, betas=betas, eps=eps, maximize=True)
    for k, G in enumerate(tr.gradients):
        p.grad = torch.from_numpy(G.copy())
        opt.step()
        assert rel_err(p.detach().numpy(), tr.thetas[k + 1]) <= ADAM_RTOL, k


def test_adam_first_step_moves_by_about_lr(task):
    tr = policy_gradient(task, steps=1, lr=1e-3, optimizer="adam")
    G = tr.gradients[0]
    step = tr.thetas[1] - tr.thetas[0]
    big = np.abs(G) > 1e-4
    assert np.allclose(step[big], 1e-3 * np.sign(G[big]), rtol=1e-3)
    assert np.all(step[G == 0] == 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=1, lr=0.1, optimizer="rmsprop"), "optimizer must be one of"),
    (dict(steps=0, lr=0.1), "steps must be an integer >= 1"),
    (dict(steps=1.5, lr=0.1), "steps must be an integer >= 1"),
    (dict(steps=1, lr=-1.0), "lr must be a positive finite number"),
    (dict(steps=1, lr=float("nan")), "lr must be a positive finite number"),
    (dict(steps=1, lr=0.1, optimizer="adam", betas=(1.0, 0.9)), "betas must lie in"),
])
def test_bad_arguments_are_named(task, kwargs, match):
    with pytest.raises(ValueError, match=match):
        policy_gradient(task, **kwargs)


def test_training_docstring_examples():
    res = doctest.testmod(training, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0
