"""Lesson 2: the token Fisher is a probability-weighted spread of logit sensitivities."""
from ._cells import IMPORTS, code, md, quiz

STEM = "02_pairwise_differences"

CELLS = [
    md(r"""
# 2. Token Fisher compares tokens with each other

**Claim.** At a state $s$, the token Fisher of parameter $i$ only sees how differently the
parameter moves the logits of *different* tokens. Write $j_{i,a} = \partial z_a / \partial\theta_i$
for the sensitivity of token $a$'s logit and $\bar j_i = \sum_b p_b j_{i,b}$ for its average under
the model's next-token probabilities $p$. Then two formulas give the same number:

$$f_i(s) = \sum_a p_a\,(j_{i,a} - \bar j_i)^2
\qquad\text{(centered form: a variance under } p\text{)}$$

$$f_i(s) = \tfrac12 \sum_{a,b} p_a p_b\,(j_{i,a} - j_{i,b})^2
\qquad\text{(pairwise form: weighted squared gaps)}$$

The pairwise form says it plainly: moving every logit by the same amount costs nothing, and
a gap between two tokens matters in proportion to how likely *both* are.
"""),
    code(IMPORTS + """
from fisher_ref import token_fisher, token_fisher_pairwise, uniform_token_fisher
from fisher_ref.alignment import pairwise_terms"""),
    md(r"""
## A toy state with named tokens

After *She drank a cup of*, suppose the model's next-token distribution is the one below, and
four parameters with hand-made sensitivities: one moves *tea* and *coffee* **together**, one
pulls them **apart**, one **shifts** every logit alike, one moves only the **rare** token *rock*
a lot.
"""),
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
for n, a, b, u in zip(names, f_centered, f_pairwise, f_uniform):
    print(f"{n:>10} {a:10.4f} {b:10.4f} {u:10.4f}")"""),
    md(r"""
The two forms agree. *apart* has by far the largest Fisher: it changes the model's preference
between its two favourite answers. *together* moves the same two logits by the same amount, yet
its Fisher is small: only the 14% of mass on the other tokens sees a gap. *shift* is exactly 0,
and *rare* is small because *rock* has probability 0.01, even though its logit moves by 3.
The last column puts the same sensitivities under a uniform $p$: there *rare* would count a lot.

The pairwise terms $\tfrac12 p_a p_b (j_{i,a}-j_{i,b})^2$ show where each Fisher comes from:
"""),
    code("""
terms = pairwise_terms(p, sens)  # (P, V, V)
fig, axes = plt.subplots(1, 4, figsize=(13, 3.2), constrained_layout=True)
vmax = terms.max()
for ax, n, t in zip(axes, names, terms):
    im = ax.imshow(t, vmin=0, vmax=vmax, cmap="viridis")
    ax.set_xticks(range(5), tokens, rotation=60)
    ax.set_yticks(range(5), tokens)
    ax.set_xlabel("token $b$")
    ax.set_ylabel("token $a$")
    ax.set_title(f"{n}: f = {t.sum():.3f}")
fig.colorbar(im, ax=axes, label=r"$\\frac{1}{2}p_ap_b(j_a-j_b)^2$")
fig.suptitle("Where each parameter's token Fisher comes from (pairs of tokens)")
plt.show()"""),
    *quiz("tea-coffee"),
    md(r"""
## The same identities on the tiny language model

Now every state of the default task (a small MLP, vocabulary 5, responses up to 3 tokens).
`exact` enumerates the states; we take each state's sensitivities (all parameters × all tokens)
and check both forms, then add a random shift per parameter and state to every token's
sensitivity — a uniform logit shift — and check that nothing changes.
"""),
    code("""
from fisher_ref.enumeration import state_windows
from fisher_ref.sensitivities import sensitivities

task = load_config("default")
result = exact(task, progress=False)
toks = result.states["tokens"]                          # (N, L), -1 padded
W = state_windows(toks, (toks >= 0).sum(axis=1), task.model.context, task.model.bos)
J = sensitivities(task.model, task.theta, W)            # (N, P, V)
probs = result.states["probs"]                          # (N, V)

def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(a).max(), np.abs(b).max())

f_c = token_fisher(probs, J)                            # (N, P)
f_p = token_fisher_pairwise(probs, J)
rng = np.random.default_rng(0)
shift = rng.normal(scale=3.0, size=J.shape[:2] + (1,))  # (N, P, 1): same for every token
f_shifted = token_fisher(probs, J + shift)
print(f"{J.shape[0]} states x {J.shape[1]} parameters")
print(f"centered vs pairwise:           relative error {rel_err(f_c, f_p):.1e}")
print(f"after a uniform logit shift:    relative error {rel_err(f_c, f_shifted):.1e}")
print(f"engine's stored token Fisher:   relative error {rel_err(f_c, result.states['token_fisher']):.1e}")"""),
    md(r"""
All three agree to rounding (about $10^{-16}$). The shift was large (standard deviation 3 in
sensitivity units) and the Fisher did not notice it: the softmax only sees logit differences.
"""),
    *quiz("uniform-shift"),
]
