"""Lesson exercises as data: a prompt, the code that builds the inputs, a checker, a solution.

The exercises of lessons 0-6 (their judges' references are in
:mod:`fisher_ref.teaching.exercise_references`), joined by lesson 7's
(:mod:`fisher_ref.teaching.exercises_transformer`) and lesson 8's
(:mod:`fisher_ref.teaching.lesson08`) in the one registry ``EXERCISES``, keyed by id;
:mod:`fisher_ref.teaching.exercises` checks an answer and writes the notebook cells.
"""
from __future__ import annotations

from fisher_ref.numerics import token_fisher
from fisher_ref.teaching.exercise import Exercise, Mistake, close_to
from fisher_ref.teaching.exercise_references import (anti_aligned, expected_adam2, expected_b2,
                                                     expected_c_best, expected_concentration,
                                                     expected_mean_length, expected_needed,
                                                     expected_one_token, expected_overlaps,
                                                     expected_params)
from fisher_ref.teaching.exercises_transformer import TRANSFORMER_EXERCISES
from fisher_ref.teaching.lesson08 import EXERCISES as LESSON08_EXERCISES
from fisher_ref.teaching.views import shuffled_token_fisher

__all__ = ["EXERCISES"]

_DEFAULT = """\
import numpy as np
from fisher_ref import load_config, exact
task = load_config("default")
r = exact(task, progress=False)"""

_SCORES = _DEFAULT + """
from fisher_ref.teaching.views import response_token_scores
# (M,) response probabilities
seqs, w = r.sequences, r.sequences["prob"]
XI = np.stack([response_token_scores(task, pr, tk)           # (M, T, P) token scores
               for pr, tk in zip(seqs["prompt"], seqs["tokens"])])"""

_STATE0 = _DEFAULT + """
from fisher_ref.teaching.views import state_sensitivities
J = state_sensitivities(task, r.states)[0]                   # (P, V) at state 0
# (V,) logits up to a constant
z = np.log(r.states["probs"][0])
betas = np.array([0.0, 0.5, 1.0, 2.0, 4.0])"""

_RNG_STATE = """\
import numpy as np
rng = np.random.default_rng(7)
z = rng.normal(size=6)
# (V,) next-token probabilities
p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
J = rng.normal(size=(4, 6))                                  # (P, V) sensitivities"""

_MEDIUM = """\
import numpy as np
from importlib import resources
from fisher_ref import load_task, exact
medium = load_task(resources.files("fisher_ref") / "configs" / "scale" / "medium.json")
rm = exact(medium, progress=False)
# (P,) each; |G| = cap * corr
F, cap, corr = rm.sequence_fisher, rm.bound, rm.correlation
n = 10                                                       # the top 1% of 1,044
svals = [0.0, 0.5, 1.0, 2.0]"""

_E = [
    # ---- lesson 0 -------------------------------------------------------------
    Exercise(
        "count-params", "00_start_here", "count the parameters",
        r"The medium config has $V = 12$, $k = 2$, embedding width $d = 8$ and hidden width "
        r"$D = 32$. From the layout (`E`: $(V+1) \times d$, `W1`: $kd \times D$, `b1`: $D$, "
        r"`W2`: $D \times V$, `b2`: $V$), how many parameters does it have? Set `n_params`.",
        "V, k, d, D = 12, 2, 8, 32",
        "n_params", "n_params = (V + 1) * d + k * d * D + D + D * V + V",
        r"Each block holds the product of its shape. `E` has a row for BOS as well as for the "
        r"$V$ tokens, because BOS pads a window that is shorter than $k$.",
        (Mistake("n_params = V * d + k * d * D + D + D * V + V",
                 "`E` has $V + 1$ rows: BOS is read as an input too (it pads short windows)."),
         Mistake("n_params = (V + 1) * d + k * d * D + D * V",
                 "the biases are parameters too: `b1` adds $D$ and `b2` adds $V$.")),
        close_to(expected_params, rtol=0)),
    Exercise(
        "b2-moves-logits", "00_start_here", "what b2 does",
        r"By central finite differences of `task.model.logits` (step $10^{-6}$), compute "
        r"the matrix `S[b, a]` $= \partial z_a / \partial b2_b$ at the window `(1, 2)`. "
        r"Predict its shape and entries first. Set `S`.",
        _DEFAULT + """
window = np.array([[1, 2]])                                  # (1, k)
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}
(V,), off = layout["b2"]""",
        "S", """S = np.zeros((V, V))
for b in range(V):
    step = np.zeros_like(task.theta)
    step[off + b] = 1e-6
    S[b] = (task.model.logits(task.theta + step, window)[0]
            - task.model.logits(task.theta - step, window)[0]) / 2e-6""",
        r"The logits end in `+ b2`, so $\partial z_a/\partial b2_b$ is 1 when $a = b$ and 0 "
        r"otherwise: `S` is the $V \times V$ identity, at this window and at every other.",
        (Mistake("S = np.ones((V, V))",
                 "`b2[b]` is added to token $b$'s logit only; the other logits do not move."),
         Mistake("S = np.zeros((V, V))",
                 "`b2` does move the logits: `b2[b]` adds one-for-one to $z_b$."),
         Mistake("""S = np.zeros((V, V))
for b in range(V):
    step = np.zeros_like(task.theta)
    step[off + b] = 1e-6
    S[b] = (task.model.logits(task.theta + step, window)[0]
            - task.model.logits(task.theta - step, window)[0]) / 1e-6""",
                 "a central difference spans two steps: $z(\\theta + h) - z(\\theta - h)$ "
                 "is $2h$ wide, so divide by $2 \\times 10^{-6}$, not $10^{-6}$.")),
        close_to(expected_b2, rtol=0, atol=1e-6)),
    # ---- lesson 1 -------------------------------------------------------------
    Exercise(
        "second-token-square", "01_sequence_to_tokens", "a diagonal term by hand",
        r"With the lesson's parameter `i`, compute $E[\xi_{2,i}^2]$, the expected square "
        r"of the second token's score, as a probability-weighted sum over all responses. "
        r"Set `m22`.",
        _SCORES + """
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}
(nb2,), off = layout["b2"]
i = off + int(np.argmax(r.sequence_fisher[off:off + nb2]))""",
        "m22", "m22 = w @ XI[:, 1, i] ** 2",
        r"An expectation over responses is $\sum_y P(y)\,(\cdot)$. Responses that end after one "
        r"token have $\xi_{2,i} = 0$ and add nothing; the value is the diagonal entry "
        r"`cross_terms[1, 1]` of the engine.",
        (Mistake("m22 = np.mean(XI[:, 1, i] ** 2)",
                 "weight each response by its probability `w`; a plain mean treats rare and "
                 "likely responses alike."),
         Mistake("m22 = (w @ XI[:, 1, i]) ** 2",
                 "square first, then average: $E[\\xi^2]$, not $E[\\xi]^2$ (which is 0 here)."),
         Mistake("m22 = w @ XI[:, 2, i] ** 2",
                 "positions count from 0 in `XI[:, t, i]`: the second token is `XI[:, 1, i]`; "
                 "`XI[:, 2, i]` is the third.")),
        close_to(lambda ns: ns["r"].cross_terms[1, 1, ns["i"]], rtol=1e-10)),
    Exercise(
        "expected-length", "01_sequence_to_tokens", "how many tokens a response holds",
        r"A response that draws EOS early holds fewer than $T$ tokens. How many tokens does a "
        r"response hold on average, EOS included? That is also the number of terms the sum "
        r"$\sum_t f_i(s_t)$ has on average. Set `mean_len`.",
        _SCORES, "mean_len", """lengths = (seqs["tokens"] >= 0).sum(axis=1)         # (M,) EOS included
mean_len = w @ lengths""",
        r"$E[L] = \sum_y P(y)\,L(y)$. Every drawn token, EOS included, is one state at which "
        r"the model was asked, so $E[L]$ is also the total reach of the states.",
        (Mistake("mean_len = np.mean((seqs['tokens'] >= 0).sum(axis=1))",
                 "weight each response by its probability `w`, not each entry of the list "
                 "equally."),
         Mistake("mean_len = w @ (seqs['tokens'] > 0).sum(axis=1)",
                 "EOS (token 0) is a drawn token too: the model was asked for it at that state.")),
        close_to(expected_mean_length, rtol=1e-10)),
    # ---- lesson 2 -------------------------------------------------------------
    Exercise(
        "pairwise-by-broadcasting", "02_pairwise_differences", "the pairwise form, no loops",
        r"Compute the token Fisher of every parameter from `p` $(V,)$ and `J` $(P, V)$ by the "
        r"**pairwise** form $\tfrac12\sum_{a,b} p_a p_b (j_{i,a} - j_{i,b})^2$, with numpy "
        r"broadcasting and no Python loop. Set `f` $(P,)$.",
        _RNG_STATE, "f", """gaps = J[:, :, None] - J[:, None, :]                  # (P, V, V) j_a - j_b
f = 0.5 * (p[:, None] * p[None, :] * gaps ** 2).sum(axis=(1, 2))""",
        r"Broadcasting `J[:, :, None] - J[:, None, :]` forms all $V^2$ gaps at once. Each "
        r"unordered pair $\{a, b\}$ appears twice, as $(a, b)$ and $(b, a)$, hence the "
        r"$\tfrac12$; the result equals the centered form.",
        (Mistake("f = (p[:, None] * p[None, :] * (J[:, :, None] - J[:, None, :]) ** 2)"
                 ".sum(axis=(1, 2))",
                 "your answer is twice the token Fisher: the double sum counts each pair as "
                 "$(a, b)$ and as $(b, a)$, so halve it."),
         Mistake("f = 0.5 * ((J[:, :, None] - J[:, None, :]) ** 2).mean(axis=(1, 2))",
                 "weight each pair by $p_a p_b$: with equal weights you get the uniform "
                 "reference $f^{unif}$, not the model's Fisher.")),
        close_to(lambda ns: token_fisher(ns["p"], ns["J"]), rtol=1e-10)),
    Exercise(
        "predict-one-token", "02_pairwise_differences", "predict before you compute",
        r"Without running anything: under the lesson's $p$ (tea 0.46, coffee 0.40, ...), a "
        r"parameter moves only *tea*'s logit, by 1: $j = (1, 0, 0, 0, 0)$. What is its "
        r"token Fisher? (Hint: the variance of a 0/1 variable.) Set `f_tea` to a number.",
        "import numpy as np\np = np.array([0.46, 0.40, 0.08, 0.05, 0.01])",
        "f_tea", "f_tea = 0.46 * (1 - 0.46)",
        r"$j$ is 1 on *tea* and 0 elsewhere: a 0/1 variable with mean $p_{tea}$, whose variance "
        r"is $p_{tea}(1 - p_{tea}) = 0.2484$.",
        (Mistake("f_tea = 0.46",
                 "that is $E_p[j^2] = p_{tea}$; the Fisher subtracts the squared mean "
                 "$\\bar j^2 = p_{tea}^2$."),
         Mistake("f_tea = 0.46 ** 2",
                 "that is the squared mean $\\bar j^2$; the variance is $E[j^2] - \\bar j^2$.")),
        close_to(expected_one_token, rtol=1e-6)),
    # ---- lesson 3 -------------------------------------------------------------
    Exercise(
        "temperature-concentration", "03_where_mass_lands", "what temperature moves",
        r"Sharpen or flatten state 0 with $p_\beta = \mathrm{softmax}(\beta z)$. Compute "
        r"the concentration $\kappa = (1 - \sum_a p_a^2)/(1 - 1/V)$ for each $\beta$ in "
        r"`betas`. Set `kappa_beta` (one value per $\beta$). What happens to it, and so to "
        r"the shuffled Fisher $\kappa\,f^{unif}$, as $\beta$ grows?",
        _STATE0, "kappa_beta", """from fisher_ref.numerics import softmax
V = z.size
P_beta = softmax(betas[:, None] * z[None])              # (B, V)
kappa_beta = (1 - (P_beta ** 2).sum(axis=1)) / (1 - 1 / V)""",
        r"$\sum_a p_a^2$ is the chance that two draws agree: $1/V$ for a uniform $p$, 1 for a "
        r"point mass. So $\kappa$ falls from 1 at $\beta = 0$ towards 0 as $\beta$ grows, and "
        r"the shuffled Fisher $\kappa f^{unif}$ falls with it, whatever the sensitivities.",
        (Mistake("from fisher_ref.numerics import softmax\n"
                 "kappa_beta = 1 - (softmax(betas[:, None] * z[None]) ** 2).sum(axis=1)",
                 "divide by $1 - 1/V$, so that a uniform $p$ ($\\beta = 0$) gives "
                 "$\\kappa = 1$."),
         Mistake("from fisher_ref.numerics import softmax\n"
                 "kappa_beta = (softmax(betas[:, None] * z[None]) ** 2).sum(axis=1)",
                 "that is $\\sum_a p_a^2$ itself, which *grows* as $p$ sharpens; "
                 "$\\kappa = (1 - \\sum_a p_a^2)/(1 - 1/V)$.")),
        close_to(expected_concentration, rtol=1e-10)),
    Exercise(
        "permutation-average", "03_where_mass_lands", "the shuffle, by brute force",
        r"Average state 0's token Fisher over all $V! = 120$ arrangements of its "
        r"probabilities across the tokens (`itertools.permutations`), sensitivities kept. "
        r"Set `f_perm` $(P,)$; then compare it with $\kappa(s)\,f^{unif}$.",
        _STATE0 + "\np = r.states['probs'][0]                                  # (V,)",
        "f_perm", """import itertools
from fisher_ref import token_fisher
f_perm = np.mean([token_fisher(p[list(q)], J)
                  for q in itertools.permutations(range(p.size))], axis=0)""",
        r"A uniformly random shuffle makes each of the $V!$ arrangements equally likely, so "
        r"their plain average is $E_\pi[f]$; it equals $\kappa(s)\,f^{unif}(s)$ to rounding.",
        (Mistake("from fisher_ref import uniform_token_fisher\nf_perm = uniform_token_fisher(J)",
                 "that is $f^{unif}$, the shuffle average only when $p$ is uniform; a "
                 "concentrated $p$ multiplies it by $\\kappa(s) < 1$."),
         Mistake("from fisher_ref import token_fisher\nf_perm = token_fisher(p, J)",
                 "that is the model's own arrangement; average over all 120 of them.")),
        close_to(lambda ns: shuffled_token_fisher(ns["p"], ns["J"]), rtol=1e-10)),
    Exercise(
        "anti-aligned", "03_where_mass_lands", "below uniform, yet not aligned",
        r"Build one state and one parameter with $f/f^{unif} < 1$ whose alignment factor "
        r"$\alpha = f/(\kappa\,f^{unif})$ is above 1: the mass lands on a token the parameter "
        r"moves *apart* from the others. Set `answer = (p, j)` with two vectors of length $V$.",
        "import numpy as np", "answer", """p = np.array([0.97, 0.01, 0.01, 0.01])
j = np.array([1.0, 0.0, 0.0, 0.0])
answer = (p, j)""",
        r"A $p$ concentrated on token 0 makes $\kappa$ small, so $f/f^{unif} < 1$; but the "
        r"parameter moves exactly that token away from the rest, so $f$ exceeds its shuffle "
        r"average $\kappa f^{unif}$ and $\alpha > 1$.",
        (Mistake("answer = (np.full(4, 0.25), np.array([1.0, 0.0, 0.0, 0.0]))",
                 "a uniform $p$ has $\\kappa = 1$ and $f = f^{unif}$: the ratio is exactly 1. "
                 "Concentrate $p$."),
         Mistake("answer = (np.array([0.49, 0.49, 0.01, 0.01]), np.array([1.0, 1.0, 0.0, 0.0]))",
                 "your likely tokens move alike, which is alignment ($\\alpha < 1$); put the "
                 "mass on a token the parameter moves apart from the others.")),
        anti_aligned),
    # ---- lesson 4 -------------------------------------------------------------
    Exercise(
        "bound-by-hand", "04_gradient_is_covariance", "the bound from the responses",
        r"From the enumerated responses alone (probabilities `w`, advantages `A`, token "
        r"scores `XI`), compute the cap $\mathrm{std}(A)\sqrt{F_i}$ of every parameter. "
        r"Set `cap` $(P,)$.",
        _SCORES + '\nA = seqs["advantage"]                                      # (M,)',
        "cap", """h = XI.sum(axis=1)                                   # (M, P) sequence scores
F = w @ h ** 2
cap = np.sqrt(w @ A ** 2 - (w @ A) ** 2) * np.sqrt(F)""",
        r"On-policy $E[h_i] = 0$, so $F_i = E[h_i^2] = \mathrm{Var}(h_i)$ and "
        r"$G_i = \mathrm{Cov}(A, h_i)$; Cauchy–Schwarz bounds the covariance by "
        r"$\mathrm{std}(A)\,\mathrm{std}(h_i)$. The spread of $A$ is taken around its mean.",
        (Mistake("cap = np.sqrt(w @ A ** 2) * np.sqrt(w @ XI.sum(axis=1) ** 2)",
                 "std(A) is the spread of $A$ around its mean: subtract $(E[A])^2$ under the "
                 "square root."),
         Mistake("cap = A.std() * np.sqrt(w @ XI.sum(axis=1) ** 2)",
                 "weight the advantages by the response probabilities `w`; `A.std()` treats "
                 "every listed response alike.")),
        close_to(lambda ns: ns["r"].bound, rtol=1e-10)),
    Exercise(
        "adam-second-step", "04_gradient_is_covariance", "Adam's second step",
        r"Adam keeps exponential averages $m \leftarrow \beta_1 m + (1-\beta_1)G$ and "
        r"$v \leftarrow \beta_2 v + (1-\beta_2)G^2$ from zero, and steps by "
        r"$\eta\,\hat m/(\sqrt{\hat v} + \epsilon)$, where at the second step "
        r"$\hat m = m/(1-\beta_1^2)$ and $\hat v = v/(1-\beta_2^2)$. From the two exact "
        r"gradients `G1` and `G2` "
        r"below, compute the **second** step, without calling the training code. Set "
        r"`delta` $(P,)$.",
        _DEFAULT + """
lr, eps, b1, b2 = 1e-3, 1e-8, 0.9, 0.999
G1 = r.gradient                                              # (P,) at theta_0
theta1 = task.theta + lr * G1 / (np.abs(G1) + eps)           # Adam's first step
G2 = exact(task.with_(theta=theta1), progress=False).gradient  # (P,) at theta_1""",
        "delta", """m = (1 - b1) * (b1 * G1 + G2)
v = (1 - b2) * (b2 * G1 ** 2 + G2 ** 2)
delta = lr * (m / (1 - b1 ** 2)) / (np.sqrt(v / (1 - b2 ** 2)) + eps)""",
        r"Two updates of the averages from zero give $m = (1-\beta_1)(\beta_1 G_1 + G_2)$ and "
        r"the same for $v$ with $G^2$; the bias corrections divide by $1 - \beta_1^2$ and "
        r"$1 - \beta_2^2$. Every "
        r"coordinate still moves by about $\eta$, whatever the size of its gradient.",
        (Mistake("m = (1 - b1) * (b1 * G1 + G2)\nv = (1 - b2) * (b2 * G1 ** 2 + G2 ** 2)\n"
                 "delta = lr * m / (np.sqrt(v) + eps)",
                 "correct the bias of the zero start: divide $m$ by $1 - \\beta_1^2$ and $v$ "
                 "by $1 - \\beta_2^2$."),
         Mistake("delta = lr * G2 / (np.abs(G2) + eps)",
                 "that is a first step from fresh moments at $\\theta_1$; Adam keeps its "
                 "moments, so step 2 mixes $G_1$ and $G_2$.")),
        close_to(expected_adam2, rtol=1e-9)),
    Exercise(
        "overlap-spread", "04_gradient_is_covariance", "when the overlap is high or low",
        r"Since $\log|G_i| = \log \mathrm{cap}_i + \log|\mathrm{corr}_i|$, scale the second "
        r"term by $s$: $|G^{(s)}_i| = \mathrm{cap}_i \cdot |\mathrm{corr}_i|^s$. For each $s$ "
        r"in `svals`, compute the share of the top 10 by $F$ that are also in the top 10 by "
        r"$|G^{(s)}|$ on the medium model. Predict $s = 0$ and $s = 2$ first. Set "
        r"`overlaps` (one share per $s$).",
        _MEDIUM, "overlaps", """top_F = set(np.argsort(-F)[:n])
overlaps = np.array([len(top_F & set(np.argsort(-(cap * corr ** s))[:n])) / n
                     for s in svals])""",
        r"At $s = 0$ the ranking is the Fisher's own (the cap grows with $F$), so the overlap "
        r"is 1; $s = 1$ is the overlap measured in the lesson. The more $s\log|\mathrm{corr}|$ spreads against "
        r"$\log \mathrm{cap}$, the more the order by $|G|$ departs from the order by $F$: the "
        r"overlap is high when the correlations are alike and low when they vary a lot.",
        (Mistake("top_F = set(np.argsort(-F)[:n])\n"
                 "overlaps = np.array([len(top_F & set(np.argsort(-(cap * corr ** s))[:n]))"
                 " for s in svals])",
                 "give a share of the 10, not a count: divide by `n`."),
         Mistake("top_F = set(np.argsort(-F)[:n])\n"
                 "overlaps = np.array([len(top_F & set(np.argsort(cap * corr ** s)[:n])) / n"
                 " for s in svals])",
                 "`np.argsort` sorts in increasing order, so that took the 10 *smallest* "
                 "$|G^{(s)}|$; sort `-(cap * corr ** s)`."),
         Mistake("top_F = set(np.argsort(F)[:n])\n"
                 "overlaps = np.array([len(top_F & set(np.argsort(cap * corr ** s)[:n])) / n"
                 " for s in svals])",
                 "`np.argsort` sorts in increasing order, so both of your sets hold the 10 "
                 "*smallest* values (an overlap of the bottoms); sort `-F` and "
                 "`-(cap * corr ** s)`.")),
        close_to(expected_overlaps, rtol=0, atol=1e-12)),
    # ---- lesson 5 -------------------------------------------------------------
    Exercise(
        "raw-score-mean", "05_offpolicy_centering", "the raw score's mean under the sampler",
        r"At one state the policy is `p` and the sampler `mu`. For every parameter, "
        r"compute the mean under $\mu$ of the raw score $j_a - \bar j_p$. Set `bias` $(P,)$.",
        _RNG_STATE + "\nmu = np.roll(p, 1)                                          # (V,) the sampler",
        "bias", "bias = J @ mu - J @ p",
        r"$E_\mu[j_a - \bar j_p] = \sum_a \mu_a j_a - \bar j_p = \bar j_\mu - \bar j_p$: zero "
        r"only when the sampler and the policy give the same mean sensitivity.",
        (Mistake("bias = np.zeros(J.shape[0])",
                 "the raw score is centered at $\\bar j_p$, not at the sampler's mean "
                 "$\\bar j_\\mu$, so its mean under $\\mu$ is not zero."),
         Mistake("bias = J @ p - J @ mu",
                 "the sign is flipped: the mean is $\\bar j_\\mu - \\bar j_p$."),
         Mistake("bias = J.mean(axis=1) - J @ p",
                 "the mean under $\\mu$ weights token $a$ by $\\mu_a$ (`J @ mu`); the plain "
                 "mean `J.mean(axis=1)` is the mean under a uniform sampler.")),
        close_to(lambda ns: (ns["J"] * (ns["mu"] - ns["p"])).sum(axis=1), rtol=1e-10)),
    Exercise(
        "best-constant", "05_offpolicy_centering", "the best constant for the raw gradient",
        r"With a constant $c$ added to every advantage, the raw gradient is "
        r"$G^{raw} + c\,E_\mu[h]$ (`raw.gradient + c * raw.score_mean`). On `offpolicy_stale`, "
        r"which $c$ brings it closest to the policy gradient `g` in Euclidean distance? Set "
        r"`c_best` (one unknown: least squares).",
        """import numpy as np
from fisher_ref import load_config, exact
r = exact(load_config("offpolicy_stale"), progress=False)
g, raw = r.gradient, r.streams["raw"]                 # policy gradient; raw stream""",
        "c_best", """m = raw.score_mean                                           # (P,) E_mu[h]
c_best = m @ (g - raw.gradient) / (m @ m)""",
        r"$\|G^{raw} + c\,m - g\|^2$ is a parabola in $c$ with its minimum at "
        r"$c = m\cdot(g - G^{raw})/\|m\|^2$. Even there the raw gradient is not the policy "
        r"gradient; centering does not search for a $c$, it removes the dependence on $c$.",
        (Mistake("m = raw.score_mean\nc_best = m @ (raw.gradient - g) / (m @ m)",
                 "the sign is flipped: $c$ must move $G^{raw}$ *towards* $g$, "
                 "$c = m\\cdot(g - G^{raw})/\\|m\\|^2$."),
         Mistake("m = raw.score_mean\nc_best = m @ (g - raw.gradient)",
                 "divide by $m \\cdot m$: the least-squares coefficient of one direction is "
                 "a projection.")),
        close_to(expected_c_best, rtol=1e-8)),
    # ---- lesson 6 -------------------------------------------------------------
    Exercise(
        "se-by-hand", "06_monte_carlo", "a standard error by hand",
        r"From the sampled values `x` of $h_i^2$, compute the standard error of their mean "
        r"(sample standard deviation with `ddof=1`, over $\sqrt n$). Set `se`.",
        _DEFAULT + """
from fisher_ref.monte_carlo import estimate
mc = estimate(task, 4000, np.random.default_rng(0), keep_samples=True)
i = int(np.argmax(r.sequence_fisher))
x = mc.samples["policy"]["h2"][:, i]                     # (n,)""",
        "se", "se = x.std(ddof=1) / np.sqrt(x.size)",
        r"The mean of $n$ independent draws has variance $\sigma^2/n$; $\sigma$ is estimated by "
        r"the sample standard deviation (`ddof=1` makes its square unbiased), so "
        r"$\mathrm{se} = s/\sqrt n$.",
        (Mistake("se = x.std(ddof=1) / x.size",
                 "divide by $\\sqrt n$, not $n$: it is the *variance* of the mean that falls "
                 "like $1/n$."),
         Mistake("se = x.std() / np.sqrt(x.size)",
                 "use `ddof=1`: numpy's default divides the squared deviations by $n$, not "
                 "$n - 1$.")),
        close_to(lambda ns: ns["mc"].streams["policy"]["sequence_fisher"].se[ns["i"]],
                 rtol=1e-9)),
    Exercise(
        "samples-needed", "06_monte_carlo", "how many samples",
        r"Predict before sampling: with the exact variance `var_h2` of $h_i^2$, how many "
        r"responses $n$ make the standard error of the mean 1% of $F_i$? Set `n_needed` to "
        r"the smallest such integer.",
        _DEFAULT + """
i = int(np.argmax(r.sequence_fisher))
F = r.sequence_fisher[i]
var_h2 = r.streams["policy"].variances["h2"][i]""",
        "n_needed", "n_needed = int(np.ceil(var_h2 / (0.01 * F) ** 2))",
        r"$\mathrm{se} = \sqrt{\mathrm{Var}(h_i^2)/n} \le 0.01 F_i$ holds exactly when "
        r"$n \ge \mathrm{Var}(h_i^2)/(0.01 F_i)^2$; round up.",
        (Mistake("n_needed = int(np.ceil(var_h2 / (0.01 * F)))",
                 "square the target: $\\mathrm{se}^2 = \\mathrm{Var}/n$, so "
                 "$n = \\mathrm{Var}/(0.01F)^2$."),
         Mistake("n_needed = int(np.ceil(np.sqrt(var_h2) / (0.01 * F)))",
                 "that is $\\sqrt n$: the se falls like $1/\\sqrt n$, so square it.")),
        close_to(expected_needed, rtol=0, atol=0.5)),
]

_E += TRANSFORMER_EXERCISES  # lesson 7
_E += LESSON08_EXERCISES  # lesson 8

EXERCISES = {e.id: e for e in _E}
if len(EXERCISES) != len(_E):  # pragma: no cover - guards the data above
    raise RuntimeError("duplicate exercise ids")
