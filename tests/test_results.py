"""ExactResult: per-state and per-response arrays, sorting, mass, advantages,
variances, and the on-policy attributes taken from the policy stream."""
import numpy as np
from hypothesis import given, settings, strategies as st

from cases import RTOL, get_brute, get_result, get_task, rel
from fisher_ref import exact, load_config


def test_sequence_probabilities_sum_to_one(case):
    r = get_result(case)
    assert abs(r.sequences["prob"].sum() - 1) <= RTOL
    assert abs(r.sequences["sampler_prob"].sum() - 1) <= RTOL
    assert abs(r.streams["policy"].mass - 1) <= RTOL


def test_sequences_match_brute_force(case):
    r, b = get_result(case), get_brute(case)
    task = get_task(case)
    T = task.max_len
    # brute force visits prompts in order and tokens lexicographically: same order
    resp = np.full((len(b["P"]), T), -1)
    for i, y in enumerate(b["response"]):
        resp[i, :len(y)] = y
    order = np.lexsort([resp[:, c] for c in range(T - 1, -1, -1)] + [b["prompt"]])
    s = r.sequences
    assert np.array_equal(s["tokens"], resp[order])
    assert np.array_equal(s["prompt"], b["prompt"][order])
    assert rel(s["prob"], b["P"][order]) <= RTOL
    assert rel(s["sampler_prob"], b["Pmu"][order]) <= RTOL
    assert np.array_equal(s["reward"], b["R"][order])
    assert np.array_equal(s["advantage"], s["reward"] - r.baseline)


def test_states_are_sorted_and_match_brute_force(case):
    r, b = get_result(case), get_brute(case)
    st = r.states
    keys = np.lexsort([st["tokens"][:, c] for c in range(st["tokens"].shape[1] - 1, -1, -1)]
                      + [st["depth"], st["prompt"]])
    assert np.array_equal(keys, np.arange(len(keys)))
    L = st["tokens"].shape[1]
    bt = np.full((len(b["tokens"]), L), -1)
    for i, t in enumerate(b["tokens"]):
        bt[i, :len(t)] = t
    order = np.lexsort([bt[:, c] for c in range(L - 1, -1, -1)] + [b["depth"]]
                       + [_prompt_of_states(b)])
    assert np.array_equal(st["tokens"], bt[order])
    assert rel(st["reach"], b["reach"][order]) <= RTOL
    assert rel(st["probs"], b["p"][order]) <= RTOL
    f = np.einsum("nv,nvp->np", b["p"], b["scores"] ** 2)[order]
    assert rel(st["token_fisher"], f) <= RTOL
    if "sampler_probs" in st:
        assert rel(st["sampler_probs"], b["q"][order]) <= RTOL
        assert rel(st["sampler_reach"], b["reach_mu"][order]) <= RTOL


def _prompt_of_states(b):
    """Prompt index of each brute-force state (states are visited prompt by prompt,
    depth 0 first)."""
    starts = np.flatnonzero(b["depth"] == 0)
    out = np.zeros(len(b["depth"]), dtype=int)
    for i, s in enumerate(starts):
        out[s:] = i
    return out


def test_on_policy_attributes_are_the_policy_stream(case):
    r = get_result(case)
    pol = r.streams["policy"]
    for name in ("sequence_fisher", "token_fisher_sum", "gradient", "bound", "cross_terms"):
        assert getattr(r, name) is getattr(pol, name)
    assert (r.offpolicy is None) == (get_task(case).sampler is None)


def test_exact_variances_match_brute_force(case):
    r, b = get_result(case), get_brute(case)
    pol = r.streams["policy"]
    h = b["xi"].sum(axis=1)
    P = b["P"]
    A = b["R"] - r.baseline
    for key, x in (("h", h), ("h2", h ** 2), ("Ah", A[:, None] * h)):
        var = P @ x ** 2 - (P @ x) ** 2
        assert rel(pol.variances[key], var, (P @ x ** 2).max()) <= 1e-9, key
    assert abs(pol.variances["reward"] - (P @ b["R"] ** 2 - (P @ b["R"]) ** 2)) <= \
        RTOL * max(1.0, P @ b["R"] ** 2)


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
    from fisher_ref import exact, load_config
    base = load_config("default")
    count = base.reward
    shifted = base.with_(reward=lambda prompt, resp: 1e8 + count(prompt, resp))
    a, b = exact(base, progress=False), exact(shifted, progress=False)
    assert abs(b.reward_std - a.reward_std) <= 1e-8 * a.reward_std
    np.testing.assert_allclose(b.bound, a.bound, rtol=1e-8, atol=0)
    assert abs(b.expected_reward - 1e8 - a.expected_reward) <= 1e-7


def test_constant_reward_has_zero_std_and_zero_covariance():
    """A reward that is the same on every response: std(A) = 0 and Cov(A, h) = 0 exactly."""
    from fisher_ref import exact, load_config
    task = load_config("no_eos").with_(reward={"name": "length"}, baseline="mean")
    r = exact(task, progress=False)
    assert r.reward_std == 0.0
    assert np.all(r.covariance == 0.0) and np.all(r.gradient == 0.0)


# ---------------------------------------------------------------- top-k overlap

def _top_by_rank(x, n):
    """Indices whose rank is below n, the rank of i counting the entries that beat it:
    larger values, and equal values at a lower index (no sorting)."""
    x = np.asarray(x, dtype=float)
    idx = np.arange(len(x))
    beats = (x[None, :] > x[:, None]) | ((x[None, :] == x[:, None]) & (idx[None, :] < idx[:, None]))
    return {int(i) for i in np.flatnonzero(beats.sum(axis=1) < n)}


def _overlap_by_ranks(G, F, frac):
    n = max(1, int(round(frac * len(G))))  # the documented size: top round(frac P), >= 1
    return n, len(_top_by_rank(np.abs(G), n) & _top_by_rank(F, n)) / n


def test_topk_overlap_known_by_construction():
    from fisher_ref import topk_overlap
    P = 8
    G = -np.arange(P, 0, -1.0)  # |G| = 8, 7, ..., 1: parameter 0 is first by |G|
    # F in the same order as |G|: every top set agrees
    assert topk_overlap(G, np.arange(P, 0, -1.0), (0.25, 0.5)) == [(0.25, 2, 1.0, 0.25),
                                                                  (0.5, 4, 1.0, 0.5)]
    # F in the reverse order: top halves are disjoint; top 6 of 8 share 4 (the middle);
    # all of them share everything
    rev = np.arange(1.0, P + 1)
    assert topk_overlap(G, rev, (0.25, 0.5, 0.75, 1.0)) == [
        (0.25, 2, 0.0, 0.25), (0.5, 4, 0.0, 0.5), (0.75, 6, 4 / 6, 0.75), (1.0, 8, 1.0, 1.0)]
    # ties go to the lowest index: all-zero G and F pick the same first n parameters
    assert topk_overlap(np.zeros(P), np.zeros(P), (0.5,)) == [(0.5, 4, 1.0, 0.5)]
    # a tiny fraction still takes one parameter
    assert topk_overlap(G, rev, (0.01,)) == [(0.01, 1, 0.0, 1 / P)]


@settings(derandomize=True, database=None, deadline=None, max_examples=200)
@given(st.integers(1, 40).flatmap(lambda P: st.tuples(
           st.lists(st.sampled_from([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0]), min_size=P, max_size=P),
           st.lists(st.sampled_from([0.0, 0.25, 1.0, 2.0]), min_size=P, max_size=P))),
       st.floats(0.0, 1.0))
def test_topk_overlap_matches_rank_counting(GF, frac):
    """Against a set computation by rank counting (ties on purpose: few distinct values)."""
    from fisher_ref import topk_overlap
    G, F = np.array(GF[0]), np.array(GF[1])
    [(f, n, overlap, rnd)] = topk_overlap(G, F, (frac,))
    n_ref, overlap_ref = _overlap_by_ranks(G, F, frac)
    assert (f, n, rnd) == (frac, n_ref, n_ref / len(G)) and overlap == overlap_ref


def test_topk_overlap_of_every_case(case):
    r = get_result(case)
    for frac, n, overlap, rnd in r.topk_overlap((0.05, 0.1, 0.25, 0.5)):
        assert (n, overlap) == _overlap_by_ranks(r.gradient, r.sequence_fisher, frac)
        assert rnd == n / len(r.gradient)


def test_reward_std_is_right_when_rewards_are_nearly_constant():
    """A peaked model whose reward is almost always the same: Var(R) is tiny next to
    E[R]^2 and next to (R - r0)^2 for the first reward seen. Both engines match a
    two-pass variance over the kept responses (E[R] first, then E[(R - E[R])^2])."""
    from fisher_ref import exact, load_config
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


def test_gathered_states_form_each_array_once_on_first_read():
    """GatheredStates holds some arrays per window and forms the (N, ...) rows on the
    first read; later reads return the same array; an unknown key is a KeyError."""
    from fisher_ref.results import GatheredStates
    table = np.arange(6.0).reshape(3, 2)  # 3 windows
    window = np.array([2, 0, 2, 1])  # 4 states
    st = GatheredStates({"depth": np.array([0, 1, 1, 2])}, {"f": table}, window)
    assert list(st) == ["depth", "f"] and len(st) == 2
    assert "f" in st and "missing" not in st and "f" in st._tables  # a test, not a read
    f = st["f"]
    assert np.array_equal(f, table[window])
    assert st["f"] is f  # formed once
    assert "4 states" in repr(st)
    try:
        st["missing"]
    except KeyError as e:
        assert "missing" in str(e)
    else:
        raise AssertionError("an unknown key must raise KeyError")


def test_fast_engine_states_equal_per_state_rows_of_the_reference(case):
    """The fast engine keeps token arrays per window; read per state they are the plain
    engine's rows (the same numbers, so equal to rounding of the sums), and
    ``gathered()`` forms them all."""
    task = get_task(case)
    fast = exact(task, progress=False, keep_states=True)
    ref = exact(task, progress=False, keep_states=True, reference=True)
    assert fast.gathered() is fast
    assert sorted(fast.states) == sorted(ref.states)
    per_window = ["token_fisher", "uniform", "score_mean"]
    if task.sampler is not None:
        per_window += ["sampler_token_fisher", "raw_score_mean"]
    for k in per_window:  # E[xi | s] on the score scale sqrt(max f); the others on their own
        scale = np.abs(ref.states[k]).max()
        if k.endswith("score_mean"):
            scale = max(scale, np.sqrt(np.abs(ref.states["token_fisher"]).max()))
        assert np.abs(fast.states[k] - ref.states[k]).max() <= RTOL * max(scale, 1e-300), k


def test_the_walk_refuses_rows_it_did_not_write(monkeypatch):
    """A walk that put two responses in one place (so left another place unwritten)
    raises instead of returning uninitialised rows."""
    import fisher_ref.engine.run as walk
    real = walk.response_places
    monkeypatch.setattr(walk, "response_places", lambda *a: np.minimum(real(*a), 3))
    try:
        exact(load_config("default"), progress=False, keep_sequences=True)
    except RuntimeError as e:
        assert "places" in str(e)
    else:
        raise AssertionError("a walk that misses places must raise")


def test_a_first_spread_keeps_its_mean_exactly():
    """(3 - 0) * m / m rounds to 3.0000000000000004 for m = 0.8913857729306376: a first
    spread merged that way gave two shards of equal rewards different means, and their
    merge a reward spread of 1e-16 where the single run has exactly 0."""
    from fisher_ref.results import Moments
    m = Moments(1, 1)
    m.merge_spread(0.8913857729306376, 3.0, 0.0, 4.0)
    assert m.spread_mean == 3.0
    m.merge_spread(0.10861422706936236, 3.0, 0.0, 4.0)
    assert m.spread_mean == 3.0 and m.spread_m2 == 0.0 and m.reward_std() == 0.0
