"""One stream's running sums (fisher_ref.engine.moments): the reward spread merged
without cancellation or underflow, the finished quantities against sums formed here."""
import numpy as np

from cases import RTOL, rel
from fisher_ref import exact, load_config
from fisher_ref.engine.moments import Moments, finish_stream, importance_weighted


def test_baseline_mean_is_exact_mean_reward():
    task = load_config("weighted_prompts")
    r = exact(task, progress=False)
    s = r.sequences
    assert abs(r.baseline - s["prob"] @ s["reward"]) <= RTOL * r.baseline
    assert abs(s["prob"] @ s["advantage"]) <= RTOL * r.baseline


def test_gradient_with_constant_adds_c_times_score_mean():
    r = exact(load_config("offpolicy_stale"), progress=False)
    raw = r.streams["raw"]
    assert np.array_equal(raw.gradient_with_constant(0.0), raw.gradient)
    assert rel(raw.gradient_with_constant(2.0), raw.gradient + 2.0 * raw.score_mean) <= RTOL


def test_reward_std_has_no_cancellation_under_a_large_offset():
    """std(A) and the bound are sums of (R - r0): a reward offset of 1e8 changes them by
    rounding only (E[R^2] - E[R]^2 in float64 lost 6x on the bound at 1e8)."""
    base = load_config("default")
    count = base.reward
    shifted = base.with_(reward=lambda prompt, resp: 1e8 + count(prompt, resp))
    a, b = exact(base, progress=False), exact(shifted, progress=False)
    assert abs(b.reward_std - a.reward_std) <= 1e-8 * a.reward_std
    np.testing.assert_allclose(b.bound, a.bound, rtol=1e-8, atol=0)
    assert abs(b.expected_reward - 1e8 - a.expected_reward) <= 1e-7


def test_constant_reward_has_zero_std_and_zero_covariance():
    """A reward that is the same on every response: std(A) = 0 and Cov(A, h) = 0 exactly."""
    task = load_config("no_eos").with_(reward={"name": "length"}, baseline="mean")
    r = exact(task, progress=False)
    assert r.reward_std == 0.0
    assert np.all(r.covariance == 0.0) and np.all(r.gradient == 0.0)


def test_reward_std_is_right_when_rewards_are_nearly_constant():
    """A peaked model whose reward is almost always the same: Var(R) is tiny next to
    E[R]^2 and next to (R - r0)^2 for the first reward seen. Both engines match a
    two-pass variance over the kept responses (E[R] first, then E[(R - E[R])^2])."""
    task = load_config("gpt2_small")
    task = task.with_(theta=10 * task.theta)
    for reference in (False, True):
        r = exact(task, progress=False, reference=reference)
        p, R = r.sequences["prob"], r.sequences["reward"]
        mean = (p @ R) / p.sum()
        var = (p @ (R - mean) ** 2) / p.sum()
        assert var > 0
        assert abs(r.reward_std - np.sqrt(var)) <= 1e-8 * np.sqrt(var), (reference, r.reward_std,
                                                                          np.sqrt(var))


def test_a_first_spread_keeps_its_mean_exactly():
    """(3 - 0) * m / m rounds to 3.0000000000000004 for m = 0.8913857729306376: a first
    spread merged that way gave two shards of equal rewards different means, and their
    merge a reward spread of 1e-16 where the single run has exactly 0."""
    m = Moments(1, 1)
    m.merge_spread(0.8913857729306376, 3.0, 0.0, 4.0)
    assert m.spread_mean == 3.0
    m.merge_spread(0.10861422706936236, 3.0, 0.0, 4.0)
    assert m.spread_mean == 3.0 and m.spread_m2 == 0.0 and m.reward_std() == 0.0


def test_finish_stream_forms_the_documented_quantities_from_the_sums():
    """Sums of two responses written by hand: E[R], std(A), G = E[(R - b) h], Cov, the
    bound, the correlation and the variances, as the definitions give them."""
    P, T = 2, 1
    w, R = np.array([0.25, 0.75]), np.array([1.0, 3.0])
    h = np.array([[1.0, -2.0], [0.5, 4.0]])  # (responses, P)
    m = Moments(P, T)
    m.add_reward_spread(w, R)
    Rc = m.centered(R)
    m.add_sums(mass=w.sum(), R=w @ Rc, h=w @ h, h2=w @ h ** 2, h4=w @ h ** 4,
               Rh=(w * Rc) @ h, Rh2=(w * Rc) @ h ** 2, R2h2=(w * Rc ** 2) @ h ** 2)
    r = finish_stream(m, "mean")
    ER = w @ R
    A = R - ER
    G = (w * A) @ h
    assert r.expected_reward == ER == r.baseline
    assert abs(r.reward_std - np.sqrt(w @ A ** 2)) <= 1e-15 * r.reward_std
    assert rel(r.gradient, G) <= RTOL
    assert rel(r.covariance, G) <= RTOL  # Cov(R, h) = E[A h] with b = E[R]
    assert rel(r.bound, np.sqrt(w @ A ** 2) * np.sqrt(w @ h ** 2)) <= RTOL
    assert rel(r.variances["Ah"], (w * A ** 2) @ h ** 2 - G ** 2) <= RTOL
    assert rel(r.variances["h"], w @ h ** 2 - (w @ h) ** 2) <= RTOL


def test_importance_weighted_is_zero_where_the_sampler_never_draws():
    w, p = np.array([0.5, 0.0, 0.5]), np.array([0.25, 0.5, 0.25])
    assert np.array_equal(importance_weighted(w, p), np.array([0.25, 0.0, 0.25]))


def _exact_std(prob, rewards):
    """The weighted std of ``rewards`` from exact rationals (the floats as they are), its
    square root taken after scaling by 2^1120, so that nothing underflows."""
    from fractions import Fraction
    p = [Fraction(float(x)) for x in prob]
    R = [Fraction(float(x)) for x in rewards]
    W = sum(p)
    mean = sum(a * b for a, b in zip(p, R)) / W
    var = sum(a * (b - mean) ** 2 for a, b in zip(p, R)) / W
    return float(np.sqrt(float(var * 2 ** 1120))) * 2.0 ** -560


def test_tiny_rewards_keep_std_bound_and_correlation():
    """issue 46 item 1: rewards of 1e-170 x a count. Blocks whose rewards are all 0 used
    to set the spread's unit to 1, and the squares of 1e-170 then underflowed: std(A) and
    the bound came out 0, the correlation 0. Both engines, against exact rationals."""
    base = load_config("default")
    count = base.reward
    scale = 1e-170
    tiny = base.with_(reward=lambda prompt, resp: scale * count(prompt, resp))
    unit = exact(base, progress=False)
    for reference in (False, True):
        r = exact(tiny, progress=False, reference=reference)
        want = _exact_std(r.sequences["prob"], r.sequences["reward"])
        assert want > 0
        assert abs(r.reward_std - want) <= RTOL * want, (reference, r.reward_std, want)
        assert rel(r.bound, want * np.sqrt(r.sequence_fisher)) <= RTOL, reference
        assert rel(r.correlation, unit.correlation) <= RTOL, reference


def test_a_block_of_zero_rewards_leaves_a_tiny_unit_alone():
    """issue 46 item 1: zero rewards merged before and after rewards of 1e-170."""
    for order in ((0, 1), (1, 0)):
        m = Moments(1, 1)
        blocks = [np.zeros(2), np.array([1e-170, 3e-170])]
        for i in order:
            m.add_reward_spread(np.array([0.25, 0.25]), blocks[i])
        want = _exact_std([0.25] * 4, [0.0, 0.0, 1e-170, 3e-170])
        assert abs(m.reward_std() - want) <= RTOL * want, (order, m.reward_std(), want)
