"""Lesson 1: the sequence Fisher is a sum of token Fishers (on-policy)."""
from ._cells import IMPORTS, checks, code, exercise, footer, header, md, quiz

STEM = "01_sequence_to_tokens"

CELLS = [
    header(STEM, [
        "write the sequence score as a sum of token scores and the sequence Fisher as $E[h_i^2]$;",
        "derive why the cross terms $\\xi_{u,i}\\xi_{t,i}$ vanish in expectation (conditional "
        "mean zero, then the tower rule) but not on single responses, and say where on-policy "
        "sampling is used;",
        "compute an expectation over all responses by hand as a probability-weighted sum;",
        "say what happens to the score positions of a response that ends early.",
    ], [
        "[Lesson 0](00_start_here.ipynb): the model and how the exercises work.",
        "The score $\\partial_i \\log p$; a conditional expectation; probabilities sum to one.",
    ], r"""
## The claim

A response $y = (y_1, \dots, y_L)$ is generated one token at a time; the state $s_t$ is the
prompt plus the tokens before $y_t$. For a parameter $\theta_i$ the **token score** is
$\xi_{t,i} = \partial_i \log p(y_t \mid s_t)$ and the **sequence score** is their sum,
$h_i = \sum_t \xi_{t,i}$ (the log-probability of a response is a sum over its tokens).
The diagonal **sequence Fisher** is $F_i = E[h_i^2]$, over prompts and responses the model
itself samples.

**Claim.** On the model's own samples the sequence Fisher is the **token Fisher** summed
along the generated states,

$$F_i = E\Big[\sum_t f_i(s_t)\Big], \qquad f_i(s) = E_{a \sim p(\cdot|s)}\big[(\partial_i \log p_a)^2\big].$$

Squaring $h_i$ gives squares $\xi_{t,i}^2$ and cross terms $\xi_{u,i}\xi_{t,i}$ ($u \ne t$),
so the claim says that the cross terms contribute nothing. Before the derivation, predict why.
"""),
    code(IMPORTS),
    *quiz("seq-to-token"),
    md(r"""
## Why the cross terms cancel: a derivation

Expand the square: $h_i^2 = \sum_t \xi_{t,i}^2 + 2\sum_{u<t} \xi_{u,i}\,\xi_{t,i}$. Take one
cross term with $u < t$.

**Step 1: a score has conditional mean zero.** Given the state $s_t$, the next token is drawn
from $p(\cdot \mid s_t)$, the very distribution whose log is differentiated. So

$$E[\xi_{t,i} \mid s_t] = \sum_a p_a\,\partial_i \log p_a = \sum_a \partial_i p_a
= \partial_i \sum_a p_a = \partial_i 1 = 0.$$

**Step 2: the earlier score is known at $s_t$.** $\xi_{u,i}$ depends only on $s_u$ and $y_u$,
and both are part of $s_t$. A known factor comes out of a conditional expectation:

$$E[\xi_{u,i}\,\xi_{t,i} \mid s_t] = \xi_{u,i}\,E[\xi_{t,i} \mid s_t] = 0.$$

**Step 3: the tower rule.** An expectation is the average of conditional expectations,
$E[X] = E\big[E[X \mid s_t]\big]$. So $E[\xi_{u,i}\,\xi_{t,i}] = E[0] = 0$: every cross term
vanishes on average. The tower rule turns each square into a token Fisher,
$E[\xi_{t,i}^2] = E\big[E[\xi_{t,i}^2 \mid s_t]\big] = E[f_i(s_t)]$, and summing over $t$
gives the claim.

On-policy sampling was used once, in step 1. Nothing makes a *single* cross term zero; only
its average is. The cells below check each step on a tiny model whose responses can all be
listed.
"""),
    code("""
from fisher_ref.teaching.views import response_token_scores

task = load_config("default")
r = exact(task, progress=False)
seqs = r.sequences
P, T = task.model.num_params, task.max_len
print(f"vocabulary {task.model.vocab_size} (token 0 = EOS), prompts {task.prompts}, "
      f"responses up to T = {T} tokens")
print(f"{r.n_responses} responses, {r.n_states} states, {P} parameters")
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}
(nb2,), off = layout["b2"]            # output biases: move every state's logits
i = off + int(np.argmax(r.sequence_fisher[off:off + nb2]))  # the parameter we look at
print(f"parameter {i} = b2[{i - off}] (bias of token {i - off}'s logit), "
      f"F = {r.sequence_fisher[i]:.4f}")"""),
    md(r"""
## Cross terms on single responses

Next: the five most likely full-length responses, and the products of their token scores for
parameter $i$. Predict first.
"""),
    *quiz("cross-term-single"),
    code("""
full = np.flatnonzero((seqs["tokens"] >= 0).sum(axis=1) == T)
top = full[np.argsort(-seqs["prob"][full])[:5]]
print(f"{'prompt':>8} {'response':>12} {'prob':>8} "
      f"{'xi1*xi2':>9} {'xi1*xi3':>9} {'xi2*xi3':>9}")
for k in top:
    xi = response_token_scores(task, seqs["prompt"][k], seqs["tokens"][k])[:, i]  # (T,)
    prompt, tokens = task.prompts[seqs['prompt'][k]], seqs['tokens'][k].tolist()
    print(f"{str(prompt):>8} {str(tokens):>12} {seqs['prob'][k]:8.4f} "
          f"{xi[0] * xi[1]:9.4f} {xi[0] * xi[2]:9.4f} {xi[1] * xi[2]:9.4f}")"""),
    md(r"""
## ... and over all responses

Now every response, each weighted by its probability. By hand: the token scores of all
responses, the probability-weighted mean of $\xi_{1,i}\xi_{2,i}$ (step 3), the largest
conditional mean $|E[\xi_{t,i} \mid s_t]|$ (step 1), and $E[h_i^2]$. The engine's
`cross_terms[u, t]` holds the same expectations for every pair of positions.
"""),
    code("""
XI = np.stack([response_token_scores(task, pr, tk)                       # (M, T, P)
               for pr, tk in zip(seqs["prompt"], seqs["tokens"])])
w = seqs["prob"]                                                         # (M,)
prod12 = XI[:, 0, i] * XI[:, 1, i]                                       # (M,)
off_diag = max(np.abs(r.cross_terms[u, t]).max()
               for u in range(T) for t in range(T) if u != t)
print(f"probabilities sum to {w.sum():.15f}")
print(f"E[xi1 xi2] by hand = {w @ prod12: .2e}   (single responses range "
      f"{prod12.min():.2f} .. {prod12.max():.2f})")
print(f"engine, all u != t: max |E[xi_u xi_t]| = {off_diag:.1e}")
print(f"largest |E[xi_t | s_t]| over states and parameters = "
      f"{r.streams['policy'].cond_score_max.max():.1e}")
F_hand = w @ XI.sum(axis=1) ** 2                                         # (P,) E[h^2]
scale = r.sequence_fisher.max()
print(f"E[h^2] by hand vs engine: max relative difference "
      f"{np.abs(F_hand - r.sequence_fisher).max() / scale:.1e}")
print(f"F = E[h^2] vs E[sum_t f(s_t)]: max relative difference "
      f"{np.abs(r.sequence_fisher - r.token_fisher_sum).max() / scale:.1e}")"""),
    md(r"""
The products of single responses take a handful of distinct values. Their probability, value
by value, with the exact mean:
"""),
    code("""
# distinct products
values, where = np.unique(np.round(prod12, 9), return_inverse=True)
# their probability
mass = np.bincount(where, weights=w)
fig, ax = plt.subplots(figsize=(7, 3.6), constrained_layout=True)
ax.stem(values, mass, basefmt=" ", linefmt="tab:orange", markerfmt="o")
ax.axvline(w @ prod12, color="k", lw=1.5, ls="--",
           label=f"exact mean = {w @ prod12:.1e}")
ax.set_xlabel(r"$\\xi_{1,i}\\,\\xi_{2,i}$ of one response")
ax.set_ylabel("probability")
ax.set_title(f"Cross terms of single responses (parameter {i}) average to zero")
ax.legend()
plt.show()"""),
    md(r"""
The cross terms lie on both sides of zero and cancel exactly in the mean; the sequence
Fisher equals the token-sum Fisher to rounding (printed above).

## Responses that end early

A response that draws EOS (token 0) at position $L < T$ stops there: positions $L+1, \dots, T$
hold no token. Their scores are set to **zero** (the arrays are zero-padded), so such a
response contributes only its first $L$ token scores to $h_i$, and every product with a later
position is exactly 0: the tall stem at zero holds all responses that end after one token
($\xi_{2,i} = 0$). The derivation is unharmed: a position with no token adds nothing to
$h_i$, and at a state where the response goes on, the next score still has conditional mean
zero.
"""),
    code("""
# (M,) tokens drawn
lengths = (seqs["tokens"] >= 0).sum(axis=1)
for L in range(1, T + 1):
    print(f"responses of length {L}: {np.sum(lengths == L):3d}, "
          f"probability {w[lengths == L].sum():.4f}")
print(f"probability weight of xi1*xi2 exactly 0: {w[prod12 == 0].sum():.4f}, "
      f"of which length-1 responses: {w[lengths == 1].sum():.4f}")"""),
    md(r"""
## Sampling instead of listing

A real model cannot list its responses; it samples them. The average of $h_i^2$ over sampled
responses converges to $F_i$. Running estimate, with a band of ±2 standard errors, against the
exact value:
"""),
    code("""
from fisher_ref.monte_carlo import estimate, running_estimates

mc = estimate(task, 4000, np.random.default_rng(1), keep_samples=True)
run = running_estimates(mc.samples["policy"]["h2"][:, i], exact=r.sequence_fisher[i])
n = run["n"]
lo, hi = (run["mean"] - 2 * run["se"])[1:], (run["mean"] + 2 * run["se"])[1:]
fig, ax = plt.subplots(figsize=(7, 3.8), constrained_layout=True)
ax.plot(n, run["mean"], color="tab:blue", label=r"running mean of $h_i^2$")
ax.fill_between(n[1:], lo, hi, color="tab:blue", alpha=0.25, label="± 2 se")
ax.axhline(r.sequence_fisher[i], color="k", ls="--",
           label=f"exact F = {r.sequence_fisher[i]:.4f}")
ax.set_xscale("log")
ax.set_xlabel("number of sampled responses")
ax.set_ylabel(rf"estimate of $F_{{{i}}}$")
ax.set_title("Monte Carlo sequence Fisher converging to the exact value")
ax.legend()
plt.show()
print(f"after {n[-1]} responses: {run['mean'][-1]:.4f} ± {run['se'][-1]:.4f}")"""),
    checks("""
# single cross terms: both signs
assert (prod12 > 1e-3).any() and (prod12 < -1e-3).any()
assert abs(w @ prod12) <= 1e-12 * np.abs(prod12).max()     # ... and a zero mean
diag = max(np.abs(r.cross_terms[t, t]).max() for t in range(T))
# every cross term, every parameter
assert off_diag <= 1e-12 * diag
assert r.streams["policy"].cond_score_max.max() <= 1e-12 * max(1.0, diag)   # step 1
assert np.abs(F_hand - r.sequence_fisher).max() <= 1e-10 * scale
assert np.abs(r.sequence_fisher - r.token_fisher_sum).max() <= 1e-10 * scale
short = w[lengths == 1].sum()
assert short > 0 and w[prod12 == 0].sum() >= short         # the stem at zero holds them"""),
    *exercise("second-token-square"),
    *exercise("expected-length"),
    footer(STEM, [
        "On a single response the cross terms $\\xi_{u,i}\\xi_{t,i}$ are not zero; over the "
        "model's own samples they average to exactly zero: the later score has conditional "
        "mean zero given its state, the earlier one is fixed by that state, and the tower rule "
        "averages over the states.",
        "So the sequence Fisher is the token Fisher summed along the generated states: "
        "$F_i = E[\\sum_t f_i(s_t)]$.",
        "Positions after EOS carry a score of zero; they add nothing to $h_i$.",
        "Sampling responses and averaging $h_i^2$ converges to the exact $F_i$.",
    ]),
]
