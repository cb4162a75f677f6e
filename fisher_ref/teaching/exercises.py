"""Lesson exercises as data: a prompt, the code that builds the inputs, a checker, a solution.

A notebook shows an exercise as three cells: the prompt, a code cell that runs the
``setup`` and ends with ``check_exercise(id, answer)``, and a collapsed solution::

    x = None  # your code here
    check_exercise("token-fisher-3-lines", x)

The checker reruns the setup in a fresh namespace (so editing the inputs cannot
fool it), computes the expected answer with fisher_ref by its own route, and
judges the learner's value. ``tests/test_exercises.py`` runs every solution and
proves the checker accepts it and rejects the recorded ``mistake``.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.teaching.views import concentration, shuffled_token_fisher
from fisher_ref.teaching.exercises_transformer import TRANSFORMER_EXERCISES
from fisher_ref.teaching.exercise import Exercise, close_to
from fisher_ref.models.base import ModelSpec
from fisher_ref.numerics import softmax
from fisher_ref.teaching.quizzes import emit
from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import token_fisher, uniform_token_fisher
from fisher_ref.teaching.training import policy_gradient

__all__ = ["Exercise", "EXERCISES", "get", "exercises_for", "check_exercise", "solution",
           "solution_markdown", "cell_code"]


def _anti_aligned(value, ns):
    """Accept ``(p, j)`` with f/f_unif < 1 and alignment factor f/(c f_unif) > 1."""
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
    ratio, a = f / fu, f / (float(concentration(p)) * fu) if concentration(p) > 0 else np.inf
    ok = ratio < 1 < a
    return ok, (f"f/f_unif = {ratio:.3f}, alignment factor a = {a:.3f}: "
                + ("below uniform, yet above its shuffles" if ok else
                   "need f/f_unif < 1 and a > 1"))


def _expected_params(ns):
    return ModelSpec(vocab_size=12, context=2, embed_dim=8, hidden=32).num_params


def _expected_short(ns):
    """P(first token is EOS) from the states: sum over prompts of weight * p(EOS | prompt)."""
    st = ns["r"].states
    root = st["depth"] == 0  # (N,)
    return st["reach"][root] @ st["probs"][root, 0]


def _expected_b2(ns):
    J = sensitivities(ns["task"].model, ns["task"].theta, ns["window"])  # (1, P, V)
    return J[0, ns["off"]:ns["off"] + ns["V"]]


def _expected_one_token(ns):
    return token_fisher(ns["p"], np.eye(5)[:1])[0]


def _expected_concentration(ns):
    return concentration(softmax(ns["betas"][:, None] * ns["z"][None]))  # (B,)


def _expected_adam(ns):
    tr = policy_gradient(ns["task"], steps=1, lr=ns["lr"], optimizer="adam", eps=ns["eps"])
    return tr.thetas[1] - tr.thetas[0]


def _expected_cos(ns):
    g, c = ns["r"].gradient, ns["r"].streams["centered"].gradient  # (P,), (P,)
    return c @ g / (np.linalg.norm(c) * np.linalg.norm(g))


def _expected_needed(ns):
    return np.ceil(ns["var_h2"] / (0.01 * ns["F"]) ** 2)


_DEFAULT = """\
import numpy as np
from fisher_ref import load_config, exact
task = load_config("default")
r = exact(task, progress=False)"""

_SCORES = _DEFAULT + """
from fisher_ref.teaching.views import response_token_scores
seqs, w = r.sequences, r.sequences["prob"]                   # (M,) response probabilities
XI = np.stack([response_token_scores(task, pr, tk)           # (M, T, P) token scores
               for pr, tk in zip(seqs["prompt"], seqs["tokens"])])"""

_STATE0 = _DEFAULT + """
from fisher_ref.teaching.views import state_sensitivities
from fisher_ref.numerics import softmax
J = state_sensitivities(task, r.states)[0]                   # (P, V) at state 0
z = np.log(r.states["probs"][0])                             # (V,) logits up to a constant
betas = np.array([0.0, 0.5, 1.0, 2.0, 4.0])"""

_RNG_STATE = """\
import numpy as np
rng = np.random.default_rng(7)
z = rng.normal(size=6)
p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()          # (V,) next-token probabilities
J = rng.normal(size=(4, 6))                                  # (P, V) sensitivities"""

_E = [
    # ---- lesson 0 -------------------------------------------------------------
    Exercise("count-params", "00_start_here", "count the parameters",
             r"The medium config has $V = 12$, $k = 2$, $d = 8$, $H = 32$. From the layout "
             r"(`E`: $(V+1) \times d$, `W1`: $kd \times H$, `b1`: $H$, `W2`: $H \times V$, "
             r"`b2`: $V$), how many parameters does it have? Set `n_params`.",
             "V, k, d, H = 12, 2, 8, 32",
             "n_params", "n_params = (V + 1) * d + k * d * H + H + H * V + V",
             "n_params = V * d + k * d * H + H + H * V + V",
             close_to(_expected_params, rtol=0, hint="Did you count the BOS row of E?")),
    Exercise("b2-moves-logits", "00_start_here", "what b2 does",
             r"By central finite differences of `task.model.logits` (step $10^{-6}$), compute "
             r"the matrix `S[c, a]` $= \partial z_a / \partial b2_c$ at the window `(1, 2)`. "
             r"Predict its shape and entries first. Set `S`.",
             _DEFAULT + """
window = np.array([[1, 2]])                                  # (1, k)
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}
(V,), off = layout["b2"]""",
             "S", """S = np.zeros((V, V))
for c in range(V):
    step = np.zeros_like(task.theta)
    step[off + c] = 1e-6
    S[c] = (task.model.logits(task.theta + step, window)[0]
            - task.model.logits(task.theta - step, window)[0]) / 2e-6""",
             "S = np.ones((V, V))",
             close_to(_expected_b2, rtol=0, atol=1e-6)),
    # ---- lesson 1 -------------------------------------------------------------
    Exercise("second-token-square", "01_sequence_to_tokens", "a diagonal term by hand",
             r"With the lesson's parameter `i`, compute $E[\xi_{2,i}^2]$, the expected square "
             r"of the second token's score, as a probability-weighted sum over all responses. "
             r"Set `m22`.",
             _SCORES + """
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}
(nb2,), off = layout["b2"]
i = off + int(np.argmax(r.sequence_fisher[off:off + nb2]))""",
             "m22", "m22 = w @ XI[:, 1, i] ** 2",
             "m22 = np.mean(XI[:, 1, i] ** 2)",
             close_to(lambda ns: ns["r"].cross_terms[1, 1, ns["i"]], rtol=1e-10,
                      hint="Weight each response by its probability.")),
    Exercise("early-end", "01_sequence_to_tokens", "responses that end early",
             r"A response that draws EOS as its first token has no second or third token: "
             r"its $\xi_2$ and $\xi_3$ are set to 0, so all its cross terms are exactly 0. "
             r"What probability do such responses carry? Set `p_short`.",
             _SCORES, "p_short", """lengths = (seqs["tokens"] >= 0).sum(axis=1)         # (M,)
p_short = w[lengths < 2].sum()""",
             "p_short = np.mean((seqs['tokens'] >= 0).sum(axis=1) < 2)",
             close_to(_expected_short, rtol=1e-10, hint="Sum probabilities, not responses.")),
    # ---- lesson 2 -------------------------------------------------------------
    Exercise("token-fisher-3-lines", "02_pairwise_differences", "the token Fisher in three lines",
             r"Write the token Fisher of every parameter from `p` $(V,)$ and `J` $(P, V)$ in "
             r"three lines of numpy: the mean sensitivity $\bar j_i$, the centered "
             r"sensitivities, their $p$-weighted mean square. Set `f` $(P,)$.",
             _RNG_STATE, "f", """jbar = J @ p                                # (P,)
centered = J - jbar[:, None]                # (P, V)
f = (centered ** 2) @ p                     # (P,)""",
             "f = (J ** 2) @ p",
             close_to(lambda ns: token_fisher(ns["p"], ns["J"]), rtol=1e-10,
                      hint="Did you subtract the mean sensitivity?")),
    Exercise("predict-one-token", "02_pairwise_differences", "predict before you compute",
             r"Without running anything: under the lesson's $p$ (tea 0.46, coffee 0.40, ...), a "
             r"parameter moves only *tea*'s logit, by 1: $j = (1, 0, 0, 0, 0)$. What is its "
             r"token Fisher? (Hint: the variance of a 0/1 variable.) Set `f_tea` to a number.",
             "import numpy as np\np = np.array([0.46, 0.40, 0.08, 0.05, 0.01])",
             "f_tea", "f_tea = 0.46 * (1 - 0.46)", "f_tea = 0.46",
             close_to(_expected_one_token, rtol=1e-6)),
    # ---- lesson 3 -------------------------------------------------------------
    Exercise("temperature-concentration", "03_where_mass_lands", "what temperature moves",
             r"Sharpen or flatten state 0 with $p_\beta = \mathrm{softmax}(\beta z)$. Compute "
             r"the concentration $c = (1 - \sum_a p_a^2)/(1 - 1/V)$ for each $\beta$ in `betas`. "
             r"Set `c_beta` (one value per $\beta$). What happens to it, and so to the shuffled "
             r"Fisher $c\,f^{unif}$, as $\beta$ grows?",
             _STATE0, "c_beta", """V = z.size
P_beta = softmax(betas[:, None] * z[None])              # (B, V)
c_beta = (1 - (P_beta ** 2).sum(axis=1)) / (1 - 1 / V)""",
             "c_beta = np.ones_like(betas)",
             close_to(_expected_concentration, rtol=1e-10)),
    Exercise("permutation-average", "03_where_mass_lands", "the shuffle, by brute force",
             r"Average state 0's token Fisher over all $V! = 120$ arrangements of its "
             r"probabilities across the tokens (`itertools.permutations`), sensitivities kept. "
             r"Set `f_perm` $(P,)$; compare it with $c(s)\,f^{unif}$.",
             _STATE0 + "\np = r.states['probs'][0]                                  # (V,)",
             "f_perm", """import itertools
from fisher_ref import token_fisher
f_perm = np.mean([token_fisher(p[list(q)], J)
                  for q in itertools.permutations(range(p.size))], axis=0)""",
             "from fisher_ref import uniform_token_fisher\nf_perm = uniform_token_fisher(J)",
             close_to(lambda ns: shuffled_token_fisher(ns["p"], ns["J"]), rtol=1e-10)),
    Exercise("anti-aligned", "03_where_mass_lands", "below uniform, yet not aligned",
             r"Build one state and one parameter with $f/f^{unif} < 1$ whose alignment factor "
             r"$a = f/(c\,f^{unif})$ is above 1: the mass lands on a token the parameter moves "
             r"*apart* from the others. Set `answer = (p, j)` with two vectors of length $V$.",
             "import numpy as np", "answer", """p = np.array([0.97, 0.01, 0.01, 0.01])
j = np.array([1.0, 0.0, 0.0, 0.0])
answer = (p, j)""",
             "answer = (np.full(4, 0.25), np.array([1.0, 0.0, 0.0, 0.0]))",
             _anti_aligned),
    # ---- lesson 4 -------------------------------------------------------------
    Exercise("bound-by-hand", "04_gradient_is_covariance", "the bound from the responses",
             r"From the enumerated responses alone (probabilities `w`, advantages `A`, token "
             r"scores `XI`), compute the cap $\mathrm{std}(A)\sqrt{F_i}$ of every parameter. "
             r"Set `cap` $(P,)$.",
             _SCORES + '\nA = seqs["advantage"]                                      # (M,)',
             "cap", """H = XI.sum(axis=1)                                   # (M, P) sequence scores
F = w @ H ** 2
cap = np.sqrt(w @ A ** 2 - (w @ A) ** 2) * np.sqrt(F)""",
             "cap = np.sqrt(w @ A ** 2) * np.sqrt(w @ XI.sum(axis=1) ** 2)",
             close_to(lambda ns: ns["r"].bound, rtol=1e-10,
                      hint="std(A) is the spread of A around its mean.")),
    Exercise("adam-first-step", "04_gradient_is_covariance", "Adam's first step",
             r"Adam starts with zero moments, so its first bias-corrected step is "
             r"$\eta\,G/(\sqrt{G^2} + \epsilon)$. Compute it for `lr` and `eps` from the exact "
             r"gradient `r.gradient`, without calling the training code. Set `delta` $(P,)$.",
             _DEFAULT + "\nlr, eps = 1e-3, 1e-8", "delta",
             "delta = lr * r.gradient / (np.abs(r.gradient) + eps)",
             "delta = lr * r.gradient", close_to(_expected_adam, rtol=1e-9)),
    # ---- lesson 5 -------------------------------------------------------------
    Exercise("raw-score-mean", "05_offpolicy_centering", "the raw score's mean under the sampler",
             r"At one state the policy is `p` and the sampler `mu`. For every parameter, "
             r"compute the mean under $\mu$ of the raw score $j_a - \bar j_p$. Set `bias` $(P,)$.",
             _RNG_STATE + "\nmu = np.roll(p, 1)                                          # (V,) the sampler",
             "bias", "bias = J @ mu - J @ p", "bias = np.zeros(J.shape[0])",
             close_to(lambda ns: (ns["J"] * (ns["mu"] - ns["p"])).sum(axis=1), rtol=1e-10)),
    Exercise("centered-vs-policy", "05_offpolicy_centering", "not the policy gradient",
             r"The centered gradient is a covariance under the sampler, not the policy "
             r"gradient. On `offpolicy_stale`, compute the cosine between "
             r"`r.streams[\"centered\"].gradient` and the policy gradient `r.gradient`. Set `cos`.",
             """import numpy as np
from fisher_ref import load_config, exact
r = exact(load_config("offpolicy_stale"), progress=False)""",
             "cos", """g, c = r.gradient, r.streams["centered"].gradient
cos = c @ g / (np.linalg.norm(c) * np.linalg.norm(g))""",
             "cos = 1.0", close_to(_expected_cos, rtol=1e-10)),
    # ---- lesson 6 -------------------------------------------------------------
    Exercise("se-by-hand", "06_monte_carlo", "a standard error by hand",
             r"From the sampled values `x` of $h_i^2$, compute the standard error of their mean "
             r"(sample standard deviation with `ddof=1`, over $\sqrt n$). Set `se`.",
             _DEFAULT + """
from fisher_ref.monte_carlo.sampling import estimate
mc = estimate(task, 4000, np.random.default_rng(0), keep_samples=True)
i = int(np.argmax(r.sequence_fisher))
x = mc.samples["policy"]["h2"][:, i]                     # (n,)""",
             "se", "se = x.std(ddof=1) / np.sqrt(x.size)", "se = x.std(ddof=1) / x.size",
             close_to(lambda ns: ns["mc"].streams["policy"]["sequence_fisher"].se[ns["i"]],
                      rtol=1e-9)),
    Exercise("samples-needed", "06_monte_carlo", "how many samples",
             r"Predict before sampling: with the exact variance `var_h2` of $h_i^2$, how many "
             r"responses $n$ make the standard error of the mean 1% of $F_i$? Set `n_needed` to "
             r"the smallest such integer.",
             _DEFAULT + """
i = int(np.argmax(r.sequence_fisher))
F = r.sequence_fisher[i]
var_h2 = r.streams["policy"].variances["h2"][i]""",
             "n_needed", "n_needed = int(np.ceil(var_h2 / (0.01 * F) ** 2))",
             "n_needed = int(np.ceil(var_h2 / (0.01 * F)))",
             close_to(_expected_needed, rtol=0, atol=0.5)),
]

_E += TRANSFORMER_EXERCISES  # lesson 7

EXERCISES = {e.id: e for e in _E}
if len(EXERCISES) != len(_E):  # pragma: no cover - guards the data above
    raise RuntimeError("duplicate exercise ids")

_NAMESPACES = {}


def get(ex_id):
    """The :class:`Exercise` with this id (``KeyError`` naming the known ids otherwise)."""
    try:
        return EXERCISES[ex_id]
    except KeyError:
        raise KeyError(f"unknown exercise id {ex_id!r}; known: {', '.join(EXERCISES)}") from None


def exercises_for(lesson):
    """The exercises of one lesson (notebook stem), in order."""
    return [e for e in EXERCISES.values() if e.lesson == lesson]


def setup_namespace(ex_id):
    """The variables the exercise's setup defines (run once, in a fresh namespace)."""
    if ex_id not in _NAMESPACES:
        ns = {}
        exec(compile(get(ex_id).setup, f"<exercise {ex_id} setup>", "exec"), ns)
        _NAMESPACES[ex_id] = ns
    return _NAMESPACES[ex_id]


def check_exercise(ex_id, value):
    """Judge an answer and show why.

    Returns ``True``/``False``, or ``None`` while ``value`` is ``None`` (not tried yet).

    Example:
        >>> check_exercise("count-params", None)
        count-params: not tried yet -- set `n_params` and run the cell again.
        >>> check_exercise("count-params", 1044)
        count-params: right -- largest difference from the reference 0.0e+00 (tolerance 0.0e+00)
        True
    """
    ex = get(ex_id)
    if value is None:
        print(f"{ex.id}: not tried yet -- set `{ex.answer}` and run the cell again.")
        return None
    ok, why = ex.judge(value, setup_namespace(ex_id))
    verdict = "right" if ok else "not yet"
    tail = "" if ok else " (the solution is in the collapsed cell below)"
    emit(f"**{ex.id}**: {verdict} -- {why}{tail}", f"{ex.id}: {verdict} -- {why}{tail}")
    return bool(ok)


def solution(ex_id):
    """Print the solution code."""
    print(get(ex_id).solution)


def cell_code(ex_id):
    """The notebook's code cell: the setup, a blank answer, the check."""
    ex = get(ex_id)
    return (f"{ex.setup}\n\n# your code here: set `{ex.answer}`\n{ex.answer} = None\n"
            f"check_exercise(\"{ex.id}\", {ex.answer})")


def solution_markdown(ex_id):
    """A collapsed (HTML ``<details>``) Markdown block holding the solution."""
    ex = get(ex_id)
    return (f"<details><summary>Solution to <code>{ex.id}</code> (click to open)</summary>\n\n"
            f"```python\n{ex.solution}\n```\n\n</details>")
