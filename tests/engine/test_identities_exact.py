"""Every identity of docs/theory.md §2.9, on every case of ``tests/cases.py``, at rtol 1e-10.

Each test compares two routes: the exact engine against itself (states vs
responses) and against the independent brute force of ``cases.brute_force``.
"""
import numpy as np
import pytest
from autograd import grad
from hypothesis import given, settings, strategies as st

import cases
from cases import RTOL, brute_force, expected_reward_fn, get_brute, get_result, get_task, record, rel
from fisher_ref import (CountReward, LengthReward, MatchReward, MLPModel, ModelSpec,
                        TemperatureSampler, Task, exact)
from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import token_fisher, token_fisher_pairwise, uniform_token_fisher


def natural_gradient_scale(r, b):
    """sqrt(max(E[A^2], E[R^2])) * max sqrt(F): the Cauchy–Schwarz size of the terms
    of E[A h] and of autograd's sum_y P(y) R(y) d log P(y) — what rounding scales with."""
    A = b["R"] - r.baseline
    m2 = max(b["P"] @ A ** 2, b["P"] @ b["R"] ** 2)
    return float(np.sqrt(m2) * np.sqrt(r.sequence_fisher.max())) or 1.0


def state_sensitivities(task, states):
    """j at every kept state, recomputed from its tokens: (N, P, V)."""
    toks = [tuple(int(t) for t in row if t >= 0) for row in states["tokens"]]
    W = cases.reference_windows(task.model, toks)  # (N, k)
    return sensitivities(task.model, task.theta, W)


def test_score_has_zero_conditional_mean(case):
    b, r = get_brute(case), get_result(case)
    cond = np.einsum("nv,nvp->np", b["p"], b["scores"])  # (N, P) E[xi | s], brute force
    f = np.einsum("nv,nvp->np", b["p"], b["scores"] ** 2)  # (N, P)
    scale = np.sqrt(f.max())
    assert record("score_has_zero_conditional_mean (brute)", case, rel(cond, 0, scale)) <= RTOL
    pol = r.streams["policy"]
    assert record("score_has_zero_conditional_mean (engine)", case,
                  rel(pol.cond_score_max, 0, scale)) <= RTOL
    assert rel(r.states["score_mean"], 0, scale) <= RTOL


def test_score_mean_is_zero(case):
    r, b = get_result(case), get_brute(case)
    scale = np.sqrt(r.sequence_fisher.max())
    assert record("score_mean_is_zero", case, rel(r.score_mean, 0, scale)) <= RTOL
    h = b["xi"].sum(axis=1)  # (M, P)
    assert record("score_mean_is_zero (brute)", case, rel(b["P"] @ h, 0, scale)) <= RTOL


def test_cross_terms_vanish(case):
    r, b = get_result(case), get_brute(case)
    T = r.cross_terms.shape[0]
    off = ~np.eye(T, dtype=bool)
    scale = r.sequence_fisher.max()
    assert record("cross_terms_vanish", case, rel(r.cross_terms[off], 0, scale)) <= RTOL
    C = np.einsum("m,mup,mtp->utp", b["P"], b["xi"], b["xi"])  # (T, T, P)
    assert record("cross_terms (engine vs brute)", case, rel(r.cross_terms, C)) <= RTOL


def test_per_response_cross_terms_are_not_zero(case):
    b, r = get_brute(case), get_result(case)
    if get_task(case).max_len < 2:
        pytest.fail("every case needs max_len >= 2 for cross terms")
    prod = np.einsum("mup,mtp->mutp", b["xi"], b["xi"])  # (M, T, T, P)
    T = prod.shape[1]
    off = prod[:, ~np.eye(T, dtype=bool)]  # (M, T(T-1), P)
    live = b["P"] > 0
    if case == "tabular_context2":
        # structurally zero: no response visits one window (one table row) twice
        assert np.abs(off).max() == 0.0
        return
    assert np.abs(off[live]).max() > 1e-3 * r.sequence_fisher.max()


def test_sequence_fisher_is_token_sum(case):
    r, b = get_result(case), get_brute(case)
    F = r.sequence_fisher
    assert record("sequence_fisher_is_token_sum (states)", case,
                  rel(F, r.token_fisher_sum)) <= RTOL
    assert record("sequence_fisher_is_token_sum (paths)", case,
                  rel(F, r.token_fisher_sum_paths)) <= RTOL
    pol = r.streams["policy"]
    assert rel(pol.token_fisher_by_depth.sum(axis=0), r.token_fisher_sum) <= RTOL
    h = b["xi"].sum(axis=1)  # (M, P)
    f = np.einsum("nv,nvp->np", b["p"], b["scores"] ** 2)  # (N, P)
    assert record("sequence_fisher (engine vs brute)", case, rel(F, b["P"] @ h ** 2)) <= RTOL
    assert record("token_fisher_sum (engine vs brute)", case,
                  rel(r.token_fisher_sum, b["reach"] @ f)) <= RTOL
    assert abs(pol.mass - 1.0) <= RTOL


def test_cross_terms_sum_to_sequence_fisher(case):
    r = get_result(case)
    assert record("cross_terms_sum_to_sequence_fisher", case,
                  rel(r.cross_terms.sum(axis=(0, 1)), r.sequence_fisher)) <= RTOL


def test_pairwise_form_matches_centered_form(case):
    task, r = get_task(case), get_result(case)
    J = state_sensitivities(task, r.states)  # (N, P, V)
    p = r.states["probs"]  # (N, V)
    f = token_fisher(p, J)
    assert record("pairwise_form_matches_centered_form", case,
                  rel(f, token_fisher_pairwise(p, J))) <= RTOL
    assert rel(f, r.states["token_fisher"]) <= RTOL
    assert np.allclose(p.sum(axis=1), 1.0, rtol=0, atol=RTOL)


def test_uniform_logit_shift_leaves_token_fisher_unchanged(case):
    task, r = get_task(case), get_result(case)
    J = state_sensitivities(task, r.states)  # (N, P, V)
    rng = np.random.default_rng(0)
    shift = rng.normal(size=J.shape[:2])[..., None] * 10  # (N, P, 1)
    p = r.states["probs"]
    err = rel(token_fisher(p, J + shift), token_fisher(p, J))
    assert record("uniform_logit_shift_leaves_token_fisher_unchanged", case, err) <= RTOL
    assert rel(uniform_token_fisher(J + shift), uniform_token_fisher(J)) <= RTOL


def test_uniform_logit_shift_of_the_model_changes_nothing():
    """A model whose logits get a theta-dependent constant per state (cases
    'shifted_default') gives the same exact results as the original."""
    a, s = get_result("config:default"), get_result("shifted_default")
    for name in ("sequence_fisher", "token_fisher_sum", "gradient", "cross_terms"):
        assert record("uniform shift of the model: " + name, "shifted_default",
                      rel(getattr(a, name), getattr(s, name))) <= RTOL


def test_alignment_ratio(case):
    task, r = get_task(case), get_result(case)
    f, fu = r.states["token_fisher"], r.states["uniform"]
    J = state_sensitivities(task, r.states)
    V = J.shape[-1]
    assert rel(fu, token_fisher(np.full(V, 1.0 / V), J)) <= RTOL
    ok = fu > 0
    ratio = f[ok] / fu[ok]
    assert np.isfinite(ratio).all() and (ratio >= 0).all()
    # where f_unif = 0 every token moves alike, so f = 0 too
    assert rel(f[~ok], 0, f.max()) <= RTOL


def test_alignment_ratio_below_one_where_likely_tokens_move_alike():
    """Parameter 0 moves tokens 1 and 2 alike; the policy puts 98% on them:
    f = q(1-q) with q = p1 + p2, against f_unif = (2/V)(1 - 2/V)."""
    import autograd.numpy as anp
    from fisher_ref import FunctionModel
    V = 4
    base = np.array([np.log(0.01), np.log(0.49), np.log(0.49), np.log(0.01)])
    lift = np.array([0.0, 1.0, 1.0, 0.0])
    model = FunctionModel(lambda th, w: anp.zeros((w.shape[0], 1)) + base + th[0] * lift
                          + th[1] * np.eye(V)[3], 2, V, 1, eos=True)
    task = Task(model=model, theta=np.zeros(2), prompts=[(1,)], prompt_weights=[1.0],
                max_len=2, reward=CountReward(1))
    r = exact(task, progress=False)
    f, fu = r.states["token_fisher"], r.states["uniform"]  # (N, 2)
    q = 0.98
    assert np.allclose(f[:, 0], q * (1 - q), rtol=RTOL)
    assert np.allclose(fu[:, 0], (2 / V) * (1 - 2 / V), rtol=RTOL)
    assert (f[:, 0] / fu[:, 0] < 0.1).all()


def test_gradient_is_autodiff_of_expected_reward(case):
    task, r, b = get_task(case), get_result(case), get_brute(case)
    scale = natural_gradient_scale(r, b)
    assert record("gradient_is_autodiff_of_expected_reward", case,
                  rel(r.gradient, r.gradient_autodiff, scale)) <= RTOL
    g_ind = grad(expected_reward_fn(task, b))(task.theta)
    assert record("gradient (engine vs independent autograd)", case,
                  rel(r.gradient, g_ind, scale)) <= RTOL
    assert abs(r.expected_reward - b["P"] @ b["R"]) <= RTOL * max(1.0, np.abs(b["R"]).max())


@pytest.mark.parametrize("case_id", ["config:default", "config:tabular", "sine_model"])
def test_gradient_matches_finite_differences(case_id):
    task, r, b = get_task(case_id), get_result(case_id), get_brute(case_id)
    f = expected_reward_fn(task, b)
    step, P = 1e-6, task.model.num_params
    fd = np.array([(f(task.theta + step * e) - f(task.theta - step * e)) / (2 * step)
                   for e in np.eye(P)])
    # central differences: truncation O(step^2) plus rounding O(eps / step)
    assert rel(r.gradient, fd, natural_gradient_scale(r, b)) <= 1e-7


def test_gradient_is_covariance(case):
    r, b = get_result(case), get_brute(case)
    scale = natural_gradient_scale(r, b)
    assert record("gradient_is_covariance", case, rel(r.gradient, r.covariance, scale)) <= RTOL
    h = b["xi"].sum(axis=1)
    ER = b["P"] @ b["R"]
    cov = b["P"] @ ((b["R"] - ER)[:, None] * (h - b["P"] @ h))
    assert rel(r.covariance, cov, scale) <= RTOL


def test_gradient_independent_of_constant_baseline(case):
    task, r, b = get_task(case), get_result(case), get_brute(case)
    r2 = exact(task.with_(baseline=7.5), progress=False)
    scale = natural_gradient_scale(r, b) + natural_gradient_scale(r2, b)
    assert record("gradient_independent_of_constant_baseline", case,
                  rel(r.gradient, r2.gradient, scale)) <= RTOL
    assert r2.baseline == 7.5


def test_gradient_bound_holds(case):
    r = get_result(case)
    slack = RTOL * natural_gradient_scale(r, get_brute(case))
    assert (np.abs(r.gradient) <= r.bound + slack).all()
    assert (np.abs(r.correlation) <= 1 + RTOL).all()
    assert np.isfinite(r.correlation).all()
    record("gradient_bound_holds (max |corr| - 1, if > 0)", case,
           max(np.abs(r.correlation).max() - 1, 0.0))


# ---------------------------------------------------------------- property tests

@st.composite
def small_tasks(draw):
    V = draw(st.integers(2, 5))
    eos = draw(st.booleans())
    k = draw(st.integers(1, 3))
    spec = ModelSpec(vocab_size=V, context=k, embed_dim=draw(st.integers(1, 3)),
                     hidden=draw(st.integers(1, 4)), eos=eos,
                     init_seed=draw(st.integers(0, 10 ** 6)),
                     init_scale=draw(st.floats(0.1, 3.0)))
    T = draw(st.integers(1, 3 if V <= 4 else 2))
    n_prompts = draw(st.integers(1, 3))
    prompts = [tuple(draw(st.lists(st.integers(0, V - 1), max_size=3)))
               for _ in range(n_prompts)]
    raw = np.array(draw(st.lists(st.floats(0.05, 1.0), min_size=n_prompts,
                                 max_size=n_prompts)))
    kind = draw(st.sampled_from(["count", "match", "length"]))
    reward = {"count": lambda: CountReward(draw(st.integers(0, V - 1))),
              # a target that can never match is refused: with EOS on one holding EOS
              # (id 0) or longer than T, without EOS one not exactly T tokens long
              "match": lambda: MatchReward(
                  draw(st.lists(st.integers(1 if eos else 0, V - 1), min_size=0 if eos else T,
                                max_size=T)), eos=eos),
              "length": lambda: LengthReward(eos=eos)}[kind]()
    baseline = draw(st.one_of(st.just("mean"), st.floats(-2.0, 2.0)))
    sampler = draw(st.one_of(st.none(), st.floats(0.5, 2.0).map(TemperatureSampler)))
    model = MLPModel(spec)
    return Task(model=model, theta=model.init_params(), prompts=prompts,
                prompt_weights=raw / raw.sum(), max_len=T, reward=reward,
                baseline=baseline, sampler=sampler)


@settings(derandomize=True, database=None, deadline=None, max_examples=25)
@given(small_tasks())
def test_identities_hold_on_random_small_tasks(task):
    r = exact(task, progress=False)
    b = brute_force(task)
    F = r.sequence_fisher
    h = b["xi"].sum(axis=1)
    assert rel(F, b["P"] @ h ** 2) <= RTOL
    assert rel(F, r.token_fisher_sum) <= RTOL
    assert rel(F, r.token_fisher_sum_paths) <= RTOL
    assert rel(r.cross_terms.sum(axis=(0, 1)), F) <= RTOL
    T = task.max_len
    assert rel(r.cross_terms[~np.eye(T, dtype=bool)], 0, F.max()) <= RTOL
    assert rel(r.score_mean, 0, np.sqrt(F.max())) <= RTOL
    scale = natural_gradient_scale(r, b)
    assert rel(r.gradient, r.gradient_autodiff, scale) <= RTOL
    assert rel(r.gradient, r.covariance, scale) <= RTOL
    assert (np.abs(r.gradient) <= r.bound + RTOL * scale).all()
    if task.sampler is not None:
        c = r.streams["centered"]
        assert rel(c.sequence_fisher, c.token_fisher_sum) <= RTOL
        assert rel(c.score_mean, 0, np.sqrt(c.sequence_fisher.max())) <= RTOL
        hc = b["xc"].sum(axis=1)
        assert rel(c.sequence_fisher, b["Pmu"] @ hc ** 2) <= RTOL


# ---------------------------------------------------------------- extreme and bad logits

def _all_arrays(r):
    for s, stream in r.streams.items():
        for k, v in vars(stream).items():
            if k != "variances":
                yield f"{s}.{k}", np.asarray(v, dtype=float)
        for k, v in stream.variances.items():
            yield f"{s}.variances.{k}", np.asarray(v, dtype=float)
    yield "gradient_autodiff", r.gradient_autodiff
    for k, v in (r.states or {}).items():
        yield f"states.{k}", np.asarray(v, dtype=float)


def test_results_are_finite(case):
    for name, arr in _all_arrays(get_result(case)):
        assert np.isfinite(arr).all(), name


def test_extreme_and_masked_cases_are_extreme():
    """The 'extreme_logits' case reaches |z| ~ 1e3 and probabilities that underflow to 0;
    the masked cases hold -inf logits."""
    for name in ("extreme_logits", "masked_logits", "masked_rounded_sampler", "masked_eos"):
        task = get_task(name)
        toks = [tuple(int(t) for t in row if t >= 0) for row in get_result(name).states["tokens"]]
        z = task.model.logits(task.theta, cases.reference_windows(task.model, toks))
        if name == "extreme_logits":
            assert np.abs(z).max() > 500 and (get_result(name).states["probs"] == 0).any()
        else:
            assert np.isneginf(z).any()


def _function_task(fn, V=3):
    from fisher_ref import FunctionModel
    model = FunctionModel(fn, 1, V, 1, eos=True)
    return Task(model=model, theta=np.zeros(1), prompts=[(1,)], prompt_weights=[1.0],
                max_len=2, reward=CountReward(1))


@pytest.mark.parametrize("fn, words", [
    (lambda th, w: np.full((w.shape[0], 3), np.nan) + th[0], "NaN or \\+inf logits"),
    (lambda th, w: np.full((w.shape[0], 3), np.inf) + th[0], "NaN or \\+inf logits"),
    (lambda th, w: np.full((w.shape[0], 3), -np.inf) + th[0], "logits are all -inf"),
    (lambda th, w: np.zeros((w.shape[0], 2)) + th[0], "logits of shape \\(1, 2\\).*expected"),
], ids=["nan", "pos-inf", "all-neg-inf", "wrong-shape"])
def test_bad_model_logits_are_refused(fn, words):
    with pytest.raises(ValueError, match=words):
        exact(_function_task(fn), progress=False)
