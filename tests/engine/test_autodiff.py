"""The autodiff route to the policy gradient (fisher_ref.engine.autodiff): the derivative
of the exact expected reward, held to central differences of it."""
import numpy as np
from autograd import grad

from cases import RTOL, expected_reward_fn, get_brute, get_result, get_task, rel
from fisher_ref import exact, load_config
from tests.engine.test_identities_exact import natural_gradient_scale


def test_autodiff_gradient_is_the_derivative_of_the_expected_reward():
    """gradient_autodiff_i against (E_{theta + h e_i}[R] - E_{theta - h e_i}[R]) / 2h for a
    few coordinates: central differences err by O(h^2) and O(eps / h), about 1e-9 here."""
    task = load_config("default")
    g = exact(task, progress=False).gradient_autodiff
    rng = np.random.default_rng(0)
    h = 1e-5
    for i in rng.choice(task.model.num_params, 6, replace=False):
        e = np.zeros(task.model.num_params)
        e[i] = h
        up = exact(task.with_(theta=task.theta + e), progress=False).expected_reward
        down = exact(task.with_(theta=task.theta - e), progress=False).expected_reward
        fd = (up - down) / (2 * h)
        assert abs(g[i] - fd) <= 1e-7 * max(1.0, np.abs(g).max()), (i, g[i], fd)


def test_autodiff_gradient_is_finite_when_eos_is_masked():
    """Regression: slots past a response's end repeat its last log-probability; a
    response ending in a masked EOS has -inf there, and 0 * -inf made the autodiff
    gradient NaN (and verify fail). The case holds such responses; the gradient must be
    finite and equal the brute force's own autograd of E[R]."""
    task, r, b = get_task("masked_eos"), get_result("masked_eos"), get_brute("masked_eos")
    ends_masked = [P == 0 and len(y) < task.max_len and y[-1] == 0
                   for P, y in zip(b["P"], b["response"])]
    assert any(ends_masked)  # the case exercises the bug
    assert np.isfinite(r.gradient_autodiff).all()
    g_ind = grad(expected_reward_fn(task, b))(task.theta)
    assert rel(r.gradient_autodiff, g_ind, natural_gradient_scale(r, b)) <= RTOL
