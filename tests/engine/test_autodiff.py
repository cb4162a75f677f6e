"""The autodiff route to the policy gradient (fisher_ref.engine.autodiff): the derivative
of the exact expected reward, held to central differences of it."""
from types import SimpleNamespace

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


def test_parts_gradient_equals_the_masked_route_on_ragged_parts():
    """parts_gradient (the fast engine's: each part the children of some parents, a
    parent's slots given once) against reward_gradient (every response written out, slots
    past its end dropped by a mask) on the same responses: parents of 0..2 tokens, one or
    several last tokens, an empty part, and a token whose log-probability is -inf (its
    responses weigh 0, with no NaN). Equal to rounding: the same sums."""
    from fisher_ref.engine.autodiff import parts_gradient, reward_gradient
    task = load_config("default")
    V, rng = task.model.vocab_size, np.random.default_rng(3)
    U = 6
    Wu = rng.integers(0, V, size=(U, task.model.context))
    parts = [(rng.integers(0, U, size=(B, d)), rng.integers(0, V, size=(B, d)),
              rng.integers(0, U, size=B), rng.choice(V, size=k, replace=False),
              rng.random(B), rng.normal(size=(B, k)))
             for B, d, k in ((5, 0, 1), (0, 2, 3), (7, 2, V), (4, 1, 2))]
    T = 1 + max(p[0].shape[1] for p in parts)
    win, nxt, live, w, R = [], [], [], [], []
    for pw, pn, wl, K, wt, r in parts:  # every response written out, padded to T slots
        B, d, k = len(wl), pw.shape[1], len(K)
        rep = lambda x: np.repeat(x, k, axis=0)  # noqa: E731
        pad = np.zeros((B * k, T - d - 1), dtype=int)
        win.append(np.concatenate([rep(pw), rep(wl)[:, None], pad], axis=1))
        nxt.append(np.concatenate([rep(pn), np.tile(K, B)[:, None], pad], axis=1))
        live.append(np.broadcast_to(np.arange(T) <= d, (B * k, T)))
        w.append(rep(wt))
        R.append(r.ravel())
    win, nxt, live, w, R = map(np.concatenate, (win, nxt, live, w, R))
    want = reward_gradient(task, task.theta, Wu, win, nxt, live, w, R)
    got = parts_gradient(task, task.theta, Wu, parts)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-15 * np.abs(want).max())

    class Masked:  # the default model with token 1 masked: its log-probability is -inf
        vocab_size = V

        def logits(self, theta, windows):
            return task.model.logits(theta, windows) + np.where(np.arange(V) == 1, -np.inf, 0.0)
    masked = SimpleNamespace(model=Masked())  # all either route reads of a task
    assert (nxt[live] == 1).any()  # some responses take the masked token
    g = parts_gradient(masked, task.theta, Wu, parts)
    assert np.isfinite(g).all()
    assert np.allclose(g, reward_gradient(masked, task.theta, Wu, win, nxt, live, w, R),
                       rtol=1e-12, atol=1e-15 * max(np.abs(g).max(), 1.0))
