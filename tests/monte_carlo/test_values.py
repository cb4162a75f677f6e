"""Per-response values of given responses (fisher_ref.monte_carlo.values): the scores of
each stream, the importance weight and the Rao-Blackwellised token sum, recomputed one
state at a time. tests/monte_carlo/test_sampling.py holds the values of every response,
weighted by its exact probability, to the exact engine's means and variances."""
import numpy as np

from fisher_ref.monte_carlo.sampling import sample
from fisher_ref.monte_carlo.values import sample_values
from tests.monte_carlo.test_sampling import RTOL, get


def test_sample_values_match_a_direct_computation():
    """xi = j[:, y] - jbar at each visited state, recomputed one state at a time."""
    from fisher_ref.numerics import log_softmax
    from fisher_ref.models.base import windows_for
    from fisher_ref.models.sensitivities import sensitivities
    from fisher_ref.numerics import mean_sensitivity, token_fisher
    task, _ = get("offpolicy_stale")
    d = sample(task, 12, np.random.default_rng(5), use_sampler=True)
    vals = sample_values(task, d, True)
    m = task.model
    for i in range(12):
        state = list(task.prompts[d["prompt"][i]])
        log_rho = 0.0
        for t, y in enumerate(d["tokens"][i]):
            if y < 0:
                assert np.all(vals["raw"]["xi"][i, t] == 0)
                continue
            W = windows_for([state], m.context, m.bos)
            J = sensitivities(m, task.theta, W)[0]  # (P, V)
            p = np.exp(log_softmax(m.logits(task.theta, W)))[0]
            q = np.exp(log_softmax(task.sampler.logits(m, task.theta, W)))[0]
            np.testing.assert_allclose(vals["raw"]["xi"][i, t], J[:, y] - mean_sensitivity(p, J),
                                       rtol=RTOL, atol=1e-14)
            np.testing.assert_allclose(vals["centered"]["xi"][i, t], J[:, y] - q @ J.T,
                                       rtol=RTOL, atol=1e-14)
            log_rho += np.log(p[y]) - np.log(q[y])
            state.append(int(y))
        np.testing.assert_allclose(vals["rho"][i], np.exp(log_rho), rtol=RTOL)
    on = sample_values(task, d, False)["policy"]  # policy stream: token_sum = sum_t f(s_t)
    i = int(np.argmax((d["tokens"] >= 0).sum(axis=1)))
    state, f = list(task.prompts[d["prompt"][i]]), 0.0
    for y in d["tokens"][i][d["tokens"][i] >= 0]:
        W = windows_for([state], m.context, m.bos)
        p = np.exp(log_softmax(m.logits(task.theta, W)))
        f = f + token_fisher(p, sensitivities(m, task.theta, W))[0]
        state.append(int(y))
    np.testing.assert_allclose(on["token_sum"][i], f, rtol=RTOL, atol=1e-14)
