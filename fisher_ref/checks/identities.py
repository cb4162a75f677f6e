r"""Check every identity of docs/theory.md (§2.9, §3) on a task and print it as a table.

Each row compares two routes to one quantity, or a quantity that must vanish
with its natural scale (docs/theory.md §9.3):

- ``equal`` rows: relative error :math:`\max|a-b| / \max(\max|a|, \max|b|)`, for
  gradients with the denominator at least the size of their summands;
- ``zero`` rows: :math:`\max|x|` over the natural scale — :math:`\max_i F_i` for
  products of two scores (cross terms), the score scale
  (:func:`~fisher_ref.checks.score_scale.state_score_scale`) for scores;
- ``bound`` rows: the largest excess of the left side over the right, scaled
  the same way (must be :math:`\le` the tolerance);
- ``info`` rows report a diagnostic (the top-k overlap and its two spreads, the shares
  of ratios to the uniform reference below 1, the raw score's mean where
  the sampler equals the policy) and always pass;
- ``z`` rows (Monte Carlo) report, for each estimator, the :math:`|z|` of the
  entry (parameter) nearest its threshold; thresholds are per entry, the larger
  of the Bonferroni normal one and a Bernstein bound over every entry of every
  row, so that all the Monte Carlo rows together fail falsely with probability at
  most 1e-6 (see :func:`fisher_ref.monte_carlo.check_monte_carlo`).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from fisher_ref.checks.offpolicy_rows import (SAMPLER_GAP, constant_rows,  # noqa: F401
                                             raw_bias_row, bound_broken_at_zero,
                                             constant_breaking_bound, sampler_gap)
from fisher_ref.checks.score_scale import (distinct_windows, state_score_scale,  # noqa: F401
                                          window_score_scale)
from fisher_ref.checks.table import Check, format_table
from fisher_ref.checks.tolerances import (EXACT_RTOL, GRADIENT_FLOOR, fisher_scale, gradient_scale,
                                         rel_err)
from fisher_ref.limits import TINY_REWARD as LIMIT_TINY_REWARD, check_seed
from fisher_ref.results import require_all_quantities
from fisher_ref.rewards import Reward
from fisher_ref.models.sensitivities import sensitivities, sensitivities_autograd
from fisher_ref.tasks import require_task
from fisher_ref.numerics import token_fisher, token_fisher_pairwise, uniform_token_fisher

__all__ = ["Check", "exact_checks", "format_table", "verify_task", "concentration",
           "state_score_scale", "sampler_gap",
           "EXACT_RTOL", "constant_breaking_bound", "bound_broken_at_zero"]

MC_ALPHA = 1e-6  # false-failure rate of all Monte Carlo rows together
WEAK_POWER = 3.0  # a row whose threshold exceeds this multiple of the Bonferroni-normal
#                   one (skewed, rarely non-zero values) is flagged as having little power
_SHIFT_STATES = 256  # states on which the pairwise form and the logit shift are re-derived
_ARRANGEMENT_V = 7  # the mean over all V! arrangements of p is checked up to this V ...
_ARRANGEMENT_STATES = 8  # ... on this many states
#: f(j + c) is formed from sensitivities of size max|j + c|, centered on their mean: the
#: centering rounds each by about V eps max|j + c|, which moves f by up to 2 sqrt(f)
#: times that; below the floor (2 V eps max|j + c| / EXACT_RTOL)^2 that is more than
#: EXACT_RTOL of f, so f is judged against the floor there (f = 0 when j = 0).
SHIFT_ROUNDING = 2 * np.finfo(float).eps / EXACT_RTOL


def _stream_checks(name, s, T, centered, state_scale=0.0):
    r"""Identities 1-3 and 7 for one stream whose score is centered on its drawing
    distribution; scores that must vanish are measured against the larger of
    :math:`\sqrt{\max F}` and the state-level score scale (:func:`state_score_scale`)."""
    F = s.sequence_fisher
    sF, rF = fisher_scale(F), np.sqrt(fisher_scale(F))
    sS = max(rF, np.sqrt(state_scale))  # score scale
    gfloor = GRADIENT_FLOOR * gradient_scale(s, score_scale=sS)
    off = s.cross_terms[~np.eye(T, dtype=bool)]
    rows = [
        Check("1 zero-mean score", name, "max_s |E[xi|s]| / score scale",
              float(s.cond_score_max.max() / sS), EXACT_RTOL, "zero",
              "score scale: sqrt of the largest F, f(s), f_unif(s)"),
        Check("1 zero-mean score", name, "max |E[h]| / score scale",
              float(np.abs(s.score_mean).max() / sS), EXACT_RTOL, "zero"),
        Check("2 cross terms vanish", name, "max_{u!=t} |C[u,t]| / max F",
              float(np.abs(off).max(initial=0.0) / sF), EXACT_RTOL, "zero"),
        Check("2 cross terms vanish", name, "sum_{u,t} C[u,t] = F",
              rel_err(s.cross_terms.sum(axis=(0, 1)), F), EXACT_RTOL),
        Check("3 sequence -> token", name, "F = sum_s pi(s) f(s)",
              rel_err(F, s.token_fisher_sum), EXACT_RTOL),
        Check("3 sequence -> token", name, "F = E[sum_t f(s_t)] (by responses)",
              rel_err(F, s.token_fisher_sum_paths), EXACT_RTOL),
        Check("7 covariance", name, "E[A h] = Cov(A, h)",
              rel_err(s.gradient, s.covariance, gfloor), EXACT_RTOL, "equal",
              "their difference is (E[R]-b) E[h]: a consequence of identity 1"),
        Check("7 covariance", name, "E[(A+1) h] = E[A h]",
              rel_err(s.gradient_with_constant(1.0), s.gradient,
                      GRADIENT_FLOOR * gradient_scale(s, 1.0, sS)), EXACT_RTOL, "equal",
              "their difference is E[h]: a consequence of identity 1"),
        Check("7 bound", name, "max(|G| - std(A) sqrt(F)) / max|G|",
              float(np.max(np.abs(s.covariance) - s.bound)
                    / max(np.abs(s.covariance).max(), gfloor, np.finfo(float).tiny)),
              EXACT_RTOL, "bound", "|G| at least its natural scale, as for gradients"),
        Check("7 bound", name, "max |corr(A, h)| <= 1", float(s.correlation.max()),
              1.0 + EXACT_RTOL, "bound"),
    ]
    return rows if centered else []


def _arrangement_mean(p, J, perms):
    r"""Mean of the token Fisher over the arrangements ``perms`` of ``p`` across the tokens.

    Args:
        p: ``(V,)`` next-token probabilities of one state.
        J: ``(P, V)`` its sensitivities.
        perms: ``(K, V)`` permutations of ``range(V)``.

    Returns:
        ``(P,)``: :math:`\frac1K \sum_\pi f_i(p_\pi)`, each arrangement's Fisher formed by
        the centered form.
    """
    return token_fisher(p[perms], J[None]).mean(axis=0)  # (K, V), (1, P, V) -> (P,)


def concentration(p):
    r""":math:`\kappa(s) = (1 - \sum_a p_a^2)/(1 - 1/V)`, shape ``(...)`` for ``p`` of shape
    ``(..., V)``: 1 for a uniform ``p``, 0 for a point mass."""
    V = p.shape[-1]
    # 1 - sum p^2 = sum_a p_a (sum of the others), the others summed, not 1 - p_a: no
    # cancellation when p is nearly a point mass
    before = np.concatenate([np.zeros_like(p[..., :1]), np.cumsum(p, axis=-1)[..., :-1]], axis=-1)
    after = np.flip(np.concatenate([np.zeros_like(p[..., :1]),
                                    np.cumsum(np.flip(p, -1), axis=-1)[..., :-1]], axis=-1), -1)
    return np.sum(p * (before + after), axis=-1) / (1.0 - 1.0 / V)


def _state_form_checks(result):
    """Identities 4 and 5 re-derived on up to ``_SHIFT_STATES`` states; without the kept
    per-state arrays, one info row says why they are not there."""
    task, st = result.task, result.states
    if st is None:
        return [Check("4-5 pairwise, uniform reference", "policy", "not checked: the per-state "
                      "arrays were not kept (exact(..., options=EngineOptions(keep_states=True)) "
                      "keeps them)", float("nan"), 0.0, "info", f"{result.cost.n_states:,} states x P = "
                      f"{task.model.num_params:,} would not fit the memory for kept arrays")]
    n = min(len(st["depth"]), _SHIFT_STATES)
    tokens = st["tokens"][:n]
    lengths = (tokens >= 0).sum(axis=1)
    W = task.model.windows(tokens, lengths)  # (n, k)
    J = sensitivities(task.model, task.theta, W)  # (n, P, V)
    p = st["probs"][:n]
    f = token_fisher(p, J)
    shift = np.random.default_rng(0).standard_normal(J.shape[:2])[:, :, None]  # (n, P, 1)
    Jc = J + 10 * shift  # (n, P, V)
    f_unif = uniform_token_fisher(J)
    V = J.shape[-1]
    kappa = concentration(p)  # (n,)
    live = (f_unif > 0) & (kappa[:, None] > 0)
    ratio = f[live] / f_unif[live]
    alpha = ratio / np.broadcast_to(kappa[:, None], f.shape)[live]
    if ratio.size:
        below = float(np.mean(ratio < 1))
        below_alpha = float(np.mean(alpha < 1))
        note = f"median ratio {np.median(ratio):.3g}, median kappa(s) {np.median(kappa):.3g}"
    else:
        below = below_alpha = float("nan")
        note = "f_unif = 0 at every (state, parameter)"
    shift_floor = (SHIFT_ROUNDING * V * float(np.max(np.abs(Jc), initial=0.0))) ** 2
    rows = [
        Check("4 pairwise identity", "policy", "centered f = pairwise f",
              rel_err(f, token_fisher_pairwise(p, J)), EXACT_RTOL),
        Check("4 pairwise identity", "policy", "f(j + c) = f(j), c per parameter",
              rel_err(token_fisher(p, Jc), f, shift_floor), EXACT_RTOL, "equal",
              "scale at least (2 V eps max|j + c| / 1e-10)^2: the rounding of centering j + c"),
        Check("4 pairwise identity", "policy",
              "engine f(s) = pairwise f(s) from autograd sensitivities",
              rel_err(st["token_fisher"][:n],
                      token_fisher_pairwise(p, sensitivities_autograd(task.model, task.theta, W))),
              EXACT_RTOL),
        Check("5 uniform reference", "policy", "f_unif = pairwise form at p = 1/V",
              rel_err(f_unif, token_fisher_pairwise(np.full_like(p, 1.0 / V), J)), EXACT_RTOL),
    ]
    if V <= _ARRANGEMENT_V:
        perms = np.array(list(itertools.permutations(range(V))))  # (V!, V)
        m = min(n, _ARRANGEMENT_STATES)
        mean = np.stack([_arrangement_mean(p[s], J[s], perms) for s in range(m)])  # (m, P)
        rows.append(Check("5 concentration x alignment", "policy",
                          f"mean of f over all {len(perms)} arrangements of p = kappa(s) f_unif",
                          rel_err(mean, kappa[:m, None] * f_unif[:m]), EXACT_RTOL, "equal",
                          f"on the first {m} states; kappa(s) = (1 - sum p^2)/(1 - 1/V)"))
    rows += [
        Check("5 concentration x alignment", "policy",
              "share of (state, param) with f/f_unif < 1", below, 0.0, "info", note),
        Check("5 concentration x alignment", "policy",
              "share with alignment f/(kappa f_unif) < 1", below_alpha, 0.0, "info",
              "f/f_unif = kappa(s) alpha: a ratio below 1 is concentration times alignment"),
    ]
    return rows


def _overlap_rows(result):
    """Identity 8, a diagnostic: the top-k overlap of |G| and F, and the two spreads that
    govern it (log|G| = log cap + log|corr|)."""
    rows = []
    for frac, n, ov, rnd in result.topk_overlap((0.01, 0.05, 0.1, 0.25)):
        rows.append(Check("8 overlap (diagnostic)", "policy",
                          f"top {100 * frac:g}% by |G| also top by F (n={n}; random {rnd:.3f})",
                          ov, 0.0, "info"))
    G, cap, corr, F = (np.abs(result.gradient), result.bound, result.correlation,
                       result.sequence_fisher)
    live = (cap > 0) & (corr > 0)
    note = "the overlap is high as far as the sd of log cap outweighs that of log |corr|"
    if live.sum() >= 2:
        rows += [Check("8 overlap (diagnostic)", "policy", "sd over parameters of log10 cap",
                       float(np.log10(cap[live]).std()), 0.0, "info", note),
                 Check("8 overlap (diagnostic)", "policy", "sd over parameters of log10 |corr|",
                       float(np.log10(corr[live]).std()), 0.0, "info", note)]
    top = int(np.argmax(G))
    rows.append(Check("8 overlap (diagnostic)", "policy",
                      f"rank by F of the largest |G| (of P = {G.size})",
                      float(1 + np.sum(F > F[top])), 0.0, "info"))
    return rows


def exact_checks(result):
    """All exact rows for an :class:`~fisher_ref.results.ExactResult` (of every quantity)."""
    require_all_quantities(result, "exact_checks")
    T = result.task.max_len
    on = result.streams["policy"]
    state_scale = state_score_scale(result)
    gfloor = GRADIENT_FLOOR * gradient_scale(on, score_scale=np.sqrt(state_scale))
    rows = _stream_checks("policy", on, T, True, state_scale)
    rows.insert(0, Check("-", "policy", "total probability = 1", abs(on.mass - 1.0), EXACT_RTOL))
    rows += _state_form_checks(result)
    rows.append(Check("6 policy gradient", "policy", "E[A h] = autograd of E[R]",
                      rel_err(result.gradient, result.gradient_autodiff, gfloor), EXACT_RTOL))
    rows += _overlap_rows(result)
    if "centered" in result.streams:
        c, raw = result.streams["centered"], result.streams["raw"]
        rows += _stream_checks("centered", c, T, True, state_scale)
        rows.append(raw_bias_row(result, raw, c))
        # Against autograd of E_p[R], not against the policy stream's E[A h]: over the
        # same enumeration rho mu(y) = P(y), so that comparison summed the same products
        # P(y) A(y) h(y) twice and held by construction.
        rows.append(Check("off-policy", "raw", "E_mu[rho A h] = autograd of E_p[R]",
                          rel_err(raw.importance_gradient, result.gradient_autodiff, gfloor),
                          EXACT_RTOL, "equal",
                          "rho = P/mu formed per response from mu's draws; autograd never "
                          "forms a score or a weight"))
        rows += constant_rows(raw, c)
    return rows


_MC_IDENTITY = {"score_mean": "1", "cross_terms": "2", "sequence_fisher": "3",
                "token_fisher_sum": "3", "gradient": "6", "covariance": "7", "bound": "7",
                "expected_reward": "6", "importance_gradient": "off-policy"}


def _mc_label(quantity, stream):
    """Identity label of a Monte Carlo row: under a sampler the gradient is G_mu, not
    the policy gradient of identity 6, so it is labelled off-policy."""
    if stream != "policy" and quantity == "gradient":
        return "mc off-policy"
    return "mc " + _MC_IDENTITY.get(quantity, quantity)


class _ScaledReward(Reward):
    """``s * R`` for a reward ``R`` (vectorised when ``R`` is)."""

    def __init__(self, reward, s):
        self.reward, self.s, self.name = reward, s, f"{reward.name} x {s:g}"

    def __call__(self, prompt, response):
        return self.s * self.reward(prompt, response)

    def batch(self, tokens, lengths, prompts, prompt_ids):
        return self.s * self.reward.batch(tokens, lengths, prompts, prompt_ids)

    def to_json(self):
        return {"name": "scaled", "scale": self.s, "reward": self.reward.to_json()}


#: Reward sizes below this are scaled up for the Monte Carlo rows (their squares, in the
#: exact variances the z-tests divide by, would leave float64's normal range).
TINY_REWARD = LIMIT_TINY_REWARD  # see fisher_ref.limits


def _rewards_near_one(task, result, progress, workers):
    r"""``(task, result)``, or, when the rewards are below ``TINY_REWARD`` in size, a copy
    whose rewards and baseline are multiplied by a power of two ``s`` bringing them near 1,
    with its exact result: every z-value is homogeneous in ``R`` and multiplying by a power
    of two is exact, so the Monte Carlo rows are those of ``task`` without the underflow
    of :math:`R^2` (the draws do not depend on the rewards), and so are the exact rows
    (relative errors), for rewards so small that even their products lose digits."""
    from fisher_ref.parallel.run import exact
    on = result.streams["policy"]
    size = float(np.hypot(on.reward_std, on.expected_reward)) + abs(on.baseline)
    if size == 0 or size >= TINY_REWARD:
        return task, result
    s = math.ldexp(1.0, min(-math.frexp(size)[1], 1000))  # 2^1063 would overflow
    scaled = task.with_(reward=_ScaledReward(task.reward, s),
                        baseline=task.baseline if task.baseline == "mean" else task.baseline * s)
    return scaled, exact(scaled, progress=progress, workers=workers)


def verify_task(task, mc=0, seed=0, progress=True, workers="auto"):
    """Exact rows, plus Monte Carlo rows with ``mc`` samples (0: none).

    Every argument is checked before the enumeration starts, the memory of the
    Monte Carlo draws included (:func:`fisher_ref.monte_carlo.check_mc_size`).

    Returns:
        ``(result, rows)``: the :class:`fisher_ref.results.ExactResult` the rows were
        computed from, and the list of :class:`~fisher_ref.checks.table.Check` rows (print
        them with :func:`~fisher_ref.checks.table.format_table`).

    Raises:
        TypeError: ``task`` is not a Task.
        ValueError: ``mc`` or ``seed`` is not a non-negative integer, or ``mc`` draws
            would not fit in memory.
        fisher_ref.engine.plan.EnumerationTooLarge: the task is too large to enumerate.
    """
    from fisher_ref.parallel.run import exact
    from fisher_ref.monte_carlo.sampling import check_mc_size
    require_task(task)
    if isinstance(mc, bool) or not isinstance(mc, (int, np.integer)) or mc < 0:
        raise ValueError(f"mc (Monte Carlo samples) must be a non-negative integer, got {mc!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = check_seed(seed)  # at most 2^63 - 1, as for every command
    if mc:
        for from_mu in [False] + ([True] if task.sampler is not None else []):
            check_mc_size(task, mc, from_mu)
    result = exact(task, progress=progress, workers=workers)
    checked_task, checked = _rewards_near_one(task, result, progress, workers)
    rows = exact_checks(checked)
    if checked is not result:
        rows.append(Check("-", "policy", "rewards and baseline scaled by "
                          f"{checked_task.reward.s:.6g} for these checks", float("nan"), 0.0,
                          "info", f"rewards below {TINY_REWARD:g} in size: their squares leave "
                          "float64's normal range; every check is homogeneous in R and the "
                          "scaling (a power of two) is exact"))
    if mc:
        from fisher_ref.monte_carlo.ztests import bonferroni_z
        from fisher_ref.monte_carlo.sampling import check_monte_carlo
        normal = bonferroni_z(MC_ALPHA, task.model.num_params)
        for r in check_monte_carlo(checked_task, checked, mc, seed, alpha=MC_ALPHA):
            weak = r.threshold > WEAK_POWER * normal
            rows.append(Check(_mc_label(r.quantity, r.stream), r.stream,
                              f"{r.quantity}: |z| of the entry nearest its threshold",
                              float(r.max_abs_z), float(r.threshold), "z",
                              f"n={mc} samples, seed={seed}" + ("; little power: rare values "
                              "raised the threshold; use more samples" if weak else "")))
    return result, rows
