"""Off-policy identities (docs/theory.md §3, sampler mu != policy p) on every case with a
sampler: centering at the sampler's mean restores every on-policy identity;
the raw score does not."""
import numpy as np
from autograd import grad

from cases import RTOL, expected_reward_fn, get_brute, get_result, get_task, record, rel


def _scale(stream, b, centered=True):
    """sqrt(max(E_mu[A^2], E_mu[R^2])) * max sqrt(F): size of the terms of E_mu[A h]."""
    A = b["R"] - stream.baseline
    m2 = max(b["Pmu"] @ A ** 2, b["Pmu"] @ b["R"] ** 2)
    return float(np.sqrt(m2) * np.sqrt(stream.sequence_fisher.max())) or 1.0


def test_centered_score_mean_is_zero_under_sampler(offcase):
    c, b = get_result(offcase).streams["centered"], get_brute(offcase)
    s = np.sqrt(c.sequence_fisher.max())
    assert record("offpolicy: centered score mean zero", offcase, rel(c.score_mean, 0, s)) <= RTOL
    assert rel(c.cond_score_max, 0, s) <= RTOL
    hc = b["xc"].sum(axis=1)  # (M, P)
    assert rel(b["Pmu"] @ hc, 0, s) <= RTOL


def test_raw_score_mean_is_sum_of_mean_shifts(offcase):
    r, b = get_result(offcase), get_brute(offcase)
    raw = r.streams["raw"]
    shift = np.einsum("nv,nvp->np", b["q"], b["scores"])  # (N, P) jbar_mu - jbar_p
    expected = b["reach_mu"] @ shift  # E_mu[sum_t b(s_t)]
    s = np.sqrt(raw.sequence_fisher.max())
    assert record("offpolicy: raw score mean = E_mu[sum jbar_mu - jbar_p]", offcase,
                  rel(raw.score_mean, expected, s)) <= RTOL
    assert rel(raw.score_mean, r.states["sampler_reach"] @ r.states["raw_score_mean"], s) <= RTOL
    assert np.abs(raw.score_mean).max() > 1e-6 * s  # not zero
    live = b["reach_mu"] > 0
    assert rel(raw.cond_score_max, np.abs(shift[live]).max(axis=0)) <= RTOL


def test_centered_cross_terms_vanish_raw_do_not(offcase):
    r, b = get_result(offcase), get_brute(offcase)
    c, raw = r.streams["centered"], r.streams["raw"]
    T = c.cross_terms.shape[0]
    off = ~np.eye(T, dtype=bool)
    assert record("offpolicy: centered cross terms vanish", offcase,
                  rel(c.cross_terms[off], 0, c.sequence_fisher.max())) <= RTOL
    assert np.abs(raw.cross_terms[off]).max() > 1e-8 * raw.sequence_fisher.max()
    C = np.einsum("m,mup,mtp->utp", b["Pmu"], b["xi"], b["xi"])
    assert rel(raw.cross_terms, C) <= RTOL


def test_sampler_fisher_is_token_sum(offcase):
    r, b = get_result(offcase), get_brute(offcase)
    c = r.streams["centered"]
    F = c.sequence_fisher
    assert record("offpolicy: F_mu = token sum (states)", offcase,
                  rel(F, c.token_fisher_sum)) <= RTOL
    assert record("offpolicy: F_mu = token sum (paths)", offcase,
                  rel(F, c.token_fisher_sum_paths)) <= RTOL
    hc = b["xc"].sum(axis=1)
    assert rel(F, b["Pmu"] @ hc ** 2) <= RTOL
    assert rel(F, r.states["sampler_reach"] @ r.states["sampler_token_fisher"]) <= RTOL
    assert abs(c.mass - 1) <= RTOL


def test_sampler_gradient_is_covariance_and_bound_holds(offcase):
    r, b = get_result(offcase), get_brute(offcase)
    c = r.streams["centered"]
    s = _scale(c, b)
    assert record("offpolicy: G_mu = Cov_mu", offcase, rel(c.gradient, c.covariance, s)) <= RTOL
    hc = b["xc"].sum(axis=1)
    assert rel(c.gradient, b["Pmu"] @ ((b["R"] - c.baseline)[:, None] * hc), s) <= RTOL
    assert (np.abs(c.gradient) <= c.bound + RTOL * s).all()
    assert (c.correlation <= 1 + RTOL).all()


def test_uncentered_gradient_moves_with_a_constant(offcase):
    r, b = get_result(offcase), get_brute(offcase)
    raw, c = r.streams["raw"], r.streams["centered"]
    h = b["xi"].sum(axis=1)
    for const in (1.0, -3.0):
        A = b["R"] - raw.baseline + const
        expected = b["Pmu"] @ (A[:, None] * h)
        assert rel(raw.gradient_with_constant(const), expected, _scale(raw, b) * 4) <= RTOL
        assert rel(c.gradient_with_constant(const), c.gradient, _scale(c, b) * 4) <= RTOL
    # the raw bound std(A) sqrt(E[h^2]) fails once |c E[h_i]| > bound_i + |G_i|
    i = int(np.argmax(np.abs(raw.score_mean) / np.sqrt(raw.sequence_fisher + 1e-300)))
    c_star = (raw.bound[i] + abs(raw.gradient[i])) / abs(raw.score_mean[i])
    const = 1.01 * c_star * np.sign(raw.score_mean[i])
    assert abs(raw.gradient_with_constant(const)[i]) > raw.bound[i]
    assert (np.abs(c.gradient_with_constant(const)) <= c.bound + RTOL * _scale(c, b)).all()


def test_topk_centering_reaches_full_centering_at_k_equal_V(offcase):
    r, b = get_result(offcase), get_brute(offcase)
    V = get_task(offcase).model.vocab_size
    c, full = r.streams["centered"], r.streams[f"top{V}"]
    for name in ("score_mean", "sequence_fisher", "cross_terms", "gradient", "token_fisher_sum"):
        assert rel(getattr(full, name), getattr(c, name)) == 0.0
    # each top-k stream's conditional score mean is jbar_mu - jbar_topk, by hand
    live = b["reach_mu"] > 0
    for k in range(1, V + 1):
        shifts = []
        for q, S in zip(b["q"][live], b["scores"][live]):
            keep = np.argsort(-q, kind="stable")[:k]
            qk = np.zeros(V)
            qk[keep] = q[keep] / q[keep].sum()
            shifts.append((q - qk) @ S)
        expect = np.abs(np.array(shifts)).max(axis=0)
        s = np.sqrt(c.sequence_fisher.max())
        assert rel(r.streams[f"top{k}"].cond_score_max, expect, s) <= RTOL
    assert r.streams["top1"].cond_score_max.max() > 1e-6 * np.sqrt(c.sequence_fisher.max())


def test_importance_weighted_raw_gradient_is_policy_gradient(offcase):
    """E_mu[rho A h] against the brute force's own autograd of E_p[R] (not the policy
    stream's E[A h], which sums the same products P(y) A(y) h(y))."""
    task, r, b = get_task(offcase), get_result(offcase), get_brute(offcase)
    raw = r.streams["raw"]
    A2 = max(b["P"] @ b["R"] ** 2, b["Pmu"] @ (b["R"] - raw.baseline) ** 2)
    s = float(np.sqrt(A2) * np.sqrt(r.sequence_fisher.max()))
    g_ind = grad(expected_reward_fn(task, b))(task.theta)  # (P,)
    assert record("offpolicy: importance-weighted gradient = on-policy", offcase,
                  rel(raw.importance_gradient, g_ind, s)) <= RTOL
