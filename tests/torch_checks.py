"""Holding a torch-engine result against the numpy engine's ExactResult, quantity by
quantity, each judged on its scale (fisher_ref.checks.tolerances)."""
import numpy as np

from fisher_ref.checks.tolerances import rel_error, scale

STREAM_QUANTITIES = ("score_mean", "sequence_fisher", "token_fisher_sum",
                     "token_fisher_sum_paths", "token_fisher_by_depth", "cross_terms",
                     "gradient", "covariance", "bound", "correlation", "expected_reward",
                     "reward_std", "importance_gradient", "baseline", "mass")


def jmax_of(task, ref):
    """Largest |j| of each parameter over the kept states (numpy sensitivities)."""
    from fisher_ref.checks.compare import exact_state_sensitivities
    return exact_state_sensitivities(task, ref)[2]  # (P,)


def mismatches(task, ref, out, tol):
    """Names and relative errors of every array of ``out`` (torch_exact) off ``ref`` by
    more than ``tol``; token arrays must be equal."""
    bad = {}

    def check(name, a, b, s=None):
        _, r = rel_error(a, b, s)
        if not r <= tol:
            bad[name] = r

    jmax = jmax_of(task, ref) if ref.states is not None else None
    assert set(out["streams"]) == {s for s in ref.streams if not s.startswith("top")}
    for sname, d in out["streams"].items():
        st = ref.streams[sname]
        for q in STREAM_QUANTITIES:
            check(f"{sname}.{q}", d[q], getattr(st, q), scale(q, st, jmax, task.max_len))
        # Var(x) = E[x^2] - E[x]^2, judged on the scale of the mean it subtracts (a
        # constant per-response value has a variance that is rounding noise on both sides)
        means = {"h": st.sequence_fisher, "h2": st.sequence_fisher ** 2,
                 "token_sum": st.token_fisher_sum_paths ** 2, "Ah": st.gradient ** 2,
                 "cross": st.cross_terms ** 2, "reward": st.reward_std ** 2}
        for k, v in d["variances"].items():
            b = st.variances[k]
            check(f"{sname}.variances.{k}", v, b,
                  max(float(np.max(np.abs(b))), float(np.max(means[k]))))
    check("gradient_autodiff", out["gradient_autodiff"], ref.gradient_autodiff,
          scale("gradient", ref.streams["policy"]))
    if out["states"] is not None:
        assert np.array_equal(out["states"]["tokens"], ref.states["tokens"])
        for k in ("prompt", "depth"):
            assert np.array_equal(out["states"][k], ref.states[k])
        for k in ("reach", "probs", "token_fisher", "uniform"):
            check(f"states.{k}", out["states"][k], ref.states[k])
    if out["sequences"] is not None:
        assert np.array_equal(out["sequences"]["tokens"], ref.sequences["tokens"])
        for k in ("prob", "sampler_prob", "reward"):
            check(f"sequences.{k}", out["sequences"][k], ref.sequences[k])
    return bad
