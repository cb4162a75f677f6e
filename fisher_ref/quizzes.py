"""Lesson quizzes as data: question, options, the correct one, feedback per option.

A notebook shows a quiz with :func:`show` and answers it with :func:`check`::

    show("seq-to-token")
    answer = None  # put your letter here, e.g. "B"
    check("seq-to-token", answer)

``tests/test_quizzes.py`` proves every correct answer with a computation from
fisher_ref, so a quiz cannot drift from the code.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

__all__ = ["Quiz", "QUIZZES", "get", "quizzes_for", "render_text", "render_html", "show",
           "check", "LETTERS"]

LETTERS = "ABCDEFGH"


@dataclass(frozen=True)
class Quiz:
    """One multiple-choice question.

    Attributes:
        id: short key, unique.
        lesson: the notebook stem it belongs to, e.g. ``"01_sequence_to_tokens"``.
        question: the question (markdown, may hold ``$...$`` math).
        options: the answers, shown lettered A, B, ...
        correct: index of the correct option.
        feedback: one explanation per option.
    """

    id: str
    lesson: str
    question: str
    options: tuple
    correct: int
    feedback: tuple

    def __post_init__(self):
        if not 2 <= len(self.options) <= len(LETTERS):
            raise ValueError(f"quiz {self.id!r}: needs 2..{len(LETTERS)} options")
        if len(self.feedback) != len(self.options):
            raise ValueError(f"quiz {self.id!r}: one feedback per option is required")
        if not 0 <= self.correct < len(self.options):
            raise ValueError(f"quiz {self.id!r}: correct index {self.correct} out of range")


_Q = [
    # ---- lesson 1 -------------------------------------------------------------
    Quiz("seq-to-token", "01_sequence_to_tokens",
         "When responses are sampled from the model itself, why can the diagonal sequence "
         "Fisher $F_i = E[h_i^2]$ be split into a sum of per-token contributions "
         "$E[\\sum_t f_i(s_t)]$?",
         ("Because the sequence score is the mean of the token scores, not their sum.",
          "Because the logits at different positions do not depend on one another.",
          "Because every later token score averages to zero given the tokens before it, so "
          "the expected products of scores at two different positions vanish.",
          "Because each token score is exactly zero on every sampled response."),
         2,
         ("No: $h_i$ is the sum $\\sum_t \\xi_{t,i}$ (the log-probability of a sequence is a "
          "sum of token log-probabilities). Averaging would rescale $F$, not remove cross terms.",
          "No: position $t$'s logits are computed from the earlier tokens, so they do depend "
          "on them; the split holds anyway, for a different reason.",
          "Right: $E[\\xi_{t,i} \\mid s_t] = 0$ and $\\xi_{u,i}$ ($u<t$) is fixed by $s_t$, so "
          "$E[\\xi_{u,i}\\xi_{t,i}] = 0$; only the squares survive, and $E[\\xi_{t,i}^2\\mid s_t] "
          "= f_i(s_t)$.",
          "No: single token scores are generally non-zero (the table of one response's scores "
          "shows it); only their conditional mean is zero.")),
    Quiz("cross-term-single", "01_sequence_to_tokens",
         "Take one response sampled from the model and one parameter $i$. What is the product "
         "$\\xi_{1,i}\\,\\xi_{2,i}$ of its first two token scores?",
         ("Exactly zero, for every response.",
          "Usually non-zero; it is only its average over all responses that is zero.",
          "Always positive, since it is part of a Fisher information.",
          "Equal to $f_i(s_1)\\,f_i(s_2)$."),
         1,
         ("No: the per-response products in the table are clearly not zero.",
          "Right: the cancellation happens in expectation; single responses carry positive "
          "and negative cross terms that average out.",
          "No: it takes both signs; only the diagonal terms $\\xi_{t,i}^2$ are non-negative.",
          "No: $f_i(s_t)$ is the conditional mean of $\\xi_{t,i}^2$, a different quantity.")),
    # ---- lesson 2 -------------------------------------------------------------
    Quiz("uniform-shift", "02_pairwise_differences",
         "At one state, a parameter moves every token's logit by the same amount $c$ "
         "($j_{i,a} \\to j_{i,a} + c$ for all $a$). How does its token Fisher $f_i(s)$ change?",
         ("It grows like $c^2$.",
          "It does not change at all.",
          "It becomes exactly zero.",
          "It grows like $c^2 / V$."),
         1,
         ("No: $f_i$ only sees differences $j_{i,a} - j_{i,b}$, and a common shift cancels in "
          "each of them.",
          "Right: every pairwise difference is unchanged, and so is $\\bar j_i$-centering; "
          "softmax ignores a common shift of all logits.",
          "No: the shift adds nothing but removes nothing either; $f_i$ keeps the value the "
          "differences give it.",
          "No: the vocabulary size does not enter; the shift cancels exactly.")),
    Quiz("tea-coffee", "02_pairwise_differences",
         "After *She drank a cup of*, the model puts most mass on *tea* and *coffee*. Parameter "
         "A raises both logits by 1; parameter B raises *tea* by 1 and lowers *coffee* by 1. "
         "Which has the larger token Fisher at this state?",
         ("A, because it raises two likely tokens.",
          "They are equal: both move two logits by a magnitude of 1.",
          "B, because it changes the preference between the two likely tokens.",
          "Neither: both token Fishers are zero."),
         2,
         ("No: moving two likely tokens together leaves their relative probability as it "
          "was; only the small mass on other tokens contributes.",
          "No: the Fisher weighs differences between likely tokens, not the size of the "
          "logit movements.",
          "Right: the pair (tea, coffee) carries weight $p_{tea}p_{coffee}$ and B opens a gap "
          "of 2 between them; A opens none.",
          "No: A's Fisher is small but not zero (the other tokens are not moved), and B's "
          "is large.")),
    # ---- lesson 3 -------------------------------------------------------------
    Quiz("likely-alike", "03_where_mass_lands",
         "Suppose one parameter raises every likely next token's logit by roughly equal "
         "amounts. According to the pairwise form of the token Fisher, what follows?",
         ("A large token Fisher, since every logit movement adds to it.",
          "A small token Fisher, since the sensitivity differences among the likely tokens "
          "are small.",
          "A sequence Fisher of exactly zero for every prompt and response.",
          "A value fixed by the vocabulary size alone."),
         1,
         ("No: a movement shared by the likely tokens cancels in their pairwise differences.",
          "Right: pairs of likely tokens dominate the weights $p_ap_b$, and their squared "
          "gaps $(j_{i,a}-j_{i,b})^2$ are small.",
          "No: 'nearly the same' is not 'the same', unlikely tokens still contribute a "
          "little, and single responses are not what the Fisher measures.",
          "No: the value depends on the probabilities and the sensitivities, not on $V$.")),
    Quiz("ratio-below-one", "03_where_mass_lands",
         "At a state, $f_i(s) / f^{unif}_i(s) < 1$ for parameter $i$. What does that say?",
         ("The parameter does not move any logit at that state.",
          "The model's next-token distribution is uniform at that state.",
          "The model's mass sits on tokens this parameter moves more alike than the "
          "vocabulary as a whole, so the parameter barely changes the model's choice among "
          "them.",
          "The sequence Fisher of the parameter is negative."),
         2,
         ("No: then both $f$ and $f^{unif}$ would be zero and the ratio undefined.",
          "No: under a uniform model $f = f^{unif}$ and the ratio is exactly 1.",
          "Right: the same sensitivities are weighed by the model's $p$ instead of $1/V$; a "
          "ratio below 1 means the likely pairs have smaller gaps than a uniform pair.",
          "No: a Fisher is an expected square and never negative.")),
    Quiz("confident-state", "03_where_mass_lands",
         "The model becomes nearly certain of the next token (one probability close to 1). "
         "What happens to the token Fisher of every parameter at that state?",
         ("It goes to zero, whatever the sensitivities are.",
          "It goes to the uniform reference $f^{unif}$.",
          "It grows without bound.",
          "It equals the squared sensitivity of the likely token."),
         0,
         ("Right: every pair has weight $p_ap_b \\le p_b$ for some $b$ other than the "
          "certain token, and all those weights vanish.",
          "No: $f^{unif}$ does not depend on $p$; $f$ does, and a point mass leaves no "
          "spread to measure.",
          "No: $f_i \\le \\max_{a,b}(j_{i,a}-j_{i,b})^2$, bounded for fixed sensitivities.",
          "No: $f$ is a variance of the sensitivities under $p$; a point mass has none.")),
    # ---- lesson 4 -------------------------------------------------------------
    Quiz("zero-fisher-zero-gradient", "04_gradient_is_covariance",
         "On-policy, a parameter has sequence Fisher $F_i = 0$. What can its policy gradient "
         "$G_i = E[A h_i]$ be?",
         ("Anything: the gradient depends on the reward, the Fisher does not.",
          "Only zero, because $|G_i| \\le \\mathrm{std}(A)\\sqrt{F_i}$.",
          "Exactly $\\mathrm{std}(A)$.",
          "Zero only if the reward is constant."),
         1,
         ("No: the reward enters through $\\mathrm{std}(A)$, but the bound multiplies it by "
          "$\\sqrt{F_i}$.",
          "Right: $G_i = \\mathrm{Cov}(A, h_i)$ and Cauchy-Schwarz bounds a covariance by the "
          "product of standard deviations; $F_i = \\mathrm{Var}(h_i) = 0$ forces $G_i = 0$.",
          "No: the bound is an upper limit, and here it is zero.",
          "No: a zero Fisher alone forces $G_i = 0$, for any reward.")),
    Quiz("constant-baseline", "04_gradient_is_covariance",
         "On-policy, you add the constant 5 to every advantage. What happens to the exact "
         "gradient $E[A h]$?",
         ("It grows by $5\\,E[h]$, which is large.",
          "It is multiplied by 5.",
          "Nothing: $E[h] = 0$, so the constant contributes $5\\,E[h] = 0$.",
          "It changes sign."),
         2,
         ("No: on-policy $E[h] = 0$ exactly, so the shift is zero.",
          "No: the added term is $5\\,E[h]$, not $5\\,E[Ah]$.",
          "Right: the gradient is a covariance, blind to constants added to $A$.",
          "No: the constant contributes nothing.")),
    # ---- lesson 5 -------------------------------------------------------------
    Quiz("centering-needs-mu", "05_offpolicy_centering",
         "Responses are drawn from a sampler $\\mu$ that is not the policy. What do you need to "
         "center the score so its mean under $\\mu$ is zero?",
         ("Only the probability $\\mu(y_t|s_t)$ of each sampled token.",
          "The whole next-token distribution $\\mu(\\cdot|s_t)$ at each state of the response.",
          "Nothing: the raw score already has mean zero under any sampler.",
          "The top-1 token of $\\mu$ at each state."),
         1,
         ("No: the centering term is $\\bar j_\\mu = \\sum_a \\mu_a j_a$, a sum over all tokens.",
          "Right: $\\tilde\\xi = j_{y_t} - \\sum_a \\mu_a j_a$ needs every $\\mu_a$; with only the "
          "top-$k$ a bias is left (the plot shows how much).",
          "No: its mean under $\\mu$ is $\\bar j_\\mu - \\bar j_p \\ne 0$.",
          "No: top-1 leaves the largest bias of all the top-$k$ choices shown.")),
    Quiz("uncentered-constant", "05_offpolicy_centering",
         "Off-policy and uncentered, you add a constant $c$ to every advantage. What happens?",
         ("Nothing, as on-policy.",
          "The gradient shifts by $c\\,E_\\mu[h]$, and for a large enough $c$ it exceeds the "
          "bound $\\mathrm{std}(A)\\sqrt{E_\\mu[h^2]}$.",
          "The gradient shifts but always stays within the bound.",
          "The Fisher $E_\\mu[h^2]$ grows by $c^2$."),
         1,
         ("No: on-policy $E[h]=0$; under $\\mu$ the raw score's mean is not zero.",
          "Right: with a non-zero mean the gradient is no longer a covariance; the bound does "
          "not move with $c$ but the gradient does.",
          "No: the bound does not depend on $c$, the gradient grows linearly in it.",
          "No: the Fisher does not involve $A$ at all.")),
    # ---- lesson 6 -------------------------------------------------------------
    Quiz("rao-blackwell", "06_monte_carlo",
         "Both $h_i^2$ and $\\sum_t f_i(s_t)$, averaged over sampled responses, estimate $F_i$. "
         "Why does the second have lower variance here?",
         ("It uses more responses.",
          "It replaces each sampled token's squared score by its average over the next "
          "token, and it carries no cross terms, so the randomness of the sampled tokens "
          "matters less.",
          "It is biased toward zero.",
          "It ignores the prompts."),
         1,
         ("No: both use the same responses.",
          "Right: $E[\\xi_t^2\\mid s_t] = f(s_t)$ is averaged exactly instead of sampled, and "
          "the zero-mean cross terms (pure noise) are gone.",
          "No: both are unbiased; the exact values agree.",
          "No: both average over prompts and responses alike.")),
    Quiz("se-scaling", "06_monte_carlo",
         "A Monte Carlo estimate from $n$ responses has standard error $\\sigma/\\sqrt n$. You "
         "draw 100 times as many responses. The ±2 se band becomes",
         ("100 times narrower.",
          "10 times narrower.",
          "2 times narrower.",
          "as wide as before."),
         1,
         ("No: the standard error falls with the square root of $n$.",
          "Right: $\\sqrt{100} = 10$.",
          "No: that would take 4 times as many responses.",
          "No: more samples always narrow it.")),
]

QUIZZES = {q.id: q for q in _Q}
if len(QUIZZES) != len(_Q):  # pragma: no cover - guards the data above
    raise RuntimeError("duplicate quiz ids")


def get(quiz_id):
    """The :class:`Quiz` with this id (``KeyError`` naming the known ids otherwise)."""
    try:
        return QUIZZES[quiz_id]
    except KeyError:
        raise KeyError(f"unknown quiz id {quiz_id!r}; known: {', '.join(QUIZZES)}") from None


def quizzes_for(lesson):
    """The quizzes of one lesson (notebook stem), in order."""
    return [q for q in QUIZZES.values() if q.lesson == lesson]


def render_text(quiz_id):
    """Plain-text rendering: the question and lettered options.

    Example:
        >>> print(render_text("se-scaling").splitlines()[-1])
          D. as wide as before.
    """
    q = get(quiz_id)
    lines = [f"Quiz [{q.id}]: {q.question}"]
    lines += [f"  {LETTERS[k]}. {opt}" for k, opt in enumerate(q.options)]
    return "\n".join(lines)


def render_html(quiz_id):
    """Markdown rendering (for ``IPython.display.Markdown``)."""
    q = get(quiz_id)
    opts = "\n".join(f"- **{LETTERS[k]}.** {opt}" for k, opt in enumerate(q.options))
    return (f"**Quiz `{html.escape(q.id)}`.** {q.question}\n\n{opts}\n\n"
            f"*Answer with* `check(\"{q.id}\", \"A\")` *(your letter).*")


def show(quiz_id):
    """Display a quiz: as Markdown in a notebook, as plain text otherwise."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
        if get_ipython() is not None:
            display(Markdown(render_html(quiz_id)))
            return
    except ImportError:  # pragma: no cover - IPython is optional
        pass
    print(render_text(quiz_id))


def check(quiz_id, answer):
    """Check an answer and print the feedback.

    Args:
        quiz_id: the quiz's id.
        answer: a letter (``"B"`` or ``"b"``), or ``None`` while not answered.

    Returns:
        ``True`` (right), ``False`` (wrong) or ``None`` (not answered yet).

    Example:
        >>> check("se-scaling", None)
        se-scaling: not answered yet -- set `answer` to a letter and run the cell again.
        >>> check("se-scaling", "b")
        se-scaling: B is right. Right: $\\sqrt{100} = 10$.
        True
    """
    q = get(quiz_id)
    if answer is None:
        print(f"{q.id}: not answered yet -- set `answer` to a letter and run the cell again.")
        return None
    letters = LETTERS[:len(q.options)]
    a = answer.strip().upper() if isinstance(answer, str) else ""
    if len(a) != 1 or a not in letters:
        raise ValueError(f"answer must be one of the letters {', '.join(letters)} "
                         f"(or None), got {answer!r}")
    k = letters.index(a)
    ok = k == q.correct
    verdict = "is right." if ok else "is not right."
    print(f"{q.id}: {letters[k]} {verdict} {q.feedback[k]}")
    if not ok:
        print("Try another letter.")
    return ok
