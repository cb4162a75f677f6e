"""Lesson quizzes as data: question, options, the correct one, feedback per option.

The :class:`Quiz` record and every lesson's questions (lesson 8's rows come from
:mod:`fisher_ref.teaching.lesson08`), keyed by id in ``QUIZZES``;
:mod:`fisher_ref.teaching.quizzes` shows them and checks an answer.
"""
from __future__ import annotations

from dataclasses import dataclass

from fisher_ref.teaching.lesson08 import QUIZ_ROWS as LESSON08_QUIZ_ROWS

__all__ = ["Quiz", "QUIZZES", "LETTERS"]

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
    # ---- lesson 0 -------------------------------------------------------------
    Quiz("window", "00_start_here",
         r"The default model reads a window of $k = 2$ tokens. The prompt is `[3]` and the "
         r"model has generated `[4, 1]` so far. Which tokens does it read to choose the next "
         r"token?",
         (r"`(BOS, 3)`: the start of the prompt, padded with BOS.",
          r"`(3, 4)`: the prompt and the first generated token.",
          r"`(3, 4, 1)`: the whole history, prompt included.",
          r"`(4, 1)`: the last two tokens of the state."),
         3,
         (r"No: the window slides; BOS only pads a state shorter than $k$.",
          r"No: the window is the *last* $k$ tokens of the state, not the first.",
          r"No: the model sees only $k = 2$ tokens; two states that end in the same two "
          r"tokens get the same next-token distribution.",
          r"Right: the state is `3, 4, 1` and the window is its last $k = 2$ tokens.")),
    # ---- lesson 1 -------------------------------------------------------------
    Quiz("seq-to-token", "01_sequence_to_tokens",
         r"When responses are sampled from the model itself, why can the diagonal sequence "
         r"Fisher $F_i = E[h_i^2]$ be split into a sum of per-token contributions "
         r"$E[\sum_t f_i(s_t)]$?",
         (r"Because the sequence score is the mean of the token scores, so the products of "
          r"two positions are divided away.",
          r"Because the logits at different positions are computed independently of one "
          r"another, so their scores are uncorrelated.",
          r"Because each later token score averages to zero given the tokens before it.",
          r"Because every token score is exactly zero on a sampled response."),
         2,
         (r"No: $h_i$ is the sum $\sum_t \xi_{t,i}$ (the log-probability of a sequence is a "
          r"sum of token log-probabilities). Averaging would rescale $F$, not remove cross terms.",
          r"No: position $t$'s logits are computed from the earlier tokens, so they do depend "
          r"on them; the split holds anyway, for a different reason.",
          r"Right: $E[\xi_{t,i} \mid s_t] = 0$ and $\xi_{u,i}$ ($u<t$) is fixed by $s_t$, so "
          r"$E[\xi_{u,i}\xi_{t,i}] = 0$; only the squares survive, and "
          r"$E[\xi_{t,i}^2\mid s_t] = f_i(s_t)$.",
          r"No: single token scores are generally non-zero (the table of one response's scores "
          r"shows it); only their conditional mean is zero.")),
    Quiz("cross-term-single", "01_sequence_to_tokens",
         r"Take one full-length response sampled from the model and one parameter $i$. What is "
         r"the product $\xi_{1,i}\,\xi_{2,i}$ of its first two token scores?",
         (r"A number of either sign, different from one response to the next: only its average "
          r"over all responses is zero.",
          r"Exactly zero for every response, since the two scores are uncorrelated.",
          r"Always positive, since it is one of the terms that make up a Fisher information.",
          r"Equal to $f_i(s_1)\,f_i(s_2)$, the product of the two token Fishers."),
         0,
         (r"Right: the cancellation happens in expectation; single responses carry positive "
          r"and negative cross terms that average out.",
          r"No: uncorrelated means the *average* product is zero; the products of single "
          r"responses are not (only a response that ends after one token has $\xi_{2,i} = 0$).",
          r"No: it takes both signs; only the diagonal terms $\xi_{t,i}^2$ are non-negative.",
          r"No: $f_i(s_t)$ is the conditional mean of $\xi_{t,i}^2$, a different quantity.")),
    # ---- lesson 2 -------------------------------------------------------------
    Quiz("uniform-shift", "02_pairwise_differences",
         r"At one state, parameter $i$ has sensitivities $j_{i,a}$ and token Fisher $f_i(s)$. "
         r"Change the model so that this parameter's effect on **every** token's logit grows "
         r"by the same number $\delta$: $j_{i,a} \to j_{i,a} + \delta$ for all tokens $a$, with "
         r"the probabilities $p$ unchanged. What is the new token Fisher?",
         (r"$f_i(s) + \delta^2$: every logit moved, so the spread grows.",
          r"$f_i(s)$: unchanged.",
          r"$0$: a shift shared by all tokens removes the parameter's effect.",
          r"$f_i(s) + \delta^2 / V$: the shift is spread over the $V$ tokens."),
         1,
         (r"No: $f_i$ only sees differences $j_{i,a} - \bar j_i$, and a common $\delta$ "
          r"cancels in each of them.",
          r"Right: $\bar j_i$ grows by the same $\delta$, so every centered sensitivity "
          r"$j_{i,a} - \bar j_i$, and their $p$-weighted mean square, is unchanged.",
          r"No: the shift removes nothing either; $f_i$ keeps the value the differences give "
          r"it (it is 0 only if it was 0 before).",
          r"No: the vocabulary size does not enter; the shift cancels exactly.")),
    Quiz("tea-coffee", "02_pairwise_differences",
         r"After *She drank a cup of*, the model puts most mass on *tea* and *coffee*. "
         r"Parameter $\theta_1$ raises both logits by 1; parameter $\theta_2$ raises *tea* by 1 "
         r"and lowers *coffee* by 1. Which has the larger token Fisher at this state?",
         (r"$\theta_1$, because it raises the logits of both likely tokens, where most of the "
          r"probability mass is.",
          r"Neither: both token Fishers are exactly zero here.",
          r"They are equal, since both parameters move two logits by a magnitude of 1 each.",
          r"$\theta_2$, because it changes the preference between the two likely tokens."),
         3,
         (r"No: moving two likely tokens together leaves their relative probability as it "
          r"was; only the small mass on other tokens contributes.",
          r"No: $\theta_1$'s Fisher is small but not zero (the other tokens are not moved), and "
          r"$\theta_2$'s is large.",
          r"No: the Fisher weighs differences between likely tokens, not the size of the "
          r"logit movements.",
          r"Right: the pair (tea, coffee) carries weight $p_{tea}\,p_{coffee}$ and $\theta_2$ "
          r"opens a gap of 2 between them; $\theta_1$ opens none.")),
    # ---- lesson 3 -------------------------------------------------------------
    Quiz("likely-alike", "03_where_mass_lands",
         r"Suppose one parameter raises every likely next token's logit by roughly equal "
         r"amounts. According to the pairwise form of the token Fisher, what follows?",
         (r"A large token Fisher, since every logit it moves adds to the Fisher whatever the "
          r"other tokens do.",
          r"A small token Fisher, since the sensitivity gaps among the likely tokens are small.",
          r"A sequence Fisher of exactly zero, for every prompt and every response.",
          r"A value fixed by the vocabulary size $V$ alone."),
         1,
         (r"No: a movement shared by the likely tokens cancels in their pairwise differences.",
          r"Right: pairs of likely tokens dominate the weights $p_ap_b$, and their squared "
          r"gaps $(j_{i,a}-j_{i,b})^2$ are small.",
          r"No: 'roughly equal' is not 'equal', unlikely tokens still contribute a "
          r"little, and single responses are not what the Fisher measures.",
          r"No: the value depends on the probabilities and the sensitivities, not on $V$.")),
    Quiz("ratio-below-one", "03_where_mass_lands",
         r"For most reach-weighted (state, parameter) pairs of a model, "
         r"$f_i(s) / f^{unif}_i(s) < 1$. What does that show on its own?",
         (r"That the model's mass sits on tokens that each parameter moves alike, more often "
          r"than chance would put it there.",
          r"That the model's next-token distribution is close to uniform at most states.",
          r"Little about alignment: a concentrated $p$ alone pulls the ratio below 1.",
          r"That the sequence Fisher of those parameters is negative."),
         2,
         (r"No: a parameter can move the likely token *apart* from the rest and still have a "
          r"ratio below 1, when $p$ is concentrated; compare with shuffled $p$ to see alignment.",
          r"No: under a uniform model $f = f^{unif}$ and the ratio is exactly 1.",
          r"Right: shuffling $p$ across the tokens (which destroys any alignment) gives "
          r"$\kappa(s)\,f^{unif}_i(s)$ on average, with "
          r"$\kappa(s) = (1 - \sum_a p_a^2)/(1 - 1/V) \le 1$: the concentration depends on $p$ "
          r"only. Alignment shows only against the shuffled $p$.",
          r"No: a Fisher is an expected square and never negative.")),
    Quiz("confident-state", "03_where_mass_lands",
         r"The model becomes nearly certain of the next token (one probability close to 1), "
         r"while the sensitivities stay as they are. What happens to the token Fisher of every "
         r"parameter at that state?",
         (r"It goes to zero, whatever the sensitivities are.",
          r"It goes to the uniform reference $f^{unif}_i(s)$, the same sensitivities under "
          r"$p = 1/V$.",
          r"It grows without bound, since one logit dominates.",
          r"It equals the squared sensitivity $j_{i,a}^2$ of the likely token."),
         0,
         (r"Right: every pair has weight $p_ap_b \le p_b$ for some $b$ other than the "
          r"certain token, and all those weights vanish.",
          r"No: $f^{unif}$ does not depend on $p$; $f$ does, and a point mass leaves no "
          r"spread to measure.",
          r"No: $f_i \le \max_{a,b}(j_{i,a}-j_{i,b})^2$, bounded for fixed sensitivities.",
          r"No: $f$ is a variance of the sensitivities under $p$; a point mass has none.")),
    # ---- lesson 4 -------------------------------------------------------------
    Quiz("zero-fisher-zero-gradient", "04_gradient_is_covariance",
         r"On-policy, a parameter has sequence Fisher $F_i = 0$. What can its policy gradient "
         r"$G_i = E[A h_i]$ be?",
         (r"Anything: the gradient depends on the reward, and the Fisher does not see the "
          r"reward at all.",
          r"Exactly $\mathrm{std}(A)$, the largest value the bound allows.",
          r"Zero only if the reward is the same for every response.",
          r"Only zero: $|G_i| \le \mathrm{std}(A)\sqrt{F_i}$."),
         3,
         (r"No: the reward enters through $\mathrm{std}(A)$, but the bound multiplies it by "
          r"$\sqrt{F_i}$.",
          r"No: the bound is an upper limit, and here it is zero.",
          r"No: a zero Fisher alone forces $G_i = 0$, for any reward.",
          r"Right: $G_i = \mathrm{Cov}(A, h_i)$ and Cauchy–Schwarz bounds a covariance by the "
          r"product of standard deviations; $F_i = \mathrm{Var}(h_i) = 0$ forces $G_i = 0$.")),
    Quiz("constant-baseline", "04_gradient_is_covariance",
         r"On-policy, you add the constant $c = 5$ to every advantage. What happens to the "
         r"exact gradient $E[A h]$?",
         (r"It grows by $5\,E[h]$, large for long responses with big scores.",
          r"It is multiplied by 5, like every advantage.",
          r"Nothing: $E[h] = 0$ on-policy, so the constant adds $5\,E[h] = 0$ to the gradient.",
          r"It changes sign, since the baseline is subtracted."),
         2,
         (r"No: on-policy $E[h] = 0$ exactly, so the shift is zero.",
          r"No: the added term is $5\,E[h]$, not $5\,E[Ah]$.",
          r"Right: the gradient is a covariance, blind to constants added to $A$.",
          r"No: the constant contributes nothing.")),
    Quiz("adam-bf16", "04_gradient_is_covariance",
         r"One Adam step from zero moments moves parameter $i$ by "
         r"$\eta\,G_i/(|G_i| + \epsilon) \approx \eta\,\mathrm{sign}(G_i)$. Which parameters "
         r"then change at bf16 precision?",
         (r"Mostly those with the largest Fisher $F_i$, since the bound caps each gradient "
          r"coordinate and so each step.",
          r"Mostly those whose own magnitude $|\theta_i|$ is small: bf16 spacing grows with "
          r"$|\theta_i|$.",
          r"Exactly those with the largest $|G_i|$.",
          r"None: a step of size $\eta$ is too small to show in bf16."),
         1,
         (r"No: the step size no longer follows $G_i$, so the Fisher bound on $G_i$ does not "
          r"decide which parameters move visibly (the measured overlap is close to random).",
          r"Right: every step is about $\eta$, so what decides is whether $\eta$ exceeds the "
          r"bf16 spacing at $\theta_i$, about $|\theta_i|/256$.",
          r"No: Adam's normalisation gives every coordinate with $G_i \ne 0$ about the same "
          r"step; $|G_i|$ hardly matters (that is SGD).",
          r"No: with a large enough $\eta$ almost every parameter changes; the share depends "
          r"on $\eta$.")),
    # ---- lesson 5 -------------------------------------------------------------
    Quiz("centering-needs-mu", "05_offpolicy_centering",
         r"Responses are drawn from a sampler $\mu$ that is not the policy. What do you need to "
         r"center the score so its mean under $\mu$ is zero?",
         (r"The whole next-token distribution $\mu(\cdot|s_t)$ at each state.",
          r"Only the probability $\mu(y_t|s_t)$ of each sampled token, as for importance "
          r"weights.",
          r"Nothing: the raw score already has mean zero under any sampler that covers the "
          r"policy.",
          r"The top-1 token of $\mu$ at each state."),
         0,
         (r"Right: $\tilde\xi = j_{y_t} - \sum_a \mu_a j_a$ needs every $\mu_a$; with only the "
          r"top-$m$ tokens a bias is left (the plot shows how much).",
          r"No: the centering term is $\bar j_\mu = \sum_a \mu_a j_a$, a sum over all tokens.",
          r"No: its mean under $\mu$ is $\bar j_\mu - \bar j_p \ne 0$.",
          r"No: top-1 leaves the largest bias of all the top-$m$ choices shown.")),
    Quiz("uncentered-constant", "05_offpolicy_centering",
         r"Off-policy and uncentered, you add a constant $c$ to every advantage. What happens?",
         (r"Nothing, as on-policy: a constant never changes a gradient that is an average "
          r"over responses.",
          r"The gradient shifts, but it always stays within the bound "
          r"$\mathrm{std}(A)\sqrt{E_\mu[h^2]}$.",
          r"The Fisher $E_\mu[h^2]$ grows by $c^2$.",
          r"It shifts by $c\,E_\mu[h]$, not zero off-policy, and for a large enough $c$ it "
          r"exceeds $\mathrm{std}(A)\sqrt{E_\mu[h^2]}$."),
         3,
         (r"No: on-policy $E[h]=0$; under $\mu$ the raw score's mean is not zero.",
          r"No: the bound does not depend on $c$, the gradient grows linearly in it.",
          r"No: the Fisher does not involve $A$ at all.",
          r"Right: with a non-zero mean the gradient is no longer a covariance; the bound does "
          r"not move with $c$ but the gradient does.")),
    # ---- lesson 6 -------------------------------------------------------------
    Quiz("rao-blackwell", "06_monte_carlo",
         r"Both $h_i^2$ and $\sum_t f_i(s_t)$, averaged over sampled responses, estimate $F_i$. "
         r"Why does the second have lower variance here?",
         (r"It uses more responses: one per state along each response instead of one per "
          r"response.",
          r"It is biased toward zero, and a biased estimator can have a smaller variance than "
          r"an unbiased one.",
          r"It replaces each sampled token's squared score by its mean, and has no cross terms.",
          r"It ignores the prompts."),
         2,
         (r"No: both use the same responses.",
          r"No: both are unbiased; the exact values agree.",
          r"Right: $E[\xi_t^2\mid s_t] = f(s_t)$ is averaged exactly instead of sampled, and "
          r"the zero-mean cross terms (pure noise) are gone.",
          r"No: both average over prompts and responses alike.")),
    Quiz("se-scaling", "06_monte_carlo",
         r"A Monte Carlo estimate from $n$ responses has standard error $\sigma/\sqrt n$. You "
         r"draw 100 times as many responses. The ±2 se band becomes",
         (r"100 times narrower.",
          r"10 times narrower.",
          r"2 times narrower.",
          r"as wide as before."),
         1,
         (r"No: the standard error falls with the square root of $n$.",
          r"Right: $\sqrt{100} = 10$.",
          r"No: that would take 4 times as many responses.",
          r"No: more samples always narrow it.")),
    # ---- lesson 7 -------------------------------------------------------------
    Quiz("key-bias", "07_transformer",
         r"In an attention head, the key bias $b_K$ is added to every key, so the score of "
         r"query position $t$ against key position $u$ is "
         r"$S_{tu} = Q_t \cdot (K_u + b_K)/\sqrt{d_h}$ ($d_h$ the width of one head). What is "
         r"the Fisher of the key-bias parameters?",
         (r"Zero: $Q_t \cdot b_K/\sqrt{d_h}$ is the same for every key $u$, and softmax "
          r"ignores a shared shift.",
          r"Large: the key bias moves every attention score of every query, and so every "
          r"logit that reads those scores, at every state.",
          r"Zero at initialisation only; once the queries grow in training it becomes "
          r"positive.",
          r"The same as the query bias's Fisher, since a score is symmetric in $Q$ and $K$."),
         0,
         (r"Right: the attention weights, and so everything after them, do not depend on "
          r"$b_K$ at all; its sensitivities $j_{i,a}$ are 0 at every state, and so is $F_i$. "
          r"(The query bias is different: $b_Q \cdot K_u$ varies with $u$.)",
          r"No: it moves the scores of one query all by the same amount, and a softmax "
          r"ignores a shared shift.",
          r"No: the shift is shared by all keys of a query whatever $Q_t$ is, at any "
          r"parameter values; the lesson checks it at a second, unrelated $\theta$.",
          r"No: $b_Q \cdot K_u$ changes with the key $u$, so the query bias does reweight "
          r"the keys and has a positive Fisher; $Q_t \cdot b_K$ does not change with $u$.")),
]

_Q += [Quiz(*row) for row in LESSON08_QUIZ_ROWS]  # lesson 8
QUIZZES = {q.id: q for q in _Q}
if len(QUIZZES) != len(_Q):  # pragma: no cover - guards the data above
    raise RuntimeError("duplicate quiz ids")
