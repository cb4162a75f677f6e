"""Per-response scores, pair terms, the f/f_unif ratio and its split into concentration
and alignment (fisher_ref.teaching.views)."""
import doctest
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fisher_ref.teaching.views as alignment
from fisher_ref import exact, load_config, token_fisher, uniform_token_fisher
from fisher_ref.teaching.views import (alignment_factor, concentration, entropy, fisher_ratio,
                                  pairwise_terms, response_token_scores,
                                  shuffle_control, shuffled_sequence_fisher,
                                  shuffled_token_fisher, state_sensitivities)
from fisher_ref.monte_carlo.ztests import bonferroni_z
from fisher_ref.checks.tolerances import rel_err
from fisher_ref.engine.plan import EngineOptions

RTOL = 1e-10


@pytest.mark.parametrize("name", ["default", "no_eos", "tabular"])
def test_response_scores_reproduce_exact_moments(name):
    """Summing prob * (per-response value) over all responses gives the engine's values."""
    task = load_config(name)
    r = exact(task, progress=False)
    s = r.sequences
    XI = np.stack([response_token_scores(task, p, t) for p, t in zip(s["prompt"], s["tokens"])])
    H = XI.sum(axis=1)  # (M, P)
    assert rel_err(s["prob"] @ H ** 2, r.sequence_fisher) <= RTOL
    assert rel_err(np.einsum("m,mp,m->p", s["prob"], H, s["advantage"]), r.gradient) <= RTOL
    cross = np.einsum("m,mup,mtp->utp", s["prob"], XI, XI)
    assert rel_err(cross, r.cross_terms) <= RTOL
    # padding: positions past the response's end hold 0
    lengths = (s["tokens"] >= 0).sum(axis=1)
    for m in np.flatnonzero(lengths < task.max_len)[:5]:
        assert np.all(XI[m, lengths[m]:] == 0)


@pytest.mark.parametrize("prompt, response, match", [
    (5, [1], "prompt index 5 out of range"),
    (0, [], "needs 1..3 tokens"),
    (0, [1, 1, 1, 1], "needs 1..3 tokens"),
    (0, [7], "outside 0..4"),
    (0, [0, 2], "continues after EOS"),
])
def test_bad_response_is_named(prompt, response, match):
    with pytest.raises(ValueError, match=match):
        response_token_scores(load_config("default"), prompt, response)


def test_pairwise_terms_sum_to_token_fisher():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6))
    J = rng.normal(size=(4, 6))
    T = pairwise_terms(p, J)
    assert T.shape == (4, 6, 6) and np.allclose(T, T.transpose(0, 2, 1))
    assert rel_err(T.sum(axis=(1, 2)), token_fisher(p, J)) <= RTOL
    with pytest.raises(ValueError, match="need probs"):
        pairwise_terms(p, J.T)


def test_fisher_ratio_matches_stored_arrays():
    r = exact(load_config("default"), progress=False)
    ratio = fisher_ratio(r)
    f, fu = r.states["token_fisher"], r.states["uniform"]
    ok = np.isfinite(ratio)
    assert rel_err(ratio[ok], f[ok] / fu[ok]) <= RTOL
    assert np.all(fu[~ok] <= alignment.RATIO_FLOOR * fu.max())
    assert (~ok).any()  # the EOS embedding never enters a window
    r_no = exact(load_config("default"), progress=False, options=EngineOptions(keep_states=False))
    with pytest.raises(ValueError, match="keep_states=True"):
        fisher_ratio(r_no)


def test_entropy_of_uniform_and_point_mass():
    assert np.isclose(entropy(np.full(7, 1 / 7)), np.log(7), rtol=RTOL)
    assert entropy(np.array([1.0, 0.0, 0.0])) == 0.0


def test_alignment_docstring_examples():
    res = doctest.testmod(alignment, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0


# --------------------------------------------------------------- concentration and alignment


def _brute_permutation_mean(p, J):
    """Token Fisher averaged over all V! arrangements of p across the tokens."""
    V = p.shape[-1]
    return np.mean([token_fisher(p[..., list(q)], J) for q in itertools.permutations(range(V))], axis=0)


@settings(derandomize=True, database=None, deadline=None, max_examples=60)
@given(V=st.integers(2, 6), P=st.integers(1, 4), seed=st.integers(0, 2 ** 32 - 1),
       peak=st.floats(0.0, 8.0))
def test_shuffled_token_fisher_is_the_permutation_average(V, P, seed, peak):
    rng = np.random.default_rng(seed)
    logits = peak * rng.normal(size=V)
    p = np.exp(logits - logits.max())
    p /= p.sum()  # (V,)
    J = rng.normal(scale=rng.uniform(0.1, 5.0), size=(P, V))  # (P, V)
    brute = _brute_permutation_mean(p, J)
    assert rel_err(shuffled_token_fisher(p, J), brute) <= RTOL
    assert np.all(shuffled_token_fisher(p, J) <= uniform_token_fisher(J) * (1 + RTOL))


def test_concentration_of_uniform_point_mass_and_bad_input():
    assert np.isclose(concentration(np.full(6, 1 / 6)), 1.0, rtol=RTOL)
    assert concentration(np.array([0.0, 1.0, 0.0])) == 0.0
    with pytest.raises(ValueError, match="at least 2 tokens"):
        concentration(np.array([1.0]))


def test_ratio_is_concentration_times_alignment():
    r = exact(load_config("default"), progress=False)
    c = concentration(r.states["probs"])[:, None]  # (N, 1)
    ratio, a = fisher_ratio(r), alignment_factor(r)
    ok = np.isfinite(ratio) & np.isfinite(a)
    assert ok.sum() > 0.5 * ok.size
    assert rel_err((c * a)[ok], ratio[ok]) <= RTOL


def test_shuffled_sequence_fisher_by_brute_force_states():
    """Route 1: the library's closed form; route 2: every state's V! permutations."""
    task = load_config("default")
    r = exact(task, progress=False)
    J = state_sensitivities(task, r.states)  # (N, P, V)
    assert rel_err(token_fisher(r.states["probs"], J), r.states["token_fisher"]) <= RTOL
    brute = r.states["reach"] @ _brute_permutation_mean(r.states["probs"], J)  # (P,)
    assert rel_err(shuffled_sequence_fisher(r), brute) <= RTOL
    # the unshuffled sum over states is the sequence Fisher
    assert rel_err(r.states["reach"] @ r.states["token_fisher"], r.sequence_fisher) <= RTOL


def test_shuffle_control_reports_the_model_by_a_direct_route():
    task = load_config("default")
    r = exact(task, progress=False)
    c = shuffle_control(task, r, np.random.default_rng(0), shuffles=3)
    ratio = fisher_ratio(r)  # (N, P), NaN where f_unif is negligible
    ok = np.isfinite(ratio)
    w = np.broadcast_to(r.states["reach"][:, None], ok.shape)[ok]
    assert np.isclose(c["share"], (w * (ratio[ok] < 1)).sum() / w.sum(), rtol=RTOL)
    F_shuf = shuffled_sequence_fisher(r)
    assert np.array_equal(c["params"], np.flatnonzero(F_shuf > 0))
    assert rel_err(c["ratio"], r.sequence_fisher[c["params"]] / F_shuf[c["params"]]) <= RTOL
    assert c["shuffled_share"].shape == (3,) and c["shuffled_ratio"].shape == (3, c["params"].size)
    sub = shuffle_control(task, r, np.random.default_rng(0), shuffles=1, params=[0, 3, 118])
    assert sub["params"].tolist() == [3, 118]  # parameter 0 (EOS embedding) has F_shuf = 0


def test_shuffled_ratio_averages_one():
    """E over shuffles of F_i / F_shuf_i is exactly 1 (F_shuf is the exact shuffle average).
    z-test per parameter on K shuffles, Bonferroni over parameters: false-failure rate <= 1e-6
    for the whole test (normal approximation of a mean of K bounded draws)."""
    seed, K = 11, 2000
    task = load_config("default")
    r = exact(task, progress=False)
    c = shuffle_control(task, r, np.random.default_rng(seed), shuffles=K)
    x = c["shuffled_ratio"]  # (K, n)
    z = (x.mean(axis=0) - 1.0) / (x.std(axis=0, ddof=1) / np.sqrt(K))  # (n,)
    limit = bonferroni_z(1e-6, z.size)
    assert np.abs(z).max() <= limit, f"seed {seed}: max |z| = {np.abs(z).max():.2f} > {limit:.2f}"
