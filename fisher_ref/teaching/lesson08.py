"""Lesson 8's quizzes and exercises (which RL estimator is unbiased?), as data.

The quizzes are rows of :class:`fisher_ref.teaching.quiz_bank.Quiz` arguments
(``QUIZ_ROWS``) and the exercises :class:`fisher_ref.teaching.exercise.Exercise` s
(``EXERCISES``); :mod:`fisher_ref.teaching.quiz_bank` and
:mod:`fisher_ref.teaching.exercise_bank` register them in their one registry each. This
module imports numpy only (the teaching layer does not import :mod:`fisher_ref.estimators`;
the checkers compute their references by their own route), so
``import fisher_ref.teaching.quizzes`` stays light.
"""
from __future__ import annotations

import itertools

import numpy as np

from fisher_ref.teaching.exercise import Exercise, Mistake, close_to

__all__ = ["STEM", "QUIZ_ROWS", "EXERCISES"]

STEM = "08_rl_estimators"


def _quiz(quiz_id, question, options, correct, feedback):
    return (quiz_id, STEM, question, tuple(options), correct, tuple(feedback))


QUIZ_ROWS = [
    _quiz("which-ratio",
          r"Responses come from a sampler $\mu \ne p$ and the advantage $A(y)$ is fixed by the "
          r"whole response. Each token's term $-A\log p(y_t|s_t)$ gets a detached importance "
          r"weight. Which weight makes $E_\mu[\nabla\mathcal L] = -G$ exactly?",
          (r"The token's own ratio $r_t$, which corrects the one draw this term scores.",
           r"The product of all the ratios of the response, on every token.",
           r"The prefix product $\prod_{u \le t} r_u$, the draws that led to $y_t$.",
           r"None: every weight per token leaves some bias behind."),
          1,
          (r"No: $r_t$ corrects the draw of $y_t$, but the tokens before it (which fix "
           r"$s_t$) and after it (which fix $A$) still come from $\mu$.",
           r"Right: $E_\mu[r(y)\,A\,h] = \sum_y \mu(y)\frac{p(y)}{\mu(y)}A h = E_p[A h] = G$; "
           r"nothing else is needed.",
           r"No: the prefix product corrects the draws up to $y_t$, but $A$ also depends on "
           r"the tokens after $t$, still drawn from $\mu$ (it is unbiased only for a reward "
           r"paid as the tokens come).",
           r"No: the sequence ratio on every token is exact, as the derivation shows.")),
    _quiz("tis-large-cap",
          r"Truncated IS caps a weight at $C$. On a task whose every ratio is finite, let $C$ "
          r"grow past the largest ratio. What is then left of the bias of *token*-level TIS, "
          r"weight $\min(r_t, C)$?",
          (r"Nothing: once $C$ passes every ratio the cap never acts, so the bias is zero.",
           r"It grows with $C$, since large weights are what make the estimate biased.",
           r"The bias of plain token IS: the cap is gone, the wrong weight stays.",
           r"It depends on the baseline only, as a truncation bias always does."),
          2,
          (r"No: that is sequence-level TIS, whose uncapped weight is exact; token TIS tends "
           r"to token IS, which is biased.",
           r"No: a larger cap truncates less; the bias settles at a limit as $C$ grows.",
           r"Right: for $C \ge \max r_t$, $\min(r_t, C) = r_t$, so the estimator is token IS, "
           r"and token IS is biased under $\mu \ne p$.",
           r"No: the limit is token IS's bias, which is there whatever the baseline.")),
    _quiz("grpo-two",
          r"GRPO with groups of $B = 2$ and a binary reward. How does its difficulty weight "
          r"$w_2(\gamma)$ depend on the prompt's pass rate $\gamma$?",
          (r"It is the same for every $\gamma$: a mixed pair gets $A = \pm 1/\sqrt2$, whatever "
           r"the pass rate.",
           r"It grows like $1/\sqrt{\gamma(1-\gamma)}$, large for the rarest successes.",
           r"It is zero, because two draws cannot estimate a standard deviation.",
           r"It peaks at $\gamma = 1/2$, where the rewards vary the most."),
          0,
          (r"Right: a pair scores 0 unless its rewards differ; then the mean is 1/2, the "
           r"unbiased std $1/\sqrt2$, and $A = \pm 1/\sqrt2$, so $w_2 = 1/\sqrt2$ for every "
           r"$\gamma$.",
           r"No: that is the large-$B$ limit; at $B = 2$ a rare success mostly meets another "
           r"failure and gets the same $A = 1/\sqrt2$ as any mixed pair.",
           r"No: two different rewards have a std of $1/\sqrt2$, not zero; equal rewards give "
           r"$A = 0$, and only those.",
           r"No: the pass rate changes how often a pair is mixed, which the weight divides "
           r"out; it does not change $A$.")),
    _quiz("length-objective",
          r"A loss divides each response's token sum by its length $L$ "
          r"(`seq-mean-token-mean`) with a fixed advantage $A(y) = R(y) - R_0$, on policy. "
          r"Its expected gradient is exactly minus the gradient of",
          (r"$E_p[R]$, the same objective as REINFORCE, only rescaled.",
           r"$E_p[R] / E_p[L]$, the reward earned per generated token.",
           r"nothing: a per-response weight makes it no gradient at all.",
           r"$E_p[(R - R_0)/L]$, an objective that counts length."),
          3,
          (r"No: $1/L$ varies between responses, so it reweights them, not only rescales.",
           r"No: that ratio of expectations is not what the sum weights; $1/L$ sits inside "
           r"the expectation, response by response.",
           r"No: for any fixed $\phi(y)$, $E_p[\phi h] = \nabla E_p[\phi]$: it is a gradient.",
           r"Right: $E_p[\phi(y)\,h] = \nabla_\theta E_p[\phi(y)]$ for any $\phi$ that does not "
           r"depend on $\theta$, here $\phi = (R - R_0)/L$; with $R_0$ above the rewards it "
           r"rewards length.")),
    _quiz("k3-direction",
          r"The k3 term $e^{-\Delta_t} - 1 + \Delta_t$, $\Delta_t = \log p(y_t|s_t) - "
          r"\log p_{ref}(y_t|s_t)$, is summed over the sampled tokens in the loss, on policy. At a "
          r"fixed state, its expected gradient is the gradient of",
          (r"$KL(p_{ref}\|p)$ at that state, the forward KL.",
           r"$KL(p\|p_{ref})$ at that state, the reverse KL.",
           r"nothing: an unbiased KL estimate has zero mean gradient.",
           r"$KL(p_{seq}\|p_{ref,seq})$, the sequence-level KL."),
          0,
          (r"Right: $\nabla \mathrm{k3} = (1 - p_{ref}/p)\nabla\log p$, and "
           r"$E_{a\sim p}[(1 - p_{ref,a}/p_a)\xi_a] = -\sum_a p_{ref,a}\xi_a = "
           r"\nabla KL(p_{ref}\|p)$: the forward KL.",
           r"No: that is k2's, $\Delta\nabla\log p$, whose mean is $\nabla KL(p\|p_{ref})$ "
           r"at the state.",
           r"No: that is k1 (its mean gradient is zero); k3's gradient has mean "
           r"$-\sum_a p_{ref,a}\xi_a$.",
           r"No: a term per token, with the state's distribution not differentiated, gives "
           r"only a per-state gradient; k1 in the reward gives the sequence KL.")),
    _quiz("centering-or-is",
          r"The sampler is the policy at temperature 1.5 (flatter than $p$). Averaging $n$ "
          r"groups, which estimator's relative MSE is the smaller: centering under $\mu$ "
          r"(biased) or sequence IS (unbiased)?",
          (r"Centering at every $n$, since it never multiplies by a ratio at all.",
           r"Sequence IS at every $n$: a flatter $\mu$ keeps ratios small.",
           r"Centering for small $n$, sequence IS beyond a crossover.",
           r"Neither: both MSEs are the same, whatever $n$ is."),
          1,
          (r"No: here the ratios are small, so IS is no noisier than centering, and it has no "
           r"bias.",
           r"Right: with $\mu$ flatter than $p$ every $r(y) = p(y)/\mu(y)$ stays small (at "
           r"most 1.6 here), so IS adds little variance and no bias; the stale sampler is "
           r"where a crossover appears.",
           r"No: that happens on the stale sampler, whose ratios reach the thousands; here IS "
           r"has the smaller variance too.",
           r"No: the bias differs (zero against not zero), so the MSEs differ at large $n$.")),
    _quiz("token-mean-batches",
          r"REINFORCE with one response per group, aggregated by `token-mean`: the loss "
          r"divides by the tokens of its batch. Per group its relative bias is 0.19 on "
          r"`tabular`. How does that bias change when each batch holds $K$ groups?",
          (r"It stays at 0.19: every group's share of the divisor is the same at each $K$.",
           r"It shrinks roughly like $1/\sqrt K$, as a standard error does.",
           r"It shrinks about like $1/K$, down to zero at the large-batch limit.",
           r"It grows with $K$: more responses, more spread in the token count."),
          2,
          (r"No: the divisor $N$ is random and moves with the responses it divides, so "
           r"$E[X/N] \ne E[X]/E[N]$; that gap depends on how much $N$ varies against its "
           r"mean, which falls as $K$ grows.",
           r"No: a bias is not a standard error; the delta method's corrections are "
           r"$\mathrm{Cov}(X,N)/(E N)^2$ and $E X\,\mathrm{Var}\,N/(E N)^3$, each $K/K^2$.",
           r"Right: the corrections of the delta method are $1/K$ of the leading term, and "
           r"at the limit the divisor is the constant $K G\,E|y|$, which only rescales.",
           r"No: the spread of $N$ grows like $\sqrt K$ but its mean like $K$, so $N/E N$ "
           r"concentrates and the bias falls.")),
    _quiz("ppo-clip-later",
          r"PPO on `tabular`: responses from $\theta_{old}$, a stale copy of $\theta$ "
          r"(perturbation scale 0.5), RLOO advantages, a constant token divisor. Unclipped, "
          r"the loss is token IS, whose bias is small here. What does the clip at "
          r"$1 \pm 0.2$ do to the expected gradient?",
          (r"Nothing on average: clipped tokens are rare, and their effects cancel.",
           r"It rescales it only, which the learning rate absorbs.",
           r"It removes token IS's bias, since it bounds the weights.",
           r"It turns it: the relative bias grows more than tenfold."),
          3,
          (r"No: at this drift the clipped share is far from 0: the clip changes the "
           r"expected gradient, and nothing cancels it.",
           r"No: it changes the direction, not only the length: the relative bias (what is "
           r"left after the best scale) grows.",
           r"No: the clip drops the push of tokens whose ratio has left the band; that is a "
           r"trust region, not a correction, and the bias grows.",
           r"Right: from 0.015 unclipped to 0.18 clipped; the clip trades that bias for a "
           r"smaller variance per batch.")),
]


# --------------------------------------------------------------------------- exercises

def _expected_difficulty_weight(ns):
    """By another route than the binomial sum: all 2^B outcomes, w_B = E[A_1 (R_1 - gamma)]
    / (gamma (1 - gamma)) (since E[A_1 h_1] = w_B grad gamma and R_1 - gamma is the score of
    a Bernoulli(gamma) in its mean parameter, up to the factor gamma (1 - gamma))."""
    B, gamma, eps = int(ns["B"]), float(ns["gamma"]), float(ns["eps"])
    total = 0.0
    for outcome in itertools.product((0.0, 1.0), repeat=B):
        R = np.array(outcome)
        k = R.sum()
        A1 = (R[0] - R.mean()) / (R.std(ddof=1) + eps)
        total += gamma ** k * (1 - gamma) ** (B - k) * A1 * (R[0] - gamma)
    return total / (gamma * (1 - gamma))


def _expected_k3_gradient(ns):
    """Sum_a (p_a - ref_a) j_a: the forward-KL gradient at the state (j-bar cancels)."""
    return ns["J"] @ (ns["p"] - ns["ref"])


def _relative_mse_line(lg):
    """``(a, b)`` with relative MSE ``a + b / n``, read off two values of ``lg.mse``."""
    target = (lg.scale * np.linalg.norm(lg.policy_gradient)) ** 2
    m1, m2 = lg.mse(1) / target, lg.mse(2) / target
    b = 2 * (m1 - m2)
    return m1 - b, b


def _expected_crossover(ns):
    a_c, b_c = _relative_mse_line(ns["cen"])
    a_s, b_s = _relative_mse_line(ns["seq"])
    return (b_s - b_c) / (a_c - a_s)


_GROUPS = """\
import numpy as np
from math import comb
B, gamma, eps = 4, 0.25, 1e-6             # group size, pass rate, GRPO's epsilon"""

_STATE = """\
import numpy as np
rng = np.random.default_rng(8)
z = rng.normal(size=5)
# (V,) the policy at one state
p = np.exp(z) / np.exp(z).sum()
ref = np.exp(z + 0.5 * rng.normal(size=5))
ref /= ref.sum()                                             # (V,) the reference policy
J = rng.normal(size=(3, 5))                                  # (P, V) sensitivities"""

_STALE = """\
import numpy as np
from fisher_ref import load_config
from fisher_ref.estimators import expected_loss_gradient, presets
task = load_config("offpolicy_stale")
cen = expected_loss_gradient(task, presets.centered(task.baseline))
seq = expected_loss_gradient(task, presets.sequence_is(baseline=task.baseline))
G = seq.policy_gradient                                      # (P,) the policy gradient"""

EXERCISES = [
    Exercise(
        "difficulty-weight-by-hand", STEM, "GRPO's difficulty weight by hand",
        r"Compute $w_B(\gamma) = E_\nu[\mathcal A(1, \nu) - \mathcal A(0, \nu)]$ for $B = 4$, "
        r"$\gamma = 0.25$: $\nu$ is the number of successes among the *other* $B - 1$ "
        r"responses, and $\mathcal A(1, \nu)$ (or $\mathcal A(0, \nu)$) the GRPO advantage "
        r"$(R_1 - \bar R)/(\mathrm{std}(R) + \epsilon)$ of a response with reward 1 (or 0) "
        r"in that group (`torch.std` is the unbiased std). Set `w`.",
        _GROUPS, "w", """w = 0.0
for nu in range(B):                        # successes among the other B - 1
    prob = comb(B - 1, nu) * gamma ** nu * (1 - gamma) ** (B - 1 - nu)
    for c, sign in ((1.0, 1), (0.0, -1)):
        R = np.array([c] + [1.0] * nu + [0.0] * (B - 1 - nu))
        w += sign * prob * (R[0] - R.mean()) / (R.std(ddof=1) + eps)""",
        r"With binary rewards the group's expected gradient for a prompt is "
        r"$(\mathcal A_B(1) - \mathcal A_B(0))\nabla\gamma$, each averaged over the others' "
        r"successes $\nu \sim \mathrm{Bin}(B-1, \gamma)$. A group whose rewards are all "
        r"equal has $A = 0$ and adds nothing, which is why $w_B$ stays far below the "
        r"large-$B$ formula when $\gamma$ is small.",
        (Mistake("w = 0.0\nfor nu in range(B):\n"
                 "    prob = comb(B - 1, nu) * gamma ** nu * (1 - gamma) ** (B - 1 - nu)\n"
                 "    for c, sign in ((1.0, 1), (0.0, -1)):\n"
                 "        R = np.array([c] + [1.0] * nu + [0.0] * (B - 1 - nu))\n"
                 "        w += sign * prob * (R[0] - R.mean()) / (R.std() + eps)",
                 "GRPO normalises by `torch.std`, the *unbiased* std: use `R.std(ddof=1)`, "
                 "not numpy's default `ddof=0`."),
         Mistake("w = 1 / np.sqrt(gamma * (1 - gamma))",
                 "that is the large-$B$ limit $1/\\sqrt{\\gamma(1-\\gamma)}$; at $B = 4$ many "
                 "groups have equal rewards and $A = 0$, so sum over $\\nu$ instead."),
         Mistake("w = 0.0\nfor nu in range(B):\n"
                 "    prob = comb(B - 1, nu) * gamma ** nu * (1 - gamma) ** (B - 1 - nu)\n"
                 "    for c, sign in ((1.0, 1), (0.0, -1)):\n"
                 "        R = np.array([c] + [1.0] * nu + [0.0] * (B - 1 - nu))\n"
                 "        w += sign * prob * (R[0] - R.mean())",
                 "GRPO normalises each advantage by the group's std: divide "
                 "$R_1 - \\bar R$ by `R.std(ddof=1) + eps` (a group of equal rewards has "
                 "$R_1 - \\bar R = 0$ either way).")),
        close_to(_expected_difficulty_weight, rtol=1e-9)),
    Exercise(
        "k3-state-gradient", STEM, "the k3 gradient at one state",
        r"At one state the policy is `p`, the reference `ref`, and the sensitivities `J` "
        r"($j_{i,a} = \partial z_a/\partial\theta_i$). Compute the expected gradient of the k3 "
        r"term, $E_{a\sim p}[\nabla_\theta \mathrm{k3}]$ with "
        r"$\mathrm{k3} = e^{-\Delta_a} - 1 + \Delta_a$, "
        r"$\Delta_a = \log p_a - \log p_{ref,a}$ and $\nabla\log p_a = j_a - \bar j$. Set `g3` "
        r"$(P,)$.",
        _STATE, "g3", """xi = J - (J @ p)[:, None]                   # (P, V) scores j_a - j_bar
g3 = xi @ (p * (1 - ref / p))                # E_p[(1 - ref/p) xi]""",
        r"$\nabla \mathrm{k3} = (1 - e^{-\Delta_a})\nabla\log p_a = (1 - p_{ref,a}/p_a)\,\xi_a$; "
        r"averaging under $p$ gives $\sum_a (p_a - p_{ref,a})\xi_a = -\sum_a p_{ref,a}\xi_a$ "
        r"(the scores average to zero under $p$), the gradient of $KL(p_{ref}\|p)$ at the "
        r"state: the forward KL.",
        (Mistake("xi = J - (J @ p)[:, None]\n"
                 "g3 = xi @ (p * (np.log(p) - np.log(ref)))",
                 "that is k2's gradient, $\\Delta_a\\,\\xi_a$, the reverse KL; k3's derivative "
                 "is $1 - e^{-\\Delta_a} = 1 - p_{ref,a}/p_a$."),
         Mistake("xi = J - (J @ p)[:, None]\ng3 = xi @ (1 - ref / p)",
                 "average over $a \\sim p$: weight each token's term by $p_a$.")),
        close_to(_expected_k3_gradient, rtol=1e-10)),
    Exercise(
        "crossover-batch", STEM, "when reweighting starts to win",
        r"On `offpolicy_stale`, the relative MSE of an average of $n$ groups is "
        r"$\mathrm{mse}(n)/(\omega\|G\|)^2$ (`lg.mse(n)`, `lg.scale` $=\omega$). It is "
        r"$\mathrm{bias}^2 + \mathrm{var}/n$, with bias the relative bias (`lg.relative_bias`) "
        r"and var the "
        r"variance trace divided by $(\omega\|G\|)^2$. At which $n$ (not rounded) "
        r"do centering (`cen`) and sequence IS (`seq`) have the same relative MSE? Set "
        r"`n_star`.",
        _STALE, "n_star", """scale_c = (cen.scale * np.linalg.norm(G)) ** 2  # (omega ||G||)^2
scale_s = (seq.scale * np.linalg.norm(G)) ** 2
v_c, v_s = cen.variance_trace / scale_c, seq.variance_trace / scale_s
n_star = (v_s - v_c) / (cen.relative_bias ** 2 - seq.relative_bias ** 2)""",
        r"Setting $\mathrm{bias}_c^2 + \mathrm{var}_c/n = \mathrm{bias}_s^2 + \mathrm{var}_s/n$ "
        r"gives $n^* = (\mathrm{var}_s - \mathrm{var}_c)/(\mathrm{bias}_c^2 - "
        r"\mathrm{bias}_s^2)$. Sequence IS has $\mathrm{bias}_s = 0$ and the larger var: "
        r"below $n^*$ centering's smaller "
        r"variance wins, above it only the bias counts, and IS wins.",
        (Mistake("v_c = cen.variance_trace / np.linalg.norm(G) ** 2\n"
                 "v_s = seq.variance_trace / np.linalg.norm(G) ** 2\n"
                 "n_star = (v_s - v_c) / (cen.relative_bias ** 2 - seq.relative_bias ** 2)",
                 "divide each variance by its own $(\\omega\\|G\\|)^2$: centering's fitted "
                 "scale $\\omega$ is not $-1$."),
         Mistake("scale_c = (cen.scale * np.linalg.norm(G)) ** 2\n"
                 "scale_s = (seq.scale * np.linalg.norm(G)) ** 2\n"
                 "v_c, v_s = cen.variance_trace / scale_c, seq.variance_trace / scale_s\n"
                 "n_star = (v_s - v_c) / (cen.relative_bias - seq.relative_bias)",
                 "the MSE holds the *squared* bias: divide by "
                 "$\\mathrm{bias}_c^2 - \\mathrm{bias}_s^2$.")),
        close_to(_expected_crossover, rtol=1e-8)),
]
