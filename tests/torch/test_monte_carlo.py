"""Monte Carlo in torch (fisher_ref.torch.monte_carlo) against the exact values, for the
MLP and the GPT-2 adapters."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

from fisher_ref import load_config  # noqa: E402
from fisher_ref.engine.fast import exact  # noqa: E402
from fisher_ref.monte_carlo.ztests import bernstein_ratio
from fisher_ref.torch.exact import torch_exact  # noqa: E402
from fisher_ref.torch.monte_carlo import torch_monte_carlo  # noqa: E402

pytestmark = pytest.mark.torch

MC_ALPHA = 1e-6  # false-failure rate per test, split over its 2 quantities and P parameters


@pytest.mark.parametrize("config, seed, n", [("default", 1234, 3000), ("gpt2_small", 99, 1500)])
def test_monte_carlo_matches_exact_within_bernstein_bound(config, seed, n):
    """|mean - exact| <= the Bernstein half-width at 1e-6 per test (Bonferroni over both
    quantities and every parameter), floored at rounding level for constant values; a
    normal z-threshold is not used because h^2 is heavy-tailed."""
    task = load_config(config)
    pol = exact(task, progress=False).streams["policy"]
    ranges = torch_exact(task, keep_states=False, keep_sequences=False)["ranges"]
    est = torch_monte_carlo(task, n, torch.Generator().manual_seed(seed))
    for q, var_key in (("sequence_fisher", "h2"), ("token_fisher_sum", "token_sum")):
        mean, _ = est[q]
        exact_v, var = getattr(pol, q), pol.variances[var_key]
        ratio = bernstein_ratio(mean - exact_v, n, var, ranges[q],
                                MC_ALPHA / (2 * exact_v.size), exact_v)  # (P,)
        live = var > 0
        z = (mean[live] - exact_v[live]) / np.sqrt(var[live] / n)
        assert np.max(ratio) <= 1.0, \
            f"{config} seed={seed} {q}: max|diff|/t={np.max(ratio):.3f}, max|z|={np.max(np.abs(z)):.2f}"


def test_monte_carlo_refuses_too_few_samples():
    with pytest.raises(ValueError, match="n >= 2"):
        torch_monte_carlo(load_config("default"), 1, torch.Generator())
