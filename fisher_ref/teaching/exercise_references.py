"""The references the judges of lessons 0-6's exercises compute, each by its own route
from the setup's variables (not the solution's), and the judge of the open-ended
exercise ``anti-aligned``. The exercises themselves are in
:mod:`fisher_ref.teaching.exercise_bank`.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.models.base import ModelSpec
from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import softmax, token_fisher, uniform_token_fisher
from fisher_ref.teaching.training import policy_gradient
from fisher_ref.teaching.views import concentration

__all__ = ["anti_aligned", "expected_params", "expected_mean_length", "expected_b2",
           "expected_one_token", "expected_concentration", "expected_adam2", "expected_overlaps",
           "expected_c_best", "expected_needed"]


def anti_aligned(value, ns):
    r"""The judge of ``anti-aligned``: accept ``(p, j)`` with :math:`f/f^{unif} < 1` and
    alignment factor :math:`f/(\kappa f^{unif}) > 1`.

    Args:
        value: the learner's ``(p, j)``, two vectors of one length :math:`V \ge 2`.
        ns: the setup's variables (unused: the exercise is open-ended).

    Returns:
        ``(ok, message)``.
    """
    try:
        p, j = (np.asarray(v, dtype=float) for v in value)
    except (TypeError, ValueError):
        return False, "set answer = (p, j): two arrays of the same length V"
    if p.ndim != 1 or j.shape != p.shape or p.size < 2:
        return False, f"p and j must be vectors of one length V >= 2, got {p.shape} and {j.shape}"
    if not (np.all(np.isfinite(j)) and np.all(p >= 0) and abs(p.sum() - 1) <= 1e-9):
        return False, "p must be a probability vector (non-negative, summing to 1), j finite"
    f = float(token_fisher(p, j[None])[0])
    fu = float(uniform_token_fisher(j[None])[0])
    if fu <= 0:
        return False, "j moves every logit alike, so f_unif = 0 and the ratio is undefined"
    kappa = float(concentration(p))
    ratio, a = f / fu, f / (kappa * fu) if kappa > 0 else np.inf
    ok = ratio < 1 < a
    return ok, (f"f/f_unif = {ratio:.3f}, alignment factor alpha = {a:.3f}: "
                + ("below uniform, yet above its shuffles" if ok else
                   "need f/f_unif < 1 and alpha > 1"))


def expected_params(ns):
    """``count-params``: the medium config's parameter count, from the model's own layout."""
    return ModelSpec(vocab_size=12, context=2, embed_dim=8, hidden=32).num_params


def expected_mean_length(ns):
    """``expected-length``: E[number of drawn tokens] from the states (each drawn token is
    one state reached)."""
    return ns["r"].states["reach"].sum()


def expected_b2(ns):
    """``b2-moves-logits``: :math:`\\partial z_a / \\partial b2_b` at the window, ``(V, V)``,
    from the model's analytic sensitivities."""
    J = sensitivities(ns["task"].model, ns["task"].theta, ns["window"])  # (1, P, V)
    return J[0, ns["off"]:ns["off"] + ns["V"]]


def expected_one_token(ns):
    """``predict-one-token``: the token Fisher of :math:`j = (1, 0, 0, 0, 0)` under ``p``."""
    return token_fisher(ns["p"], np.eye(5)[:1])[0]


def expected_concentration(ns):
    """``temperature-concentration``: :math:`\\kappa` of :math:`\\mathrm{softmax}(\\beta z)`
    for each :math:`\\beta`, shape ``(B,)``."""
    return concentration(softmax(ns["betas"][:, None] * ns["z"][None]))  # (B,)


def expected_adam2(ns):
    """``adam-second-step``: Adam's second step, ``(P,)``, from the training code."""
    tr = policy_gradient(ns["task"], steps=2, lr=ns["lr"], optimizer="adam", eps=ns["eps"])
    return tr.thetas[2] - tr.thetas[1]


def expected_overlaps(ns):
    """``overlap-spread``: top-n overlap of F with cap * corr**s, from sorted index sets (rank order by F)."""
    n, F = ns["n"], ns["F"]
    by_f = set(np.argsort(-F, kind="stable")[:n].tolist())
    out = []
    for s in ns["svals"]:
        g_s = ns["cap"] * ns["corr"] ** s                  # (P,) |G_s|; corr ** 0 = 1
        out.append(len(by_f & set(np.argsort(-g_s, kind="stable")[:n].tolist())) / n)
    return np.array(out)


def expected_c_best(ns):
    """``best-constant``: the constant :math:`c` nearest the policy gradient, from the
    vertex of a parabola fitted through three constants (not the projection formula)."""
    raw, g = ns["raw"], ns["g"]
    cs = np.array([-1.0, 0.0, 1.0])
    d2 = [np.sum((raw.gradient_with_constant(c) - g) ** 2) for c in cs]  # a parabola in c
    a, b, _ = np.polyfit(cs, d2, 2)
    return -b / (2 * a)


def expected_needed(ns):
    """``samples-needed``: the smallest :math:`n` with a standard error of 1% of
    :math:`F_i`."""
    return np.ceil(ns["var_h2"] / (0.01 * ns["F"]) ** 2)
