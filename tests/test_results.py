"""ExactResult: per-state and per-response arrays, sorting, mass, advantages,
variances, and the on-policy attributes taken from the policy stream."""
import numpy as np
from hypothesis import given, settings, strategies as st

from cases import RTOL, get_brute, get_result, get_task, rel
from fisher_ref import exact
from fisher_ref.engine.plan import EngineOptions


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
    fast = exact(task, progress=False, options=EngineOptions(keep_states=True))
    ref = exact(task, progress=False, reference=True, options=EngineOptions(keep_states=True))
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
