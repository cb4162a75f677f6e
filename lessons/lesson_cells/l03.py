"""Lesson 3: the same sensitivities give a Fisher that depends on where p puts its mass."""
from ._cells import IMPORTS, code, md, quiz

STEM = "03_where_mass_lands"

CELLS = [
    md(r"""
# 3. Where the probability mass lands

**Claim.** The token Fisher is not a property of the sensitivities alone. Keep a state's
sensitivities $j_{i,a}$ fixed and change only the next-token distribution $p$: the Fisher moves,
because the pairwise form weighs each gap $(j_{i,a}-j_{i,b})^2$ by $p_ap_b$. Two things follow:

* a **confident** state (one token near probability 1) has a small token Fisher for *every*
  parameter;
* comparing with the **uniform reference** $f^{unif}_i(s)$ — the same sensitivities under
  $p = 1/V$ — asks whether the model's mass sits on tokens a parameter moves *alike*
  (ratio $f/f^{unif} < 1$) or on tokens it pulls apart (ratio $> 1$).
"""),
    code(IMPORTS + """
from fisher_ref import token_fisher, uniform_token_fisher
from fisher_ref.alignment import fisher_ratio, entropy
from fisher_ref.enumeration import state_windows
from fisher_ref.model import softmax
from fisher_ref.sensitivities import sensitivities

task = load_config("default")
result = exact(task, progress=False)
states = result.states
print(f"{len(states['reach'])} states, {task.model.num_params} parameters, "
      f"vocabulary {task.model.vocab_size}")"""),
    md(r"""
## One state, many distributions

Take the first prompt's state and its logits $z$. Sharpen or flatten the distribution with an
inverse temperature $\beta$: $p_\beta = \mathrm{softmax}(\beta z)$, keeping the sensitivities
$j$ as they are. At $\beta = 0$ the distribution is uniform and $f = f^{unif}$; as $\beta$ grows
the model becomes certain and $f \to 0$.
"""),
    code("""
s = 0                                                    # first state: prompt 0, nothing generated
toks = states["tokens"][s:s + 1]                          # (1, L)
W = state_windows(toks, (toks >= 0).sum(axis=1), task.model.context, task.model.bos)
z = task.model.logits(task.theta, W)[0]                   # (V,)
J = sensitivities(task.model, task.theta, W)[0]           # (P, V)
betas = np.linspace(0.0, 12.0, 61)
f_beta = np.array([token_fisher(softmax((b * z)[None])[0], J) for b in betas])  # (B, P)
top = np.argsort(-uniform_token_fisher(J))[:4]            # four parameters with large f_unif

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
print("beta = 0 equals the uniform reference:", np.allclose(f_beta[0], uniform_token_fisher(J), rtol=1e-12))
print(f"largest f at beta = 12: {f_beta[-1].max():.2e}  (at beta = 1: {f_beta[np.searchsorted(betas, 1.0)].max():.2e})")"""),
    *quiz("confident-state"),
    md(r"""
## The ratio $f/f^{unif}$ over every state and parameter

`exact` stores, for every state, both $f_i(s)$ under the model and the uniform reference
$f^{unif}_i(s)$. `fisher_ratio` divides them (NaN where a parameter does not move any logit at
that state, e.g. the embedding of a token not in the window). A histogram of $\log_{10}$ of the
ratio, each state weighted by how often it is reached, shows where the model's mass lands
relative to what each parameter distinguishes.
"""),
    code("""
ratio = fisher_ratio(result)                              # (N, P), NaN where f_unif = 0
reach = np.broadcast_to(states["reach"][:, None], ratio.shape)
ok = np.isfinite(ratio) & (ratio > 0)
fig, ax = plt.subplots(figsize=(7, 3.6), constrained_layout=True)
ax.hist(np.log10(ratio[ok]), bins=50, weights=reach[ok], color="tab:purple", alpha=0.8)
ax.axvline(0.0, color="k", ls="--", label="ratio 1: no better or worse than uniform")
ax.set_xlabel(r"$\\log_{10}\\, f_i(s) / f^{unif}_i(s)$")
ax.set_ylabel("reach-weighted count")
ax.set_title("Model probabilities against the uniform reference, all (state, parameter) pairs")
ax.legend()
plt.show()
below = (reach[ok] * (ratio[ok] < 1)).sum() / reach[ok].sum()
print(f"reach-weighted share of (state, parameter) pairs with f < f_unif: {below:.1%}")"""),
    md(r"""
The ratio is a diagnostic, not a law. On this small model most of the reach-weighted pairs
sit below 1 (the share is printed above) and some sit above: nothing forces every parameter to
be aligned; the histogram is what this model happens to do.

## Confident states against uncertain ones

Each state's entropy says how spread out $p$ is. Against it, the median ratio over parameters
at that state:
"""),
    code("""
H = entropy(states["probs"])                              # (N,)
med = np.nanmedian(np.where(ok, ratio, np.nan), axis=1)   # (N,)
total_f = states["token_fisher"].sum(axis=1)              # (N,)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
axes[0].scatter(H, med, c=states["depth"], cmap="viridis", alpha=0.7)
axes[0].axhline(1.0, color="k", ls="--")
axes[0].axvline(np.log(task.model.vocab_size), color="gray", ls=":", label="uniform entropy log V")
axes[0].set_xlabel("entropy of p(.|s) (nats)")
axes[0].set_ylabel(r"median over parameters of $f/f^{unif}$")
axes[0].set_title("Uncertain states look like the uniform reference")
axes[0].legend()
sc = axes[1].scatter(H, total_f, c=states["depth"], cmap="viridis", alpha=0.7)
axes[1].set_xlabel("entropy of p(.|s) (nats)")
axes[1].set_ylabel(r"$\\sum_i f_i(s)$")
axes[1].set_title("Confident states carry little token Fisher")
fig.colorbar(sc, ax=axes, label="depth (tokens generated)")
plt.show()"""),
    md(r"""
## The seeds' question

Build a state with two likely candidates and two parameters of the same size: one moves both
likely logits by almost the same amount, the other moves them in opposite directions.
"""),
    code("""
from fisher_ref import token_fisher_pairwise
from fisher_ref.alignment import pairwise_terms
p = np.array([0.48, 0.48, 0.02, 0.02])                    # two likely candidates
j = np.array([[3.0, 3.1, 0.0, 0.0],                       # (2, V): alike on the likely pair
              [3.0, -3.0, 0.0, 0.0]])                     #         opposite on the likely pair
f = token_fisher_pairwise(p, j)
likely_pair = 2 * pairwise_terms(p, j)[:, 0, 1]           # both orders (a, b) and (b, a)
for name, fi, fu, lp in zip(["alike", "opposite"], f, uniform_token_fisher(j), likely_pair):
    print(f"{name:>8}: f = {fi:.4f}  (from the likely pair: {lp:.4f}),  f_unif = {fu:.4f}")"""),
    *quiz("likely-alike"),
    *quiz("ratio-below-one"),
]
