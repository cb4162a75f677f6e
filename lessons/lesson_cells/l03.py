"""Lesson 3: the same sensitivities give a Fisher that depends on where p puts its mass;
concentration and alignment told apart with a shuffled-p control."""
from ._cells import IMPORTS, checks, code, exercise, footer, header, md, quiz

STEM = "03_where_mass_lands"

CELLS = [
    header(STEM, [
        "show that the token Fisher changes with the next-token distribution $p$ while the "
        "sensitivities stay fixed;",
        "compare $f$ with the uniform reference $f^{unif}$, and say why a ratio below 1 is "
        "mostly a sign of a *concentrated* $p$;",
        "separate concentration from alignment with a shuffled-$p$ control and the exact "
        "factor $\\kappa(s) = (1 - \\sum_a p_a^2)/(1 - 1/V)$;",
        "say what this toy model does and does not show about alignment.",
    ], [
        "[Lesson 2](02_pairwise_differences.ipynb): the centered and pairwise forms of $f_i(s)$.",
        "Permutations; the median; reading a histogram.",
    ], r"""
## The claim

The token Fisher is not a property of the sensitivities alone. Keep a state's sensitivities
$j_{i,a}$ fixed and change only the next-token distribution $p$: the Fisher moves, because the
pairwise form weighs each gap $(j_{i,a}-j_{i,b})^2$ by $p_ap_b$. Two different things can make
it small:

* **concentration**: when $p$ puts nearly all its mass on one token, every pair weight
  $p_ap_b$ is small, whatever the sensitivities (a confident state);
* **alignment**: when the tokens that hold the mass are ones the parameter moves *alike*,
  their gaps are small, even if $p$ is spread over several of them.

The lesson measures both, and shows how to tell them apart.
"""),
    code(IMPORTS + """
from fisher_ref import token_fisher, uniform_token_fisher
from fisher_ref.teaching.views import (fisher_ratio, entropy, concentration,
                                       shuffled_token_fisher, shuffle_control,
                                       state_sensitivities)
from fisher_ref.numerics import softmax

task = load_config("default")
result = exact(task, progress=False)
states = result.states
J_all = state_sensitivities(task, states)                 # (N, P, V)
print(f"{len(states['reach'])} states, {task.model.num_params} parameters, "
      f"vocabulary {task.model.vocab_size}")"""),
    md(r"""
## One state, many distributions

Take the first prompt's state and its logits $z$. Sharpen or flatten the distribution with an
inverse temperature $\beta$: $p_\beta = \mathrm{softmax}(\beta z)$, keeping the sensitivities
$j$ as they are. At $\beta = 0$ the distribution is uniform and $f = f^{unif}$; as $\beta$ grows
the model becomes certain. Predict what happens to $f$ first:
"""),
    *quiz("confident-state"),
    code("""
# first state: prompt 0, nothing generated
s = 0
J = J_all[s]                                              # (P, V)
# (V,) the logits, up to a constant
z = np.log(states["probs"][s])
betas = np.linspace(0.0, 12.0, 61)
f_beta = np.array([token_fisher(softmax((b * z)[None])[0], J) for b in betas])  # (B, P)
# four parameters with large f_unif
top = np.argsort(-uniform_token_fisher(J))[:4]

fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
for i in top:
    axes[0].plot(betas, f_beta[:, i], label=f"parameter {i}")
axes[0].axvline(1.0, color="k", ls=":", label=r"the model ($\\beta = 1$)")
axes[0].set_yscale("log")
axes[0].set_xlabel(r"inverse temperature $\\beta$")
axes[0].set_ylabel(r"token Fisher $f_i(s)$ under $p_\\beta$")
axes[0].set_title("Same sensitivities, sharper distribution")
axes[0].legend(fontsize=8)
axes[1].plot(betas, [softmax((b * z)[None])[0].max() for b in betas])
axes[1].set_xlabel(r"inverse temperature $\\beta$")
axes[1].set_ylabel("largest next-token probability")
axes[1].set_title("How confident the state is")
plt.show()
f_at_1 = f_beta[np.searchsorted(betas, 1.0)]
print("beta = 0 equals the uniform reference:",
      np.allclose(f_beta[0], uniform_token_fisher(J), rtol=1e-12))
print(f"largest f at beta = 12: {f_beta[-1].max():.2e}  "
      f"(at beta = 1: {f_at_1.max():.2e})")"""),
    md(r"""
## The ratio $f/f^{unif}$ over every state and parameter

The **uniform reference** $f^{unif}_i(s)$ is the same sensitivities under $p = 1/V$. `exact`
stores it next to $f_i(s)$ for every state, and `fisher_ratio` divides them. The ratio is
undefined (NaN) where $f^{unif}_i(s) = 0$, which happens exactly when the parameter moves
**every logit by the same amount** at that state, zero included: for instance the embedding
row of a token that is not in the window moves nothing. `fisher_ratio` also returns NaN where
$f^{unif}_i(s)$ is not zero but below $10^{-12}$ of its largest value (here: weights into a
hidden unit that $\tanh$ has saturated at that state). A histogram of $\log_{10}$ of the
ratio, each state weighted by its **reach** $\rho(s)$, the probability that generation
passes through it:
"""),
    code("""
ratio = fisher_ratio(result)                              # (N, P), NaN where f_unif = 0
reach = np.broadcast_to(states["reach"][:, None], ratio.shape)
ok = np.isfinite(ratio) & (ratio > 0)
fu_all = states["uniform"]                                # (N, P)
# (N, P) every logit moved alike
flat = np.ptp(J_all, axis=2) == 0
nan = np.isnan(ratio)
print(f"NaN entries: {nan.sum()}:")
print(f"  {(flat & nan).sum()} where j is the same for every token "
      f"(f_unif = 0 there: {np.all(fu_all[flat] == 0)}),")
print(f"  {(~flat & nan).sum()} where 0 < f_unif < 1e-12 max f_unif")
fig, ax = plt.subplots(figsize=(7, 3.6), constrained_layout=True)
ax.hist(np.log10(ratio[ok]), bins=50, weights=reach[ok], color="tab:purple", alpha=0.8)
ax.axvline(0.0, color="k", ls="--", label="ratio 1")
ax.set_xlabel(r"$\\log_{10}\\, f_i(s) / f^{unif}_i(s)$")
ax.set_ylabel("reach-weighted count")
ax.set_title("Model probabilities against the uniform reference, "
             "all (state, parameter) pairs")
ax.legend()
plt.show()
below = (reach[ok] * (ratio[ok] < 1)).sum() / reach[ok].sum()
print(f"reach-weighted share of (state, parameter) pairs with f < f_unif: {below:.1%}")"""),
    md(r"""
Most reach-weighted pairs sit below 1. It is tempting to read this as "the model's mass sits
on tokens each parameter moves alike". Before believing it, look at how confident the states
are. Each state's entropy says how spread out $p$ is; against it, the median ratio over the
parameters at that state. Several states share a window of the last $k$ tokens and so share
their whole distribution: they lie exactly on top of each other, so each depth gets its own
marker.
"""),
    code("""
ent = entropy(states["probs"])                            # (N,) in nats
med = np.nanmedian(np.where(ok, ratio, np.nan), axis=1)   # (N,)
kappa = concentration(states["probs"])                    # (N,)
total_f = states["token_fisher"].sum(axis=1)              # (N,)
windows = {tuple(t[t >= 0][-task.model.context:]) for t in states["tokens"]}
print(f"{len(ent)} states, {len(windows)} distinct windows of the last "
      f"{task.model.context} tokens")
markers = {0: ("o", 90), 1: ("s", 55), 2: ("^", 30), 3: ("D", 14)}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for d, (mk, size) in markers.items():
    at = states["depth"] == d
    if at.any():
        for ax, y in zip(axes, (med, total_f)):
            ax.scatter(ent[at], y[at], marker=mk, s=size, facecolors="none",
                       edgecolors=plt.cm.viridis(d / 3), label=f"depth {d}")
axes[0].scatter(ent, kappa, marker="x", s=12, color="k",
                label=r"$\\kappa(s)$ (see below)")
axes[0].axhline(1.0, color="k", ls="--", lw=0.8)
axes[0].axvline(np.log(task.model.vocab_size), color="gray", ls=":")
axes[0].set_xlabel("entropy of p(.|s) (nats); dotted: log V")
axes[0].set_ylabel(r"median over parameters of $f/f^{unif}$")
axes[0].set_title("Confident states have low ratios")
axes[0].legend(fontsize=8)
axes[1].set_xlabel("entropy of p(.|s) (nats)")
axes[1].set_ylabel(r"total token Fisher $\\sum_i f_i(s)$", labelpad=8)
axes[1].set_title("Confident states carry little token Fisher")
axes[1].legend(title="tokens generated", fontsize=8)
plt.show()"""),
    md(r"""
## Concentration or alignment? A shuffled-$p$ control

Before the control: what does a ratio below 1 show, taken on its own?
"""),
    *quiz("ratio-below-one"),
    md(r"""

A control that keeps the concentration and destroys any alignment: at every state, **shuffle
the probabilities across the tokens** (a random permutation per state). The entropy and
every other property of the *set* of probabilities stay; which token gets which probability
becomes random, so no parameter can be aligned with it any more. If the share of ratios below
1 came from alignment, the shuffled model would have a much smaller share.
"""),
    code("""
control = shuffle_control(task, result, np.random.default_rng(0), shuffles=200)
shuffled_share = control["shuffled_share"]                # (200,) one share per shuffle
fig, ax = plt.subplots(figsize=(7, 3.2), constrained_layout=True)
ax.hist(100 * shuffled_share, bins=25, color="0.6", label="200 shuffles of p")
ax.axvline(100 * below, color="tab:purple", lw=3, label="the model")
ax.set_xlabel("reach-weighted % of pairs with f < f_unif")
ax.set_ylabel("shuffles")
ax.set_title("The share below the uniform reference survives shuffling")
ax.legend()
plt.show()
print(f"model: {below:.1%};  shuffled p: mean {shuffled_share.mean():.1%}, "
      f"range {shuffled_share.min():.1%} .. {shuffled_share.max():.1%}")"""),
    md(r"""
The model's share sits inside the range of its shuffles: on this model the share below the
uniform reference is explained by **concentration**, not alignment. The reason is exact.
Averaged over every permutation $\pi$ of $p$ across the tokens,

$$E_\pi\big[f_i(s)\big] = \kappa(s)\, f^{unif}_i(s), \qquad
\kappa(s) = \frac{1 - \sum_a p_a^2}{1 - 1/V} \in [0, 1].$$

To see it, write $f = \sum_a p_a j_a^2 - \sum_{a,b} p_a p_b j_a j_b$ (index $i$ dropped) and
average the probabilities over the shuffles: with $S = \sum_a p_a^2$, a shuffled
$p_{\pi(a)}$ has mean $1/V$, its square has mean $S/V$, and a product of two different
entries has mean $(1 - S)/(V(V-1))$. Collecting the terms leaves $(1-S)\frac{V}{V-1}$ times
the variance of $j$ under the uniform distribution, which is $f^{unif}$. $\kappa(s)$ is 1 for a
uniform $p$ and falls to 0 for a point mass: a concentrated distribution pushes the ratio
below 1 on average *whatever the sensitivities are*. (The black crosses in the scatter above
are $\kappa(s)$.) An exercise below checks the formula against all $V! = 120$ arrangements
of state 0.

So the ratio splits into two factors, $f/f^{unif} = \kappa(s)\, \alpha_i(s)$. The **alignment
factor** $\alpha_i(s) = f_i(s) / (\kappa(s) f^{unif}_i(s))$ averages exactly 1 over shuffles: below 1 the mass sits
on tokens the parameter moves alike more than chance would put it there, above 1 on tokens it
moves apart. Summed over the states each parameter visits, $F_i / F^{shuf}_i$ with
$F^{shuf}_i = \sum_s \rho(s)\, \kappa(s)\, f^{unif}_i(s)$ asks the same question for
the parameter's whole sequence Fisher.

## Alignment per parameter, against its shuffles

Below, $F_i/F^{shuf}_i$ for the parameters **below the output layer** (`E`, `W1`, `b1`: the
shared features every token's logit reads) of three models, each against 200 shuffles of its
own $p$:

* **default**: the model as initialised;
* **distinct**: the default with the biases of tokens 1 and 3 raised by 5, so the model puts
  most of its mass on those two tokens;
* **synonyms**: the same, after giving token 3 token 1's output weights (column of `W2`, entry
  of `b2`): every parameter below the output layer now moves the logits of tokens 1 and 3
  identically, and the mass sits on those two tokens: alignment built in.
"""),
    code("""
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}
(nH, V), o2 = layout["W2"]
(_,), ob = layout["b2"]
features = np.arange(task.model.num_params) < o2          # (P,) E, W1, b1
distinct = task.theta.copy()
distinct[ob + 1] += 5.0
distinct[ob + 3] += 5.0
synonyms = task.theta.copy()
W2 = synonyms[o2:o2 + nH * V].reshape(nH, V)              # a view into synonyms
W2[:, 3] = W2[:, 1]
synonyms[ob + 3] = synonyms[ob + 1]
synonyms[ob + 1] += 5.0
synonyms[ob + 3] += 5.0"""),
    code("""
runs = {}
models = [("default", task.theta), ("distinct", distinct), ("synonyms", synonyms)]
for name, th in models:
    t = task.with_(theta=th)
    res = exact(t, progress=False)
    reach_ = res.states["reach"]
    runs[name] = shuffle_control(t, res, np.random.default_rng(0), shuffles=200,
                                 params=np.flatnonzero(features))
    mass13 = res.states["probs"][:, [1, 3]].sum(axis=1)          # (N,)
    runs[name]["mass13"] = reach_ @ mass13 / reach_.sum()
print(f"{'model':>9} {'mass on 1,3':>11} {'% f<f_unif':>11} {'(shuffled)':>14} "
      f"{'median F/F_shuf':>16} {'(shuffled, 0.5-99.5%)':>22}")
inside = {}
for name, run in runs.items():
    sh, med = run["shuffled_share"], np.median(run["ratio"])
    lo, hi = np.quantile(np.median(run["shuffled_ratio"], axis=1), [0.005, 0.995])
    inside[name] = bool(lo <= med <= hi and sh.min() <= run["share"] <= sh.max())
    print(f"{name:>9} {run['mass13']:11.2f} {100 * run['share']:10.1f}% "
          f"{100 * sh.min():6.1f}..{100 * sh.max():4.1f}% {med:16.3f} "
          f"{lo:11.3f} .. {hi:.3f}")
"""),
    code("""
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True, sharey=True)
for ax, (name, run) in zip(axes, runs.items()):
    # (K, n) sorted per shuffle
    curves = np.sort(np.log10(run["shuffled_ratio"]), axis=1)
    rank = np.arange(curves.shape[1])
    ax.fill_between(rank, *np.quantile(curves, [0.005, 0.995], axis=0), color="0.8",
                    label="shuffled p (0.5-99.5%)")
    ax.plot(rank, np.sort(np.log10(run["ratio"])), color="tab:purple",
            label="the model")
    ax.axhline(0.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel("feature parameters, sorted")
    ax.set_title(name)
axes[0].set_ylabel(r"$\\log_{10} F_i / F^{shuf}_i$")
axes[0].legend(fontsize=8)
fig.suptitle("Alignment of each parameter's Fisher against shuffles of the model's "
             "own p")
plt.show()"""),
    md(r"""
Read the printed table and the plot together. The raw share of pairs below the uniform
reference does not separate the three models. Compared with their own shuffles, both
statistics do: for the synonyms model the share lies outside its shuffled range and the
median $F_i/F^{shuf}_i$ lies far below its shuffle band (its features move the two likely
tokens alike by construction), while the default and distinct models lie within theirs.

## Alike or opposite on the likely pair

The question this lesson started from: a parameter moves the likely next tokens by roughly
the same amount. What does the pairwise form predict? Answer, then see it on a state with two
likely candidates and two parameters of the same size: one moves both likely logits by almost
the same amount, the other moves them in opposite directions.
"""),
    *quiz("likely-alike"),
    code("""
from fisher_ref import token_fisher_pairwise
from fisher_ref.teaching.views import pairwise_terms
p = np.array([0.48, 0.48, 0.02, 0.02])                    # two likely candidates
j = np.array([[3.0, 3.1, 0.0, 0.0],         # (2, V): alike on the likely pair
              [3.0, -3.0, 0.0, 0.0]])       #         opposite on the likely pair
f = token_fisher_pairwise(p, j)
# both orders (a, b) and (b, a)
likely_pair = 2 * pairwise_terms(p, j)[:, 0, 1]
shuffled = shuffled_token_fisher(p, j)                    # (2,) kappa f_unif
for name, fi, fs, lp in zip(["alike", "opposite"], f, shuffled, likely_pair):
    print(f"{name:>8}: f = {fi:.4f} (from the likely pair: {lp:.4f})")
    print(f"{'':>10}shuffled-p average = {fs:.4f}, "
          f"alignment factor alpha = {fi / fs:.2f}")"""),
    md(r"""
## What this toy shows, and what it does not

**It shows**, exactly: the token Fisher depends on where $p$ puts its mass, not only on the
sensitivities; confident states carry little Fisher; the ratio to the uniform reference
factors into a concentration part $\kappa(s)$, fixed by $p$ alone, and an alignment part whose
average over shuffles is 1; and when alignment is built into a model (the synonyms), the
alignment statistic finds it against a shuffled-$p$ control, while the plain share below the
uniform reference, taken on its own, does not.

**It does not show** that the randomly initialised default model is aligned: its share of
ratios below 1 is what shuffled probabilities give too, and its per-parameter alignment lies
within its shuffle band. So "the model's mass lands on tokens its parameters move alike" is
not demonstrated here for an untrained model, and nothing in this toy says how much alignment
a trained language model has. The same control answers that question on a real model: it
needs only $p$ and the sensitivities at the sampled states, and compares $f$ with
$\kappa(s) f^{unif}$ or with shuffles of $p$.
"""),
    checks("""
p0 = states["probs"][0]                                   # (V,)
closed = shuffled_token_fisher(p0, J_all[0])              # kappa(s) f_unif
assert np.allclose(closed, concentration(p0) * uniform_token_fisher(J_all[0]),
                   rtol=1e-12)
assert np.allclose(f_beta[0], uniform_token_fisher(J), rtol=1e-12)          # beta = 0
assert f_beta[-1].max() < 1e-3 * f_at_1.max()             # a confident state: f -> 0
# most pairs below the reference
assert below > 0.5
# ... explained by concentration
assert shuffled_share.min() <= below <= shuffled_share.max()
# the table's claims
assert inside == {"default": True, "distinct": True, "synonyms": False}"""),
    *exercise("temperature-concentration"),
    *exercise("permutation-average"),
    *exercise("anti-aligned"),
    footer(STEM, [
        "For fixed sensitivities the token Fisher falls as $p$ concentrates; at a point mass "
        "it is 0.",
        "$f/f^{unif} = \\kappa(s)\\,\\alpha_i(s)$ with $\\kappa(s) = (1-\\sum_a p_a^2)/(1-1/V)$: a "
        "ratio below 1 "
        "is expected from concentration alone.",
        "Alignment is what is left, $\\alpha_i(s)$ or $F_i/F^{shuf}_i$, judged against shuffles "
        "of $p$; the toy shows it when built in (synonyms), not in the untrained default model.",
    ]),
]
