"""Lesson 4: the policy gradient is a covariance, bounded by the Fisher; why the top-Fisher and
top-gradient sets overlap (and when not); what a share of parameters changed in bf16 says."""
from ._cells import IMPORTS, checks, code, exercise, footer, header, md, quiz

STEM = "04_gradient_is_covariance"

CELLS = [
    header(STEM, [
        "write the policy gradient as a covariance and the Fisher as a variance, on-policy;",
        "derive the cap $|G_i| \\le \\mathrm{std}(A)\\sqrt{F_i}$ from Cauchy–Schwarz and check it;",
        "explain the top-1% overlap between Fisher and gradient with "
        "$\\log|G_i| = \\log \\mathrm{cap}_i + \\log|\\mathrm{corr}_i|$, and say when it is high "
        "or low;",
        "say what a \"share of parameters changed in bf16\" does and does not tell, for SGD "
        "and for Adam.",
    ], [
        "[Lesson 1](01_sequence_to_tokens.ipynb): the sequence score $h_i$ and $F_i = E[h_i^2]$.",
        "Covariance, variance and correlation.",
    ], r"""
## The claim

A **reward** $R(x, y)$ scores each prompt $x$ and response $y$. In the default task, $R$ counts
how many times token 2 appears in the response. The **advantage** is $A = R - R_0$ with a
constant baseline $R_0$ (here $R_0 = 0$), and the policy gradient is
$G_i = \partial_i E[R] = E[A\,h_i]$ with $h_i$ the sequence score of lesson 1.

**Claim.** On-policy, no parameter can carry a gradient coordinate larger than its Fisher
allows:

$$|G_i| \le \mathrm{std}(A)\,\sqrt{F_i}.$$

## Derivation: a covariance under Cauchy–Schwarz

*Step 1.* On-policy the sequence score has mean zero, $E[h_i] = \sum_t E[\xi_{t,i}] = 0$
(each token score has conditional mean zero, lesson 1). So subtracting means changes nothing:

$$G_i = E[A\,h_i] = E\big[(A - E[A])\,(h_i - E[h_i])\big] = \mathrm{Cov}(A, h_i), \qquad
F_i = E[h_i^2] = \mathrm{Var}(h_i).$$

*Step 2: Cauchy–Schwarz.* For any number $\lambda$,
$0 \le E\big[\big((A - E[A]) - \lambda h_i\big)^2\big] = \mathrm{Var}(A) -
2\lambda\,\mathrm{Cov}(A, h_i) + \lambda^2\,\mathrm{Var}(h_i)$. A quadratic in $\lambda$ that is never negative has a
discriminant $\le 0$: $\mathrm{Cov}(A, h_i)^2 \le \mathrm{Var}(A)\,\mathrm{Var}(h_i)$. Take
square roots and use step 1: $|G_i| \le \mathrm{std}(A)\sqrt{F_i}$.

Call the right-hand side the **cap**, $\mathrm{cap}_i = \mathrm{std}(A)\sqrt{F_i}$. The ratio
$|G_i|/\mathrm{cap}_i = |\mathrm{corr}(A, h_i)| \le 1$ is how much of its cap a parameter
uses; the cap is reached only when $A$ and $h_i$ are perfectly correlated. Everything below
is exact (every response enumerated).
"""),
    code(IMPORTS + """
task = load_config("default")
r = exact(task, progress=False)
pol = r.streams["policy"]
P = task.model.num_params
print(f"reward: {task.spec['reward']}, baseline R_0 = {task.baseline}")
print(f"E[R] = {r.expected_reward:.4f}, std(A) = {r.reward_std:.4f}")

def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(a).max(), np.abs(b).max())

print(f"max |E[h_i]|                     = {np.abs(r.score_mean).max():.1e}")
print(f"E[A h] vs Cov(A, h)              : relative error "
      f"{rel_err(r.gradient, r.covariance):.1e}")
print(f"E[A h] vs autograd of exact E[R] : relative error "
      f"{rel_err(r.gradient, r.gradient_autodiff):.1e}")"""),
    md(r"""
## A constant added to the advantage

Add a constant $c$ to every advantage. Predict what happens to the gradient:
"""),
    *quiz("constant-baseline"),
    code("""
for c in [-10.0, -1.0, 0.0, 1.0, 10.0, 100.0]:
    G_c = pol.gradient_with_constant(c)
    print(f"c = {c:7.1f}: max |G(c) - G(0)| / max |G(0)| = "
          f"{np.abs(G_c - r.gradient).max() / np.abs(r.gradient).max():.1e}")"""),
    md(r"""
The gradient with $A + c$ is $G + c\,E[h]$, and $E[h] = 0$: a covariance does not see
constants.

## The bound, parameter by parameter

Next, each parameter's exact $|G_i|$ against its cap. The default model has parameters with
$F_i = 0$ (the embedding of EOS, which never enters a window because generation stops after
it). Predict their gradient:
"""),
    *quiz("zero-fisher-zero-gradient"),
    code("""
cap = r.bound                                             # (P,) std(A) sqrt(F)
G = np.abs(r.gradient)                                    # (P,)
live = cap > 0
fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
axes[0].loglog(cap[live], G[live] + 1e-300, ".", alpha=0.7, label="parameters")
lo, hi = cap[live].min(), cap[live].max()
axes[0].loglog([lo, hi], [lo, hi], "k-", label=r"$|G_i| = \\mathrm{cap}_i$")
axes[0].set_ylim(max(G[live][G[live] > 0].min() / 3, lo / 1e3), hi * 2)
axes[0].set_xlabel(r"$\\mathrm{cap}_i = \\mathrm{std}(A)\\,\\sqrt{F_i}$")
axes[0].set_ylabel(r"$|G_i|$")
axes[0].set_title("Every gradient coordinate under its Fisher bound")
axes[0].legend()
axes[1].hist(r.correlation[live], bins=30, color="tab:green", alpha=0.8)
axes[1].set_xlabel(r"$|\\mathrm{corr}(A, h_i)| = |G_i| / \\mathrm{cap}_i$")
axes[1].set_ylabel("parameters")
axes[1].set_title("How much of the bound each parameter uses")
plt.show()
print(f"parameters with F = 0: {np.flatnonzero(~live).tolist()}, "
      f"their |G|: {G[~live].tolist()}")
print(f"largest |G| / cap: {r.correlation.max():.4f}")"""),
    md(r"""
## Does high Fisher pick out high gradient?

The bound makes a large Fisher **necessary** for a large gradient coordinate. Is it also
enough to *predict* where the gradient is? Rank the parameters by $F_i$ and by $|G_i|$ and ask
how many of the top $q$ share of one ranking are also in the top $q$ of the other. On the
default model the top 1% of 119 parameters is a single one, so take the medium config
shipped with the package: 1,044 parameters (vocabulary 12, responses up to 4 tokens, reward:
count of token 2, baseline the exact mean reward), small enough that the exact engine still
lists every response.
"""),
    code("""
import os, platform, time
from importlib import resources
from scipy.stats import hypergeom
from fisher_ref import load_task

t0 = time.perf_counter()
medium = load_task(resources.files("fisher_ref") / "configs" / "scale" / "medium.json")
rm = exact(medium, progress=False)
secs = time.perf_counter() - t0
Pm = medium.model.num_params
print(f"medium: V = {medium.model.vocab_size}, responses up to {medium.max_len} "
      f"tokens, baseline {medium.spec['baseline']!r}")
print(f"{Pm} parameters, {rm.n_responses} responses, {rm.n_states} states")
print(f"exact in {secs:.1f} s on this machine ({platform.machine()}, "
      f"{os.cpu_count()} CPU cores)")
print("p: the chance that a random set of as many parameters shares as many")
rows = rm.topk_overlap((0.01, 0.02, 0.05, 0.1, 0.25))
p_values = []
for q, n, o, rnd in rows:
    hits = round(o * n)
    # P(random top-n set shares >= hits)
    p_values.append(hypergeom.sf(hits - 1, Pm, n, n))
    print(f"top {100 * q:3.0f}% ({n:3d} params): {hits:3d} shared = {o:6.1%}, random "
          f"{rnd:5.1%}, p = {p_values[-1]:.1e}")"""),
    md(r"""
Far more than chance, and far from complete. Why both? Take logarithms of
$|G_i| = \mathrm{cap}_i \cdot |\mathrm{corr}_i|$:

$$\log|G_i| = \log \mathrm{cap}_i + \log|\mathrm{corr}_i|,
\qquad \log \mathrm{cap}_i = \log \mathrm{std}(A) + \tfrac12 \log F_i.$$

Ranking by $F$ is ranking by the first term. So the ranking by $|G|$ follows the ranking by
$F$ as far as the spread of $\log \mathrm{cap}$ across the parameters outweighs the spread of
$\log|\mathrm{corr}|$. Both spreads, measured:
"""),
    code("""
live_m = (rm.bound > 0) & (rm.correlation > 0)            # logs defined
log_cap = np.log10(rm.bound[live_m])                      # (n_live,)
log_corr = np.log10(rm.correlation[live_m])               # (n_live,)
sd_cap, sd_corr = log_cap.std(), log_corr.std()
print(f"medium, {live_m.sum()} parameters: sd of log10 cap = {sd_cap:.2f}, "
      f"sd of log10 |corr| = {sd_corr:.2f}")
print(f"the two logs' correlation over the parameters: "
      f"{np.corrcoef(log_cap, log_corr)[0, 1]:.2f}")
fig, axes = plt.subplots(1, 2, figsize=(12, 3.9), constrained_layout=True)
axes[0].hist(log_cap - log_cap.mean(), bins=40, alpha=0.6,
             label=r"$\\log_{10}\\mathrm{cap}$")
axes[0].hist(log_corr - log_corr.mean(), bins=40, alpha=0.6,
             label=r"$\\log_{10}|\\mathrm{corr}|$")
axes[0].set_xlabel("deviation from its mean (decades)")
axes[0].set_ylabel("parameters")
axes[0].set_title(r"The two terms of $\\log_{10}|G_i|$")
axes[0].legend(fontsize=8)
n_top = rows[0][1]                                        # the top 1%: 10 parameters
top_F = np.argsort(-rm.sequence_fisher[live_m])[:n_top]
top_G = np.argsort(-(log_cap + log_corr))[:n_top]
axes[1].plot(log_cap, log_corr, ".", color="0.7", ms=3, label="parameters")
axes[1].plot(log_cap[top_F], log_corr[top_F], "s", mfc="none", ms=8,
             label="top 1% by F")
axes[1].plot(log_cap[top_G], log_corr[top_G], "x", ms=7, label="top 1% by |G|")
axes[1].set_xlabel(r"$\\log_{10}\\mathrm{cap}_i$ (ranks like $F_i$)")
axes[1].set_ylabel(r"$\\log_{10}|\\mathrm{corr}_i|$")
axes[1].set_title("|G| is constant along lines of slope -1")
axes[1].legend(fontsize=8, loc="lower left")
plt.show()"""),
    md(r"""
The correlation term spreads at least as widely as the cap term, so a large cap is needed but
the correlation reshuffles the order among the large caps: on the right, the top 1% by $F$
(squares) sit at the largest caps, and those with a low $|\mathrm{corr}|$ drop out of the
top 1% by $|G|$ (crosses) in favour of slightly smaller caps with a higher correlation. The
top sets overlap well beyond chance, not completely. The overlap would be 100% if every parameter used the same share of
its cap, and falls as the correlations vary more (an exercise below turns that knob).

The extreme case sits in the default model. Its largest gradient coordinate:
"""),
    code("""
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}
(nb2,), off_b2 = layout["b2"]
top_g = int(np.argmax(G))                                 # the largest |G_i|
rank_f = 1 + int(np.sum(r.sequence_fisher > r.sequence_fisher[top_g]))
print(f"largest |G|: parameter {top_g} = b2[{top_g - off_b2}], "
      f"the bias of the rewarded token's logit")
print(f"its rank by Fisher: {rank_f} of {P}; |corr(A, h)| = {r.correlation[top_g]:.3f}")"""),
    md(r"""
The bias of token 2's logit raises the probability of exactly the token the reward counts, so
its score is almost a copy of the advantage: $|\mathrm{corr}|$ is close to 1 and it uses
nearly all of a cap that is only middling. Many parameters have a larger Fisher but move the
logits in ways the reward does not care about, and use a small share of their caps. Fisher
is necessary for gradient, not sufficient: a parameter aligned with the reward can lead the
gradient from the lower half of the Fisher ranking.

## "RL changes only 5–30% of parameters"

That figure (arXiv:2505.11711, for reinforcement-learning fine-tuning of large language
models) comes from counting which parameters of a model stored in **bf16** differ before and
after training. Here: one exact step on the medium model, the parameters rounded to bf16
before and after (`bf16_changed`). One step of each optimizer from fresh state is
$\Delta\theta = \eta\,G$ for SGD and $\Delta\theta = \eta\,G/(|G| + \epsilon)$ for Adam (its
moments start at zero, so the bias-corrected $\hat m = G$ and $\hat v = G^2$). First the
formulas against the training code, then a sweep of the step size $\eta$:
"""),
    code("""
from fisher_ref.teaching.training import policy_gradient, bf16_changed

eps = 1e-8
steps = {"sgd": lambda lr, G: lr * G, "adam": lambda lr, G: lr * G / (np.abs(G) + eps)}
step_err = {}
# the formulas are the training code's
for opt, step in steps.items():
    tr = policy_gradient(task, steps=1, lr=1e-3, optimizer=opt, eps=eps)
    step_err[opt] = rel_err(tr.thetas[1] - tr.thetas[0], step(1e-3, r.gradient))
    print(f"{opt}: first step vs policy_gradient: relative error {step_err[opt]:.1e}")"""),
    code("""
th, Gm, Fm = medium.theta, rm.gradient, rm.sequence_fisher    # (Pm,) each
lrs = {"sgd": np.logspace(-3, 1, 17), "adam": np.logspace(-5, -1, 17)}
share = {opt: np.array([bf16_changed(th, th + steps[opt](lr, Gm)).mean()
                        for lr in lrs[opt]])
         for opt in steps}
fig, ax = plt.subplots(figsize=(6.5, 3.6), constrained_layout=True)
for opt in steps:
    ax.semilogx(lrs[opt], 100 * share[opt], "o-", label=opt)
ax.axhspan(5, 30, color="gold", alpha=0.3, label="5-30%")
ax.set_xlabel(r"step size $\\eta$")
ax.set_ylabel("% parameters changed at bf16")
ax.set_title(f"One exact step on the medium model ({Pm} parameters)")
ax.legend()
plt.show()
for opt in steps:
    print(f"{opt}: from {share[opt].min():.0%} to {share[opt].max():.0%} changed "
          f"over the step sizes plotted")"""),
    md(r"""
The share is whatever the step size makes it: over the step sizes plotted it runs from
nearly none to the largest share printed above for each optimizer (for SGD, well short of
all), crossing the 5–30% band on the way.
bf16 keeps 8 significant bits, so a parameter changes when its step is comparable to
$|\theta_i| / 256$. Next: which parameters change, at a step size that lands in the band.
Predict for Adam first:
"""),
    *quiz("adam-bf16"),
    code("""
predictors = {"largest F": Fm, "largest |G|": np.abs(Gm),
              "largest |G|/|theta|": np.abs(Gm) / np.abs(th),
              "smallest |theta|": -np.abs(th)}
best, moved = {}, {}
print(f"{'optimizer':>9} {'lr':>8} {'float64':>8} {'bf16':>6} "
      f"| share of the bf16-changed set")
print(f"{'':>36} also in the top set by each predictor")
for opt in steps:
    # the step closest to 15% changed
    k = int(np.argmin(np.abs(share[opt] - 0.15)))
    new = th + steps[opt](lrs[opt][k], Gm)                 # (Pm,)
    changed = bf16_changed(th, new)                       # (Pm,) bool
    n, got = int(changed.sum()), set(np.flatnonzero(changed).tolist())
    hit = {name: len(got & set(np.argsort(-s, kind="stable")[:n].tolist())) / n
           for name, s in predictors.items()}
    best[opt], moved[opt] = max(hit, key=hit.get), np.mean(new != th)
    print(f"{opt:>9} {lrs[opt][k]:8.1e} {moved[opt]:8.1%} {changed.mean():6.1%} |")
    for name, h in hit.items():
        print(f"{'':>36} {name:>20}: {h:4.0%}")"""),
    md(r"""
Small is not sparse: the float64 column shows that nearly every parameter moved; the bf16
count only says how many moves are large *relative to the parameter's own size*. Read the
predictor shares against the bf16 column, which is what a random set would score.

* **SGD** moves parameter $i$ by $\eta G_i$, so it changes at bf16 roughly when
  $|G_i|/|\theta_i|$ is large: that predictor matches best. Through the bound, a large $|G_i|$
  needs a large $F_i$, so the top-Fisher set also does better than random, but the parameter's
  own magnitude decides much of it.
* **Adam** moves every parameter with $G_i \ne 0$ by about $\eta$, whatever $|G_i|$ is. Which
  ones show in bf16 is decided by $|\theta_i|$ (and by where $\theta_i$ happens to sit between
  two bf16 values): the smallest-$|\theta|$ set matches best. The Fisher, and the gradient's
  size, hardly do better than random.

So what does the toy support? The Fisher bound limits *how large* each gradient coordinate can
be, and under plain gradient steps that carries over to which parameters move most. It does
**not** explain a 5–30% share: that number depends on the step size, the optimizer's
normalisation and the parameters' magnitudes, and with Adam the changed set follows the
parameters' magnitudes rather than their Fisher.
"""),
    checks("""
assert np.abs(r.score_mean).max() <= 1e-12
assert rel_err(r.gradient, r.covariance) <= 1e-10
assert rel_err(r.gradient, r.gradient_autodiff) <= 1e-8
assert all(np.abs(pol.gradient_with_constant(c) - r.gradient).max()
           <= 1e-10 * np.abs(r.gradient).max() for c in (-10.0, 10.0, 100.0))
assert np.all(G <= cap * (1 + 1e-10) + 1e-12 * G.max()) and np.all(G[~live] == 0)
assert max(p_values) < 1e-6 and rows[0][2] > 10 * rows[0][3]     # far more than chance
assert rows[0][2] < 1 and sd_corr >= sd_cap                        # ... not complete
only_F, only_G = list(set(top_F) - set(top_G)), list(set(top_G) - set(top_F))
# swapped for a higher corr
assert log_corr[only_G].min() > log_corr[only_F].max()
# ... at a smaller cap
assert log_cap[only_G].max() < log_cap[only_F].min()
assert top_g - off_b2 == 2 and rank_f > P // 2 and r.correlation[top_g] > 0.95   # b2[2]
assert max(step_err.values()) <= 1e-9
assert min(share["sgd"].min(), share["adam"].min()) == 0 and share["adam"].max() > 0.9
# crosses the band
assert all(s.min() < 0.05 and s.max() > 0.3 for s in share.values())
# SGD: well short of all
assert share["sgd"].max() < 0.9
assert best == {"sgd": "largest |G|/|theta|", "adam": "smallest |theta|"}
assert min(moved.values()) > 0.9                                   # small is not sparse"""),
    *exercise("bound-by-hand"),
    *exercise("overlap-spread"),
    *exercise("adam-second-step"),
    footer(STEM, [
        "On-policy, $G_i = \\mathrm{Cov}(A, h_i)$ and $F_i = \\mathrm{Var}(h_i)$, so "
        "Cauchy–Schwarz gives $|G_i| \\le \\mathrm{std}(A)\\sqrt{F_i}$: no Fisher, no gradient.",
        "$\\log|G_i| = \\log\\mathrm{cap}_i + \\log|\\mathrm{corr}_i|$: the top sets by Fisher "
        "and by gradient overlap as far as the spread of the cap outweighs the spread of the "
        "correlation. On the medium model they share far more than chance, not all; on the "
        "default model the largest gradient (the rewarded token's bias) sits in the lower half "
        "of the Fisher ranking with $|\\mathrm{corr}|$ near 1.",
        "The share of parameters changed in bf16 is set by step size and parameter magnitudes; "
        "under Adam it follows $|\\theta_i|$, not the Fisher. Small is not sparse.",
    ]),
]
