"""Lesson 2: the token Fisher is a probability-weighted spread of logit sensitivities."""
from ._cells import IMPORTS, checks, code, exercise, footer, header, md, quiz

STEM = "02_pairwise_differences"

CELLS = [
    header(STEM, [
        "derive the score of a softmax, $\\partial_i \\log p_a = j_{i,a} - \\bar j_i$, and "
        "from it the centered and the pairwise form of the token Fisher;",
        "compute a state's token Fisher from its probabilities and logit sensitivities, in "
        "numpy and in torch;",
        "show that the centered form and the pairwise form give the same number;",
        "explain why a common shift of all logits costs nothing and why rare tokens count little.",
    ], [
        "[Lesson 1](01_sequence_to_tokens.ipynb): the token Fisher $f_i(s)$ as the expected "
        "squared token score.",
        "The chain rule; a variance as a probability-weighted mean square.",
    ], r"""
## The claim

**Claim.** At a state $s$, the token Fisher of parameter $i$ measures how *differently* the
parameter moves the logits of the tokens the model is likely to choose, not how much it moves
them. Write $j_{i,a} = \partial z_a / \partial\theta_i$ for the **sensitivity** of token $a$'s
logit. Three lines of algebra give two formulas for $f_i(s)$, and the rest of the lesson
checks them.

## Derivation 1: the score of a softmax

The log-probability of token $a$ is $\log p_a = z_a - \log\sum_b e^{z_b}$. Differentiate with
respect to $\theta_i$, using the chain rule on the second term:

$$\partial_i \log p_a = \partial_i z_a - \frac{\sum_b e^{z_b}\,\partial_i z_b}{\sum_b e^{z_b}}
= j_{i,a} - \sum_b p_b\, j_{i,b} = j_{i,a} - \bar j_i,$$

where $\bar j_i = \sum_b p_b j_{i,b}$ is the **mean sensitivity** under the model's
next-token probabilities $p$. The score of a token is its logit's sensitivity measured from
that mean. The token Fisher is the expected square of the score, over $a \sim p$:

$$f_i(s) = \sum_a p_a\,(j_{i,a} - \bar j_i)^2
\qquad\text{(centered form: the variance of } j_{i,\cdot} \text{ under } p\text{)}.$$

Predict what this form does to a shift shared by all tokens:
"""),
    code(IMPORTS),
    *quiz("uniform-shift"),
    md(r"""
## Derivation 2: the pairwise form

Expand the weighted squared gaps between all pairs of tokens (index $i$ dropped; $p$ sums
to 1):

$$\tfrac12\sum_{a,b} p_a p_b (j_a - j_b)^2
= \tfrac12\Big(\sum_a p_a j_a^2 + \sum_b p_b j_b^2 - 2\sum_a p_a j_a \sum_b p_b j_b\Big)
= \sum_a p_a j_a^2 - \bar j^{\,2} = \sum_a p_a (j_a - \bar j)^2 .$$

So

$$f_i(s) = \tfrac12 \sum_{a,b} p_a p_b\,(j_{i,a} - j_{i,b})^2
\qquad\text{(pairwise form: weighted squared gaps)}.$$

Both halves of the claim can be read off it: a common shift cancels in every gap, and the
gap between $a$ and $b$ is weighted by $p_a p_b$, small unless both tokens are likely.
"""),
    code("""
from fisher_ref import token_fisher, token_fisher_pairwise, uniform_token_fisher
from fisher_ref.teaching.views import pairwise_terms"""),
    md(r"""
## A toy state with named tokens

After *She drank a cup of*, suppose the model's next-token distribution puts 0.46 on *tea*,
0.40 on *coffee*, and the rest on *water*, *juice* and *rock*. Four parameters have
hand-made sensitivities: one moves *tea* and *coffee* **together**, one pulls them **apart**,
one **shifts** every logit alike, one moves only the **rare** token *rock* a lot. Predict
which has the larger Fisher, *together* or *apart*:
"""),
    *quiz("tea-coffee"),
    code("""
tokens = ["tea", "coffee", "water", "juice", "rock"]
p = np.array([0.46, 0.40, 0.08, 0.05, 0.01])  # (V,)
names = ["together", "apart", "shift", "rare"]
sens = np.array([                               # (P, V): d z_a / d theta_i
    [1.0, 1.0, 0.0, 0.0, 0.0],
    [1.0, -1.0, 0.0, 0.0, 0.0],
    [2.0, 2.0, 2.0, 2.0, 2.0],
    [0.0, 0.0, 0.0, 0.0, 3.0],
])
f_centered = token_fisher(p, sens)
f_pairwise = token_fisher_pairwise(p, sens)
f_uniform = uniform_token_fisher(sens)
print(f"{'parameter':>10} {'centered':>10} {'pairwise':>10} {'uniform p':>10}")
for name, fc, fp, fu in zip(names, f_centered, f_pairwise, f_uniform):
    print(f"{name:>10} {fc:10.4f} {fp:10.4f} {fu:10.4f}")
print(f"mass on tokens other than tea and coffee: {p[2:].sum():.2f}; "
      f"p(rock) = {p[4]:.2f}")"""),
    md(r"""
The two forms agree. *apart* has by far the largest Fisher: it changes the model's preference
between its two favourite answers. *together* moves the same two logits by the same amount, yet
its Fisher is small: only the mass on the other tokens (printed above) sees a gap. *shift* is
exactly 0, and *rare* is small because *rock* is unlikely, even though its logit moves by 3.
The last column puts the same sensitivities under a uniform $p$: there *rare* would count a lot.

The pairwise terms $\tfrac12 p_a p_b (j_{i,a}-j_{i,b})^2$ show where each Fisher comes from:
"""),
    code("""
terms = pairwise_terms(p, sens)  # (P, V, V)
fig, axes = plt.subplots(1, 4, figsize=(15, 3.8), constrained_layout=True)
for ax, n, t in zip(axes, names, terms):
    # own scale
    im = ax.imshow(t, vmin=0, vmax=t.max() if t.max() > 0 else 1.0, cmap="viridis")
    ax.set_xticks(range(5), tokens, rotation=60)
    ax.set_yticks(range(5), tokens)
    ax.set_xlabel("token $b$")
    ax.set_ylabel("token $a$")
    ax.set_title(f"{n}\\nf = {t.sum():.3f}", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
fig.suptitle(r"Pair terms $\\frac{1}{2}p_ap_b(j_a-j_b)^2$ of each parameter "
             "(colour scale per panel; shift is 0 everywhere)")
plt.show()"""),
    md(r"""
## The computation everything rests on

With $p$ the softmax of the logits and $J$ the sensitivities (one row per parameter), the
token Fisher of every parameter at a state is three lines: the mean sensitivity under $p$,
the sensitivities centered on it, and their $p$-weighted mean square. In numpy:
"""),
    code("""
# (V,) logits of the toy state (up to a constant)
z = np.log(p)
probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()   # (V,) softmax
jbar = sens @ probs                             # (P,)   mean sensitivity under p
# (P,) p-weighted mean square, centered j
f_numpy = ((sens - jbar[:, None]) ** 2) @ probs
print("numpy:", np.round(f_numpy, 6))"""),
    md(r"""
The same three lines in torch (an optional dependency: install it with
`pip install -e ".[torch]"`).
"""),
    code("""
try:
    import torch
except ImportError:
    print("torch is not installed; skipping the torch version (pip install torch)")
else:
    zt = torch.tensor(z, dtype=torch.float64)
    jt = torch.tensor(sens, dtype=torch.float64)                  # (P, V)
    pt = torch.softmax(zt, dim=-1)                                # (V,)
    jbar_t = jt @ pt                                              # (P,)
    f_torch = ((jt - jbar_t[:, None]) ** 2) @ pt                  # (P,)
    print("torch:", np.round(f_torch.numpy(), 6))
    print(f"largest difference from numpy: "
          f"{np.abs(f_torch.numpy() - f_numpy).max():.1e}")"""),
    md(r"""
## The same identities on the tiny language model

Now every state of the default task (a small MLP, vocabulary 5, responses up to 3 tokens).
`exact` enumerates the states; we take each state's sensitivities (all parameters × all tokens)
and check both forms, then add a random shift per parameter and state to every token's
sensitivity — a uniform logit shift — and check that nothing changes.
"""),
    code("""
from fisher_ref.teaching.views import state_sensitivities

task = load_config("default")
result = exact(task, progress=False)
J = state_sensitivities(task, result.states)            # (N, P, V) at every state
probs = result.states["probs"]                          # (N, V)

def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(a).max(), np.abs(b).max())

f_c = token_fisher(probs, J)                            # (N, P)
f_p = token_fisher_pairwise(probs, J)
rng = np.random.default_rng(0)
# (N, P, 1): same for every token
shift = rng.normal(scale=3.0, size=J.shape[:2] + (1,))
f_shifted = token_fisher(probs, J + shift)
print(f"{J.shape[0]} states x {J.shape[1]} parameters; "
      f"vocabulary {task.model.vocab_size}, responses up to {task.max_len} tokens")
print(f"centered vs pairwise:           relative error {rel_err(f_c, f_p):.1e}")
print(f"after a uniform logit shift:    relative error {rel_err(f_c, f_shifted):.1e}")
# (N, P) what exact() accumulated
f_stored = result.states["token_fisher"]
print(f"engine's stored token Fisher:   relative error {rel_err(f_c, f_stored):.1e}")"""),
    md(r"""
All three agree to rounding (the relative errors printed above). The shift was large
(standard deviation 3 in sensitivity units) and the Fisher did not notice it: the softmax
only sees logit differences.
"""),
    checks("""
# shift: 0
assert rel_err(f_centered, f_pairwise) <= 1e-12 and abs(f_centered[2]) <= 1e-12
# the text
assert f_centered[1] > 5 * f_centered[0] > 0 and f_centered[3] < f_uniform[3]
assert np.abs(f_numpy - f_centered).max() <= 1e-12
assert max(rel_err(f_c, f_p), rel_err(f_c, f_shifted), rel_err(f_c, f_stored)) <= 1e-10"""),
    *exercise("pairwise-by-broadcasting"),
    *exercise("predict-one-token"),
    footer(STEM, [
        "$f_i(s) = \\sum_a p_a (j_{i,a} - \\bar j_i)^2 = \\tfrac12\\sum_{a,b} p_a p_b "
        "(j_{i,a} - j_{i,b})^2$: a variance of sensitivities under $p$, three lines of numpy "
        "or torch.",
        "Only differences between tokens count: a common shift of every logit gives 0.",
        "A gap between two tokens counts in proportion to $p_a p_b$: pairs of likely tokens "
        "dominate, rare tokens count little.",
    ]),
]
