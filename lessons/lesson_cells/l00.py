"""Lesson 0: what fisher_ref is, the two arguments, the model, how to use the lessons."""
from ._cells import IMPORTS, PATH, code, exercise, footer, header, md, quiz

STEM = "00_start_here"

_SHOWS = {
    "01_sequence_to_tokens": "cross terms vanish on average, so the sequence Fisher is a sum "
                             "of token Fishers",
    "02_pairwise_differences": "the token Fisher is a variance of logit sensitivities, "
                               "half the weighted squared gaps between pairs of tokens",
    "03_where_mass_lands": "how the Fisher depends on where $p$ puts its mass; concentration "
                           "told apart from alignment",
    "04_gradient_is_covariance": "the gradient is a covariance capped by "
                                 "$\\mathrm{std}(A)\\sqrt{F_i}$; why high Fisher and high "
                                 "gradient overlap, and when not",
    "05_offpolicy_centering": "samples from another distribution need the score centered "
                              "under it; what centering buys and what it does not",
    "06_monte_carlo": "sampled estimates, their standard errors, and the exact values they "
                      "converge to",
    "07_transformer": "the same identities on a small GPT-2 (attention, LayerNorm, a tied head); "
                      "where its Fisher sits; a key bias with zero Fisher",
    "08_rl_estimators": "the exact bias and variance of the losses RL trainers ship: "
                        "importance ratios, TIS/MIS, GRPO, length normalisation, KL terms",
}
_LESSON_LIST = "\n".join(f"| [{k}. {title}]({stem}.ipynb) | {_SHOWS[stem]} |"
                         for k, (stem, title) in enumerate(PATH[1:], start=1))

NOTATION = r"""
## Notation

One meaning per symbol, in every lesson (docs/theory.md §1.1 has the same table).

| symbol | meaning | lessons |
|---|---|---|
| $V$ | number of tokens; token 0 is EOS, and BOS is an extra input-only id | all |
| $k$ | window: how many of the last tokens the MLP reads | 0–6 |
| $d$, $D$ | embedding width; hidden width of the MLP | 0, 7 |
| $P$, $\theta$, $i$ | number of parameters; the flat parameter vector; a parameter's index | all |
| $x$, $y$, $T$, $L$ | a prompt; a response; the longest response; one response's length | all |
| $s_t$; $t$, $u$ | the state before token $t$ (prompt and $y_1 \dots y_{t-1}$); positions | all |
| $a$, $b$ | tokens | all |
| $z_a(s)$, $p_a(s)$ | logit and probability of token $a$ at state $s$ | all |
| $j_{i,a}(s)$ | sensitivity $\partial z_a / \partial \theta_i$ | 2– |
| $\bar j_i$, $\bar j_{\mu,i}$ | mean sensitivity under $p$; under the sampler $\mu$ | 2–, 5 |
| $\xi_{t,i}$ | token score $\partial_i \log p(y_t \mid s_t)$ | 1– |
| $h_i$ | sequence score $\sum_t \xi_{t,i}$ | 1– |
| $F_i$ | sequence Fisher $E[h_i^2]$ | 1– |
| $f_i(s)$ | token Fisher $E_{a \sim p}[(\partial_i \log p_a)^2]$ | 1– |
| $f^{unif}_i(s)$ | the token Fisher with $p$ replaced by the uniform $1/V$ | 2–3 |
| $\delta$ | a number added to every sensitivity (a uniform logit shift) | 2 |
| $\beta$ | inverse temperature: $p_\beta = \mathrm{softmax}(\beta z)$ | 3 |
| $\pi$ | a permutation of the tokens (a shuffle of $p$) | 3 |
| $\rho(s)$ | reach: the probability that generation passes through state $s$ | 3 |
| $\kappa(s)$ | concentration $(1 - \sum_a p_a^2)/(1 - 1/V)$ | 3 |
| $\alpha_i(s)$ | alignment factor $f_i / (\kappa f^{unif}_i)$; $F^{shuf}_i$ its sequence form | 3 |
| $R$, $R_0$, $A$ | reward; a constant baseline; advantage $A = R - R_0$ | 4– |
| $c$ | a constant added to every advantage | 4–5 |
| $G_i$ | policy gradient $E[A h_i]$ | 4– |
| cap$_i$, corr$_i$ | the bound $\mathrm{std}(A)\sqrt{F_i}$; $\mathrm{corr}(A, h_i)$ | 4, 7 |
| $q$ | top-$q$: a share of the parameters, ranked by $F$ or by $\lvert G \rvert$ | 4, 7 |
| $\eta$, $\epsilon$ | step size; a small constant added to a denominator (Adam's; GRPO's $10^{-6}$) | 4, 8 |
| $\beta_1$, $\beta_2$ | Adam's averaging constants (not the inverse temperature $\beta$) | 4 |
| $\mu$ | the sampler the responses come from, when it is not $p$ | 5, 7 |
| $\tilde \xi$, $\tilde h$ | token and sequence score centered under $\mu$ | 5 |
| $m$ | top-$m$: how many of $\mu$'s most likely tokens are known | 5 |
| $n$, $\sigma$, se | number of samples; sd of one sampled value; standard error $\sigma/\sqrt n$ | 6 |
| $\zeta$ | z-score: (estimate − exact) / se | 6 |
| $X$, $Y$ | GPT-2's residual stream; $Y = \mathrm{LN}_1(X)$, the input of `c_attn` | 7 |
| $Q$, $K$, $V'$ | queries, keys, values of a head; $b_Q$, $b_K$ their biases | 7 |
| $S_{tu}$, $d_h$ | score of query position $t$ on key position $u$; width of one head | 7 |
| $\mathcal L$; $\lambda_{i,t}$ | a loss to be minimised; $\partial \mathcal L / \partial \log p(y_{i,t} \mid s_{i,t})$ | 8 |
| $B$ | group size: the responses to one prompt that a loss reads | 8 |
| $r_t$, $r(y)$; $C$ | a token's ratio $p / \mu$ and the sequence ratio $\prod_t r_t$; a cap on a ratio | 8 |
| $\omega$ | the least-squares scale in $E[\nabla \mathcal L] \approx \omega G$ | 8 |
| $\gamma$, $w_B(\gamma)$ | a prompt's pass rate $P(R = 1)$; GRPO's difficulty weight | 8 |
| $\nu$, $\mathcal A_B$ | the other responses' successes, $\mathrm{Bin}(B - 1, \gamma)$; the mean advantage given one reward | 8 |
| $H_1$, $H_0$ | $\sum p(y)\,h(y)$ over the responses of reward 1, of reward 0 | 8 |
| $p_{ref}$, $\Delta_t$ | a reference policy; $\log p(y_t \mid s_t) - \log p_{ref}(y_t \mid s_t)$ | 8 |
| $\phi(y)$ | a function of the response that does not depend on $\theta$ | 8 |
"""

CELLS = [
    header(STEM, [
        "say what fisher_ref computes and why its numbers are exact;",
        "state the two arguments the lessons check, in a sentence each;",
        "read the model's parameter layout and say what `b2` does to the logits;",
        "answer a quiz and check an exercise.",
    ], [
        "Python and numpy; the softmax and the chain rule; an expectation as a weighted sum.",
    ], r"""
## What fisher_ref is

A language model writes a response one token at a time, drawing each token from a softmax
over its vocabulary. Quantities such as the Fisher information or the expected policy gradient
are averages over *every* response the model could write. For a real model there are far too
many, so one samples and hopes. fisher_ref takes the other road: its model is so small
(a handful of tokens, responses of at most a few tokens) that every response can be listed
with its exact probability. Every average then becomes a finite sum in float64, with nothing
estimated. Those exact numbers are the reference that sampling, a torch implementation or
your own code can be held against. How the numbers are made, in short readable code: the
source file `fisher_ref/reference.py` of the repository.
"""),
    code(IMPORTS),
    md(r"""
## The two arguments the lessons check

**1. Why on-policy tokens can carry little Fisher information (lessons 1–3).** The diagonal
Fisher of a whole response is the sum, over its positions, of a per-token Fisher, because
on the model's own samples the products of scores at two positions average to zero. The
per-token Fisher of a parameter is the spread, under the model's next-token probabilities,
of how much that parameter moves each token's logit. A parameter that moves the *likely*
tokens by the same amount changes their relative probabilities little, so it gets a small
Fisher even when it moves the logits a lot. Lesson 3 also shows how to tell this apart from
the model simply being confident.

**2. Why the update goes where the Fisher is (lessons 4–5).** On the model's own samples the
score has mean zero, so the policy gradient is a covariance between advantage and score, and
the Fisher is the score's variance. Cauchy–Schwarz then caps each gradient coordinate by
$\mathrm{std}(A)\sqrt{F_i}$. Lesson 4 measures how well Fisher predicts where the gradient is,
and what a "share of parameters changed" in bf16 does and does not say. Lesson 5 shows that
samples from another distribution (a stale model, a higher temperature) break the argument
unless the score is centered under that distribution, and what centering buys (invariance to a
constant added to the advantage, a valid bound) and does not (the policy gradient's direction).

Lesson 6 checks that sampling converges to every exact value, with honest error bars. Lesson 7
runs every check again on a small GPT-2 transformer: the identities do not depend on how the
logits are computed.

## A first quiz

Quizzes come *before* the text that answers them. This one asks how the model of these
lessons reads its input; predict, then read the next section:
"""),
    *quiz("window"),
    md(r"""
## The model

A state $s$ is the prompt plus the tokens generated so far. The model reads only a **window**
of the last $k$ tokens of the state (padded on the left with a BOS token when the state is
shorter), looks up the row $e_l$ of the embedding block `E` for the $l$-th token of the
window, and computes

$$z(s) = \tanh\big([e_1, \dots, e_k]\,W_1 + b_1\big)\,W_2 + b_2, \qquad
p(\cdot \mid s) = \mathrm{softmax}(z(s)),$$

with $V$ tokens (token 0 is EOS: drawing it ends the response). `b2` is the **output bias**: one
number per token, added to that token's logit at every state. All parameters live in one flat
vector `theta`; the layout says which slice is which block.
"""),
    code("""
task = load_config("default")
m = task.model
print(f"V = {m.vocab_size} tokens (0 = EOS, BOS = {m.bos} as input only), "
      f"window k = {m.context}")
print(f"{'block':>5} {'shape':>9} {'offset':>7} {'size':>5}")
for name, shape, offset in m.layout():
    print(f"{name:>5} {str(shape):>9} {offset:7d} {int(np.prod(shape)):5d}")
print(f"P = {m.num_params} parameters; prompts {task.prompts}, "
      f"responses up to {task.max_len} tokens")
r = exact(task, progress=False)
print(f"exact() listed {r.n_responses} responses through {r.n_states} states")"""),
    md(r"""
What `b2` does, checked: raise `b2[2]` by one and every window's logit of token 2 goes up by
exactly one, the others not at all.
"""),
    code("""
layout = {name: (shape, offset) for name, shape, offset in m.layout()}
(V,), off = layout["b2"]
windows = np.array([[m.bos, 1], [1, 2], [4, 3]])                  # (3, k)
bumped = task.theta.copy()
bumped[off + 2] += 1.0
print("change of the logits, one row per window:")
print(np.round(m.logits(bumped, windows) - m.logits(task.theta, windows), 12))"""),
    md(r"""
## How the quizzes and exercises work

A **quiz** comes *before* the cells that answer it: predict, then read on. Run its cell and
click an option (the buttons need the optional package `jupyterquiz`: `pip install -e
".[lessons]"`); each option explains itself. Without the buttons, or anywhere else, the cell
after it reads `answer = None`: put your letter there (`answer = "C"`) and run it. Left as
`None`, it prints "not answered yet", so a notebook runs top to bottom unattended.

An **exercise** ("Try it yourself") gives a cell that builds its inputs and ends with
`check_exercise(...)`. Replace `None` by your code's result and run it. The checker rebuilds
the inputs itself and computes the reference its own way, so changing the inputs will not
help; a wrong answer that matches a common mistake is told which one. The solution, and why it
is right, sits in a collapsed cell below: click to open.

The last code cell of each lesson is collapsed too: it asserts every claim the lesson's text
makes, so the test suite can run it. You can skip it.
"""),
    *exercise("count-params"),
    *exercise("b2-moves-logits"),
    md(NOTATION),
    md(f"""
## The lessons

Read them in order; each one names what it needs from the ones before.

| lesson | what it shows |
|---|---|
{_LESSON_LIST}
"""),
    footer(STEM, [
        "Unless a cell says it draws random numbers (sampled responses, shuffles), every "
        "number in these lessons is an exact finite sum over listed responses.",
        "The model reads a window of the last $k$ tokens; `b2[a]` adds to token $a$'s logit "
        "at every state, so $\\partial z_a / \\partial b2_b$ is 1 if $a = b$ and 0 otherwise.",
        "Quizzes come before their answer: click an option or set `answer` to a letter. "
        "Exercises: set the named variable; the solution, with its reason, is collapsed "
        "below each one.",
    ]),
]
