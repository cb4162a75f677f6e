"""The Monte Carlo engine against the exact engine, on every shipped config.

Two kinds of test:

- **exact** (rtol 1e-10): the per-sample values of ``sample_values``, evaluated on
  *every* response and weighted by its exact probability, reproduce the exact
  engine's means and variances — so the estimators target the right numbers;
- **statistical** (false-failure rate <= 1e-6 per test, fixed seeds printed on
  failure): sampled frequencies (chi-square), z-scores of every estimator with the
  exact standard error, coverage of nominal 95% intervals (binomial).

Choice of ``N_Z = 20000`` draws for the z-tests (fewer on a config too big for
the memory budget, see ``n_for``; the Bernstein threshold is valid at any n): the per-sample values are bounded
(finite support), but some are very skewed — a parameter that moves only on a rare
response has ``h^2`` mostly 0 with rare spikes (measured sample skewness up to
~100 on ``offpolicy_stale``, so the standardised mean still has skewness
~100/sqrt(20000) ~ 0.7 and a normal tail at 6 sigma would be optimistic). So the
threshold of each entry is the larger of the normal Bonferroni one and the
Bernstein-inequality one, which holds for bounded variables at any ``n``
(``M = max|x - E x|`` over the support, from the enumeration): the false-failure
rate is <= 1e-6 by Bernstein alone, whatever the tails. 20000 keeps the test fast
(< 1 s per draw) while the Bernstein threshold stays near the normal one (6-7) for
all but the rare-spike entries.
"""
from __future__ import annotations


import numpy as np
import pytest
from scipy.stats import binom, chi2, norm

from fisher_ref import exact, list_configs, load_config
from fisher_ref.monte_carlo.ztests import (EXACT_VARIANCE, bernstein_z, bonferroni_z, cross_spread,
                                           linearised_values, spread, z_score)
from fisher_ref.monte_carlo.estimators import exact_variance_reduction, variance_reduction
from fisher_ref.monte_carlo.sampling import check_monte_carlo, estimate, sample, sample_values

from cases import brute_ratio, brute_values, rows_of_draws

RTOL = 1e-10  # exact float64 identities
ALPHA = 1e-6  # false-failure rate per statistical test
N_Z = 20000  # draws per z-test (see module docstring)
CONFIGS = list_configs()
OFFPOLICY = [c for c in CONFIGS if load_config(c).sampler is not None]
SMALL = [c for c in CONFIGS if load_config(c).model.num_params * load_config(c).max_len <= 2000]
_EXACT = {}
WORST_Z = {}  # (quantity) -> largest |z| seen, for the report


def get(name):
    if name not in _EXACT:
        task = load_config(name)
        _EXACT[name] = (task, exact(task, progress=False))
    return _EXACT[name]


def draws_of(name):
    """(from_sampler, exact stream names) of each distribution a config can draw from."""
    return [(False, ("policy",))] + ([(True, ("raw", "centered"))] if name in OFFPOLICY else [])


def rel(a, b, scale):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0)) / scale


def response_table(task, ex, from_mu):
    """Exact probability ``w (M,)`` and per-response values of every response."""
    seq = ex.sequences
    vals = sample_values(task, {"tokens": seq["tokens"], "prompt": seq["prompt"]}, from_mu)
    return (seq["sampler_prob"] if from_mu else seq["prob"]), vals


def n_for(task):
    """Draws for a z-test: N_Z, fewer for a big config (memory ~ 20 n T P bytes x 8)."""
    return int(min(N_Z, max(2000, 4e7 // (task.max_len * task.model.num_params))))


def exact_spreads(task, ex, from_mu):
    """{(stream, quantity): (mean, variance, max deviation)} over every response."""
    w, lin = linearised(task, ex, from_mu)
    out = {key: spread(x, w) for key, x in lin.items()}
    _, vals = response_table(task, ex, from_mu)
    for s in ("policy", "raw", "centered"):
        if s in vals:
            out[(s, "cross_terms")] = cross_spread(vals[s]["xi"], w)
    return out


def linearised(task, ex, from_mu):
    """(w, {(stream, quantity): x (M, ...)}) for every response (see linearised_values)."""
    w, vals = response_table(task, ex, from_mu)
    return w, linearised_values(vals, w, task.baseline)


# ------------------------------------------------------------------ exact identities

@pytest.mark.parametrize("name", CONFIGS)
def test_per_sample_values_reproduce_exact_means_and_variances(name):
    task, ex = get(name)
    for from_mu, streams in draws_of(name):
        w, vals = response_table(task, ex, from_mu)
        assert abs(w.sum() - 1.0) < RTOL
        for s in streams:
            st, v = ex.streams[s], vals[s]
            scale = np.sqrt(np.max(w @ v["h2"]))
            assert rel(w @ v["h"], st.score_mean, scale) < RTOL, (name, s)
            for key, x, mean in (("h2", v["h2"], st.sequence_fisher),
                                 ("token_sum", v["token_sum"], st.token_fisher_sum)):
                m2 = np.max(w @ (x * x))
                assert rel(w @ x, mean, np.max(np.abs(mean))) < RTOL, (name, s, key)
                var = w @ (x - w @ x) ** 2
                assert rel(var, st.variances[key], m2) < RTOL, (name, s, key)
            assert rel(w @ vals["reward"], st.expected_reward, 1.0 + abs(st.expected_reward)) < RTOL
            cross, cross_var, _ = cross_spread(v["xi"], w)
            assert rel(cross, st.cross_terms, np.max(np.abs(st.cross_terms))) < RTOL, (name, s)
            m4 = np.max(cross_var + cross ** 2)
            assert rel(cross_var, st.variances["cross"], m4) < RTOL, (name, s)
        if from_mu:  # rho = P_p(y) / P_mu(y)
            assert rel(vals["rho"] * w, ex.sequences["prob"], 1.0) < RTOL, name


@pytest.mark.parametrize("name", CONFIGS)
def test_linearised_values_have_the_exact_means_and_variances(name):
    """Means of the linearised values are the exact estimands; for the quantities with an
    exact variance in ``StreamResult.variances`` their variances are those."""
    task, ex = get(name)
    for from_mu, _ in draws_of(name):
        w, lin = linearised(task, ex, from_mu)
        for (s, q), x in lin.items():
            st = ex.streams[s]
            mean = np.tensordot(w, x, axes=1)
            m2 = float(np.max(np.tensordot(w, x * x, axes=1)))
            if q != "bound":  # the bound's influence values have mean 0 by construction
                target = getattr(st, q)
                assert rel(mean, target, max(np.sqrt(m2), 1e-300)) < RTOL, (name, s, q)
            if q in EXACT_VARIANCE and not (q == "gradient" and task.baseline == "mean"):
                var = np.tensordot(w, (x - mean) ** 2, axes=1)
                exact_var = st.variances[EXACT_VARIANCE[q]]
                assert rel(var, exact_var, max(m2, 1e-300)) < RTOL, (name, s, q)


def test_mean_baseline_gradient_is_the_sample_covariance():
    """Leave-one-out advantages: mean_k (R_k - mean_{l!=k} R_l) h_k = sample Cov(R, h)."""
    task, _ = get("weighted_prompts")
    assert task.baseline == "mean"
    mc = estimate(task, 500, np.random.default_rng(3))
    g, c = mc.gradient.mean, mc.covariance.mean
    assert rel(g, c, np.max(np.abs(c))) < RTOL


# ------------------------------------------------------------------ statistical tests

@pytest.mark.parametrize("name", CONFIGS)
def test_z_scores_of_every_estimator(name):  # noqa: C901
    """Every estimator of every stream, z with the exact se; threshold: Bonferroni over
    all entries, raised to the Bernstein bound where that is larger (module docstring)."""
    task, ex = get(name)
    seed = 20240 + CONFIGS.index(name)
    n = n_for(task)
    spreads = []  # (mc, {(stream, quantity): (mean, var, dev)})
    for k, (from_mu, _) in enumerate(draws_of(name)):
        mc = estimate(task, n, np.random.default_rng([seed, k]), use_sampler=from_mu)
        spreads.append((mc, exact_spreads(task, ex, from_mu)))
    m = sum(np.size(sp[1]) for _, d in spreads for sp in d.values())  # entries tested
    zb = bonferroni_z(ALPHA, m)
    zs, thr = {}, {}
    for mc, d in spreads:
        for (s, q), (_, var, dev) in d.items():
            zs[(s, q)] = z_score(mc.streams[s][q].mean, getattr(ex.streams[s], q), var, n)
            thr[(s, q)] = np.maximum(zb, bernstein_z(n, var, dev, ALPHA / m))
    bad = {k: float(np.max(np.abs(z) - thr[k]))
           for k, z in zs.items() if np.any(np.abs(z) > thr[k])}
    for (s, q), z in zs.items():
        WORST_Z[q] = max(WORST_Z.get(q, 0.0), float(np.max(np.abs(z))))
    assert not bad, (f"config {name}, seed {seed}: z past threshold (excess) {bad}; "
                     f"worst |z| {max(float(np.max(np.abs(z))) for z in zs.values()):.2f}, "
                     f"Bonferroni z {zb:.2f}")


@pytest.mark.parametrize("name", CONFIGS)
def test_sampled_frequencies_match_exact_probabilities(name):
    """Chi-square of response counts against n * P(y) (cells with n P < 5 pooled): one
    test per distribution drawn from, each at 1e-6 / (their number), so the test as a
    whole fails falsely with probability <= 1e-6."""
    task, ex = get(name)
    seq = ex.sequences
    keys = {(int(p),) + tuple(int(t) for t in tk): i
            for i, (p, tk) in enumerate(zip(seq["prompt"], seq["tokens"]))}
    alpha = ALPHA / len(draws_of(name))
    for from_mu, _ in draws_of(name):
        seed = 777 + CONFIGS.index(name)
        n = 20000
        d = sample(task, n, np.random.default_rng(seed), use_sampler=from_mu)
        idx = [keys[(int(p),) + tuple(int(t) for t in tk)]
               for p, tk in zip(d["prompt"], d["tokens"])]
        counts = np.bincount(idx, minlength=len(keys))
        prob = seq["sampler_prob"] if from_mu else seq["prob"]
        assert counts[prob == 0].sum() == 0, "sampled a response of probability 0"
        e = n * prob
        small = e < 5
        obs = np.append(counts[~small], counts[small].sum())
        exp_ = np.append(e[~small], e[small].sum())
        if exp_[-1] == 0:
            obs, exp_ = obs[:-1], exp_[:-1]
        stat = float(((obs - exp_) ** 2 / exp_).sum())
        pval = chi2.sf(stat, len(obs) - 1)
        assert pval >= alpha, (f"{name} from_mu={from_mu} seed={seed}: chi-square {stat:.1f} "
                               f"on {len(obs) - 1} dof, p = {pval:.2e} < {alpha:.1e}")


@pytest.mark.parametrize("name", CONFIGS)
def test_rao_blackwellised_token_sum_has_lower_variance(name):
    """Var(sum_t m(s_t)) < Var(h^2) for every parameter on the policy and centered
    streams of the shipped configs: a measured property of these configs, not a theorem
    (the token sum is not a conditional expectation of h^2; on the raw stream the ratio
    falls to 0.40). Each variance is a sum over the brute-force enumeration of
    tests/cases.py, and ``exact_variance_reduction`` must agree with it."""
    task, ex = get(name)
    for s in [s for s in ("policy", "centered") if s in ex.streams]:
        w, h2, g, _ = brute_values(f"config:{name}", s)
        ratio, var_g = brute_ratio(w, h2, g)
        live = var_g > 1e-12 * np.max(w @ g ** 2)  # the token sum is not constant
        assert ratio[live].min() > 1.0, (name, s, ratio[live].min())
        lib = exact_variance_reduction(ex, s)
        assert rel(lib[live], ratio[live], np.max(ratio[live])) < 1e-8, (name, s)


@pytest.mark.parametrize("name", CONFIGS)
def test_variance_reduction_is_the_ratio_of_the_draws_variances(name):
    """``variance_reduction(mc)`` against the variances of the same draws' h^2 and token
    sums, each value looked up in the brute-force enumeration (its own scores, own
    token Fisher) and each variance taken here."""
    task, _ = get(name)
    mc = estimate(task, 3000, np.random.default_rng(11), use_sampler=False)
    w, h2, g, rows = brute_values(f"config:{name}", "policy")
    k = rows_of_draws(mc.draws, rows)
    vh, vg = np.var(h2[k], axis=0, ddof=1), np.var(g[k], axis=0, ddof=1)  # (P,) each
    live = vg > 1e-12 * np.max(g[k] ** 2)
    got = variance_reduction(mc)
    assert rel(got[live], vh[live] / vg[live], np.max(vh[live] / vg[live])) < 1e-8, name


def _coverage_p0(n, skew, exkurt, z=1.959963984540054):
    """Edgeworth coverage of mean -/+ z se (se with ddof=1) for n iid draws (Hall 1992):
    2 Phi(z) - 1 + (2/n) phi(z) z [k(z^2-3)/12 - g^2(z^4+2z^2-3)/18 - (z^2+3)/4 + 1/2]."""
    p2 = z * (exkurt * (z * z - 3) / 12 - skew ** 2 * (z ** 4 + 2 * z * z - 3) / 18
              - (z * z + 3) / 4 + 0.5)
    return 2 * norm.cdf(z) - 1 + 2 * p2 * norm.pdf(z) / n


def test_nominal_intervals_cover_at_the_predicted_rate():
    """1000 independent runs of n = 400 on ``tabular``: count how often mean -/+ 1.96 se
    (sample se) covers the exact value, for four scalar estimands. The expected coverage
    p0 is 0.95 corrected by the O(1/n) Edgeworth term computed from the exact skewness and
    kurtosis (it is 0.9488-0.9493 here); the count must lie in the binomial
    band of p0 -/+ 0.002 (the O(n^-2) remainder) at false-failure 1e-6 / 4.

    The 1e-6 rate is exact for the binomial part; the 0.002 allowance for the Edgeworth
    remainder is a judgement (the remainder at n = 400 is of order 1/n^2 ~ 6e-6 times
    moment factors), not a proven bound."""
    task, ex = get("tabular")
    n, runs = 400, 1000
    w, lin = linearised(task, ex, False)
    moments = {}
    for q in ("score_mean", "sequence_fisher", "token_fisher_sum"):
        x = lin[("policy", q)]
        mean = w @ x
        var = w @ (x - mean) ** 2
        sk = np.where(var > 0, w @ (x - mean) ** 3 / np.where(var > 0, var, 1) ** 1.5, np.inf)
        i = int(np.argmin(np.abs(sk)))  # the least skewed parameter: light tails
        moments[(q, i)] = x[:, i]
    moments[("expected_reward", None)] = lin[("policy", "expected_reward")]
    covered = dict.fromkeys(moments, 0)
    for seq in np.random.SeedSequence(99).spawn(runs):
        mc = estimate(task, n, np.random.default_rng(seq), use_sampler=False)
        for (q, i) in moments:
            e, ev = mc.streams["policy"][q], getattr(ex, q)
            mean, se, truth = (e.mean, e.se, ev) if i is None else (e.mean[i], e.se[i], ev[i])
            covered[(q, i)] += abs(mean - truth) <= 1.959963984540054 * se
    a = ALPHA / len(moments)
    for key, x in moments.items():
        mu = w @ x
        var = w @ (x - mu) ** 2
        skew, kurt = w @ (x - mu) ** 3 / var ** 1.5, w @ (x - mu) ** 4 / var ** 2 - 3
        p0 = _coverage_p0(n, skew, kurt)
        lo, hi = binom.ppf(a / 2, runs, p0 - 0.002), binom.isf(a / 2, runs, p0 + 0.002)
        print(f"coverage {key}: {covered[key]}/{runs}, predicted p0 {p0:.4f}, band [{lo:.0f}, {hi:.0f}]")
        assert lo <= covered[key] <= hi, (key, covered[key], (lo, hi), p0, skew, kurt, "seed 99")


@pytest.mark.parametrize("name", OFFPOLICY)
def test_offpolicy_raw_score_is_biased_centered_is_not(name):
    task, ex = get(name)
    n = n_for(task)
    mc = estimate(task, n, np.random.default_rng(41))
    assert set(mc.streams) == {"raw", "centered"}
    raw, ex_raw = mc.streams["raw"]["score_mean"], ex.streams["raw"]
    # Two checks share the 1e-6 of the test, 5e-7 each. Detecting the raw score's bias:
    # the entry with the largest expected |z| against 0, z_true = |E_mu[h]| /
    # sqrt(Var(h)/n), must clear the threshold zb0. By design z_true >= zb0 + 4.892, so a
    # miss has probability <= Phi(-4.892) < 5e-7.
    sd = np.sqrt(ex_raw.variances["h"] / n)  # (P,)
    z_true = np.abs(ex_raw.score_mean) / np.where(sd > 0, sd, np.inf)
    i, zb0 = int(np.argmax(z_true)), bonferroni_z(ALPHA, task.model.num_params)
    assert z_true[i] >= zb0 + 4.892, (name, z_true[i], zb0)  # the test has the power it claims
    z_obs = abs(raw.mean[i]) / sd[i]
    assert z_obs > zb0, f"{name} seed=41: raw bias undetected, |z|={z_obs:.2f} <= {zb0:.2f}"
    assert np.max(np.abs(ex.streams["raw"].score_mean)) > 0.01
    assert np.max(np.abs(ex.streams["centered"].score_mean)) < 1e-12
    # ... and every entry of three estimators against its exact value, at 5e-7 in all
    w, lin = linearised(task, ex, True)
    keys = (("raw", "score_mean"), ("centered", "score_mean"), ("raw", "importance_gradient"))
    m = len(keys) * task.model.num_params
    zb = bonferroni_z(ALPHA / 2, m)
    for s, q in keys:
        x = lin[(s, q)]
        mean = w @ x
        var, dev = w @ (x - mean) ** 2, np.max(np.abs(x[w > 0] - mean), axis=0)
        z = z_score(mc.streams[s][q].mean, getattr(ex.streams[s], q), var, n)
        thr = np.maximum(zb, bernstein_z(n, var, dev, ALPHA / 2 / m))
        assert np.all(np.abs(z) <= thr), (f"{name} {s} {q} seed=41: max |z| "
                                          f"{np.max(np.abs(z)):.2f}, excess {np.max(np.abs(z) - thr):.2f}")
    # the importance-weighted raw gradient targets the on-policy gradient: against
    # autograd of E_p[R] (the policy stream's E[A h] sums the same products P(y) A h)
    ig, on = ex.streams["raw"].importance_gradient, ex.streams["policy"]
    scale = np.sqrt(on.reward_std ** 2 + on.expected_reward ** 2 + on.baseline ** 2) \
        * np.sqrt(on.sequence_fisher.max())
    assert rel(ig, ex.gradient_autodiff, max(scale, np.max(np.abs(ig)))) < RTOL


def test_check_monte_carlo_passes():
    """Every row passes on the shipped configs (the scale configs are not shipped in
    ``list_configs()`` and are not run here); each config's check at 1e-6 / (number of
    configs), so the test fails falsely with probability <= 1e-6."""
    for name in SMALL:
        task, ex = get(name)
        rows = check_monte_carlo(task, ex, n_for(task), seed=1, alpha=ALPHA / len(SMALL))
        bad = [(r.stream, r.quantity, f"|z|={r.max_abs_z:.2f} > {r.threshold:.2f}")
               for r in rows if not r.passed]
        assert not bad, f"{name} seed=1: {bad}"
        names = {(r.stream, r.quantity) for r in rows}
        assert ("policy", "sequence_fisher") in names
        if task.sampler is not None:
            assert ("raw", "importance_gradient") in names and ("centered", "cross_terms") in names


# ------------------------------------------------------------------ rng and inputs

def test_rng_is_honoured_and_global_state_untouched():
    task, _ = get("offpolicy_temperature")
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = estimate(task, 300, np.random.default_rng(7), keep_samples=True)
    b = estimate(task, 300, np.random.default_rng(7), keep_samples=True)
    c = estimate(task, 300, np.random.default_rng(8), keep_samples=True)
    assert np.array_equal(np.random.get_state()[1], before)
    assert np.array_equal(a.draws["tokens"], b.draws["tokens"])
    for q in a.streams["raw"]:
        assert np.array_equal(a.streams["raw"][q].mean, b.streams["raw"][q].mean)
    assert not np.array_equal(a.draws["tokens"], c.draws["tokens"])
    assert not np.array_equal(a.streams["raw"]["sequence_fisher"].mean,
                              c.streams["raw"]["sequence_fisher"].mean)


def test_default_stream_choice_and_samples():
    task, _ = get("offpolicy_stale")
    assert set(estimate(task, 10, np.random.default_rng(0)).streams) == {"raw", "centered"}
    mc = estimate(task, 10, np.random.default_rng(0), use_sampler=False, keep_samples=True)
    assert set(mc.streams) == {"policy"}
    s = mc.samples["policy"]
    P, T = task.model.num_params, task.max_len
    assert s["h2"].shape == s["token_sum"].shape == s["Ah"].shape == (10, P)
    assert s["reward"].shape == (10,) and s["xi"].shape == (10, T, P)
    assert mc.cross_terms.mean.shape == (T, T, P)
    assert estimate(task, 10, np.random.default_rng(0)).samples is None
    with pytest.raises(AttributeError, match="no 'policy' stream"):
        estimate(task, 10, np.random.default_rng(0)).sequence_fisher


def test_bad_input_raises_clear_errors():
    task, _ = get("default")
    rng = np.random.default_rng(0)
    for n in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="n .*must be an integer >= 1"):
            estimate(task, n, rng)
    with pytest.raises(ValueError, match="n .*must be an integer >= 1"):
        sample(task, 0, rng)
    for bad in (0, None, np.random.RandomState(0)):
        with pytest.raises(TypeError, match="numpy.random.Generator"):
            estimate(task, 10, bad)
    with pytest.raises(ValueError, match="use_sampler=True but task .* has no sampler"):
        estimate(task, 10, rng, use_sampler=True)
    with pytest.raises(ValueError, match="leave-one-out.*n >= 2"):
        estimate(load_config("weighted_prompts"), 1, rng)
