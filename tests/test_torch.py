"""The torch side (fisher_ref.torch.model / torch_exact / torch_mc) against fisher_ref."""
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the torch extra is needed (CI installs it)")

from fisher_ref import list_configs, load_config
from fisher_ref.compare import TOL_FLOAT32, rel_error
from fisher_ref.mc_stats import bernstein_ratio
from fisher_ref.exact import exact
from fisher_ref.model import MLPModel, ModelSpec
from fisher_ref.samplers import LogitsSampler, RoundedSampler
from fisher_ref.sensitivities import sensitivities
from fisher_ref.token_fisher import token_fisher as np_token_fisher
from fisher_ref.torch.exact import STREAM_QUANTITIES, torch_exact
from fisher_ref.torch.model import TorchMLP, resolve_dtype, token_fisher, torch_model
from fisher_ref.torch.monte_carlo import torch_monte_carlo

pytestmark = pytest.mark.torch

RTOL = 1e-10  # float64 against float64: same arithmetic, other order
MC_ALPHA = 1e-6  # false-failure rate per Monte Carlo test (Bonferroni across its checks)
MLP_CONFIGS = [c for c in list_configs() if load_config(c).model.name == "mlp_window"]


@pytest.fixture(scope="module")
def refs():
    return {c: exact(load_config(c), progress=False) for c in MLP_CONFIGS}


def _quantities(task, ref, out):
    """(name, torch, exact, scale) for every quantity both sides compute."""
    for key in ("reach", "probs", "token_fisher", "uniform"):
        yield f"states.{key}", out["states"][key], ref.states[key], None
    assert np.array_equal(out["states"]["tokens"], ref.states["tokens"])
    assert np.array_equal(out["sequences"]["tokens"], ref.sequences["tokens"])
    for key in ("prob", "sampler_prob", "reward"):
        yield f"sequences.{key}", out["sequences"][key], ref.sequences[key], None
    assert set(out["streams"]) == set(ref.streams)
    for s, d in out["streams"].items():
        st = ref.streams[s]
        for q in STREAM_QUANTITIES:
            scale = np.sqrt(np.max(st.sequence_fisher)) if q == "score_mean" else None
            yield f"{s}.{q}", d[q], getattr(st, q), scale
    yield "gradient_autodiff", out["gradient_autodiff"], ref.gradient_autodiff, None


def _check(task, ref, out, tol):
    bad = []
    for name, a, b, scale in _quantities(task, ref, out):
        _, rel = rel_error(a, b, scale)
        if not rel <= tol:
            bad.append(f"{name}: rel {rel:.3g} > {tol:g}")
    assert not bad, f"{task.name}: " + "; ".join(bad)


@pytest.mark.parametrize("config", MLP_CONFIGS)
def test_float64_matches_exact_engine(config, refs):
    task = load_config(config)
    _check(task, refs[config], torch_exact(task, "cpu", "float64"), RTOL)


@pytest.mark.parametrize("config", MLP_CONFIGS)
def test_float32_within_documented_tolerance(config, refs):
    task = load_config(config)
    _check(task, refs[config], torch_exact(task, "cpu", "float32"), TOL_FLOAT32)


@pytest.mark.parametrize("sampler", [RoundedSampler(1), LogitsSampler(
    lambda W: np.where(np.arange(5)[None, :] == 1, 1.0, 0.0) + 0.1 * W[:, -1:])],
    ids=["rounded", "custom"])
def test_other_sampler_kinds_match(sampler):
    task = load_config("default").with_(sampler=sampler)
    _check(task, exact(task, progress=False), torch_exact(task, "cpu", "float64"), RTOL)


def test_tabular_model_is_not_implemented():
    with pytest.raises(NotImplementedError, match="arch 'tabular'"):
        torch_exact(load_config("tabular"))


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_dtype("float8")


def test_jacrev_sensitivities_match_fisher_ref():
    model = MLPModel(ModelSpec(vocab_size=6, context=3, embed_dim=2, hidden=5))
    theta = np.random.default_rng(0).standard_normal(model.num_params)
    W = np.random.default_rng(1).integers(0, 7, size=(11, 3))  # BOS id 6 included
    tm = TorchMLP(model)
    got = tm.sensitivities(tm.theta(theta), torch.as_tensor(W)).numpy()  # (B, P, V)
    want = sensitivities(model, theta, W)
    assert got.shape == want.shape == (11, model.num_params, 6)
    _, rel = rel_error(got, want)
    assert rel <= RTOL


def test_token_fisher_snippet_matches_fisher_ref():
    rng = np.random.default_rng(2)
    z = 3.0 * rng.standard_normal((7, 4))  # (B, V)
    sens = rng.standard_normal((7, 9, 4))  # (B, P, V)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    got = token_fisher(torch.as_tensor(z), torch.as_tensor(sens)).numpy()
    _, rel = rel_error(got, np_token_fisher(p, sens))
    assert rel <= RTOL


def test_monte_carlo_matches_exact_within_bernstein_bound(refs):
    """|mean - exact| <= Bernstein half-width; the test's false-failure rate 1e-6 is
    split over its two quantities and their parameters (Bonferroni); a normal
    z-threshold is not used because h^2 is heavy-tailed here (range up to ~300
    standard deviations)."""
    seed, n = 1234, 3000
    task = load_config("default")
    pol = refs["default"].streams["policy"]
    ranges = torch_exact(task)["ranges"]
    est = torch_monte_carlo(task, n, torch.Generator().manual_seed(seed))
    quantities = (("sequence_fisher", "h2"), ("token_fisher_sum", "token_sum"))
    for q, var_key in quantities:
        mean, se = est[q]
        exact_v, var = getattr(pol, q), pol.variances[var_key]
        # the shared rule: Bernstein half-width at 1e-6 / (2 P) per entry, floored at
        # rounding level for values that are constant over responses (variance = rounding)
        ratio = bernstein_ratio(mean - exact_v, n, var, ranges[q],
                                MC_ALPHA / (len(quantities) * exact_v.size), exact_v)  # (P,)
        live = var > 0
        z = (mean[live] - exact_v[live]) / np.sqrt(var[live] / n)
        assert np.max(ratio) <= 1.0, \
            f"seed={seed} {q}: max|diff|/t={np.max(ratio):.3f}, max|z|={np.max(np.abs(z)):.2f}"


def test_ranges_bound_the_exact_variances(refs):
    """Var(X) <= b^2 for |X - E X| <= b: the ranges are consistent with fisher_ref."""
    ranges = torch_exact(load_config("default"))["ranges"]
    pol = refs["default"].streams["policy"]
    for q, var_key in (("sequence_fisher", "h2"), ("token_fisher_sum", "token_sum")):
        assert np.all(pol.variances[var_key] <= ranges[q] ** 2 * (1 + 1e-9) + 1e-300)


def test_monte_carlo_refuses_too_few_samples():
    with pytest.raises(ValueError, match="n >= 2"):
        torch_monte_carlo(load_config("default"), 1, torch.Generator())


def test_non_mlp_model_named_in_error():
    with pytest.raises(NotImplementedError, match="mlp_window"):
        torch_model(load_config("tabular").model)
