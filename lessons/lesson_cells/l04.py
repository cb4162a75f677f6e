"""Lesson 4: the policy gradient is a covariance, bounded by the Fisher."""
from ._cells import IMPORTS, code, md, quiz

STEM = "04_gradient_is_covariance"

CELLS = [
    md(r"""
# 4. The gradient is a covariance

**Claim.** On-policy, the sequence score has mean zero, $E[h_i] = 0$. So the policy gradient
with advantage $A = R - b$ ($b$ a constant) is a covariance, and the sequence Fisher is a
variance:

$$G_i = E[A\,h_i] = \mathrm{Cov}(A, h_i), \qquad F_i = E[h_i^2] = \mathrm{Var}(h_i).$$

Cauchy–Schwarz then caps every coordinate of the gradient:

$$|G_i| \le \mathrm{std}(A)\,\sqrt{F_i}.$$

So a parameter with small $F_i$ cannot carry a big gradient coordinate, whatever the reward.
The cap is reached only when $A$ and $h_i$ are perfectly correlated; how close each parameter
comes is $|\mathrm{corr}(A, h_i)|$. Everything below is exact (every response enumerated).
"""),
    code(IMPORTS + """
task = load_config("default")
r = exact(task, progress=False)
pol = r.streams["policy"]
P = task.model.num_params

def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(a).max(), np.abs(b).max())

print(f"max |E[h_i]|                      = {np.abs(r.score_mean).max():.1e}")
print(f"E[A h] vs Cov(A, h)               : relative error {rel_err(r.gradient, r.covariance):.1e}")
print(f"E[A h] vs autograd of exact E[R]  : relative error {rel_err(r.gradient, r.gradient_autodiff):.1e}")"""),
    md(r"""
## A constant added to the advantage changes nothing

Adding $c$ to every advantage adds $c\,E[h]$ to the gradient, and $E[h] = 0$.
"""),
    code("""
cs = [-10.0, -1.0, 0.0, 1.0, 10.0, 100.0]
for c in cs:
    G_c = pol.gradient_with_constant(c)
    print(f"c = {c:7.1f}: max |G(c) - G(0)| / max |G(0)| = "
          f"{np.abs(G_c - r.gradient).max() / np.abs(r.gradient).max():.1e}")"""),
    *quiz("constant-baseline"),
    md(r"""
## The bound, parameter by parameter

Each dot is one parameter: its exact $|G_i|$ against the cap $\mathrm{std}(A)\sqrt{F_i}$. No
dot may lie above the diagonal. Parameters with $F_i = 0$ (here: the embedding of EOS, which
never enters a window because generation stops after it) must have $G_i = 0$.
"""),
    code("""
cap = r.bound                                             # (P,) std(A) sqrt(F)
G = np.abs(r.gradient)                                    # (P,)
live = cap > 0
fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
axes[0].loglog(cap[live], G[live] + 1e-300, ".", alpha=0.7, label="parameters")
lo, hi = cap[live].min(), cap[live].max()
axes[0].loglog([lo, hi], [lo, hi], "k-", label=r"$|G_i| = \\mathrm{std}(A)\\sqrt{F_i}$")
axes[0].set_ylim(max(G[live][G[live] > 0].min() / 3, lo / 1e3), hi * 2)
axes[0].set_xlabel(r"$\\mathrm{std}(A)\\,\\sqrt{F_i}$")
axes[0].set_ylabel(r"$|G_i|$")
axes[0].set_title("Every gradient coordinate under its Fisher bound")
axes[0].legend()
axes[1].hist(r.correlation[live], bins=30, color="tab:green", alpha=0.8)
axes[1].set_xlabel(r"$|\\mathrm{corr}(A, h_i)| = |G_i| / (\\mathrm{std}(A)\\sqrt{F_i})$")
axes[1].set_ylabel("parameters")
axes[1].set_title("How much of the bound each parameter uses")
plt.show()
print(f"parameters with F = 0: {np.flatnonzero(~live).tolist()}, their |G|: {G[~live].tolist()}")
print(f"largest |G| / bound: {r.correlation.max():.4f}")"""),
    *quiz("zero-fisher-zero-gradient"),
    md(r"""
## Does high Fisher pick out high gradient?

Take the top $k\%$ of parameters by $|G|$ and ask what share of them is also in the top $k\%$
by $F$. A random choice would give $k\%$.
"""),
    code("""
rows = r.topk_overlap((0.05, 0.1, 0.25, 0.5))
fr = [100 * f for f, _, _, _ in rows]
fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
ax.plot(fr, [100 * o for _, _, o, _ in rows], "o-", label="top-k% by |G| also top-k% by F")
ax.plot(fr, [100 * rnd for _, _, _, rnd in rows], "k--", label="random choice")
ax.set_xlabel("k (% of parameters)")
ax.set_ylabel("overlap (%)")
ax.set_title(f"Fisher as a predictor of where the gradient is ({P} parameters)")
ax.legend()
plt.show()
for f, n, o, rnd in rows:
    print(f"top {100 * f:4.0f}% ({n:3d} params): overlap {o:6.1%}  vs random {rnd:6.1%}")"""),
    md(r"""
## A few exact policy-gradient steps

`fisher_ref.training.policy_gradient` ascends the exact gradient: a few steps of SGD and of
Adam on the tiny model. Which parameters moved, and does that follow the Fisher? And, rounding
parameters to **bf16** as a training run would store them, what share of them changed at all?
(A parameter counts as changed when its bf16-rounded value differs before and after.)
"""),
    code("""
from fisher_ref.training import policy_gradient, bf16_changed

runs = {"SGD, lr 1e-2": policy_gradient(task, steps=3, lr=1e-2, optimizer="sgd"),
        "Adam, lr 1e-3": policy_gradient(task, steps=3, lr=1e-3, optimizer="adam")}
F0 = r.sequence_fisher
fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
for ax, (name, tr) in zip(axes, runs.items()):
    moved = np.abs(tr.thetas[-1] - tr.thetas[0])          # (P,)
    changed = bf16_changed(tr.thetas[0], tr.thetas[-1])   # (P,) bool
    ax.loglog(F0[live], moved[live] + 1e-300, ".", color="0.6", label="unchanged at bf16")
    ax.loglog(F0[live & changed], moved[live & changed], ".", color="tab:red",
              label="changed at bf16")
    ax.set_ylim(max(moved[live].min(), 1e-12) / 3, moved.max() * 3)
    ax.set_xlabel(r"Fisher $F_i$ at the start")
    ax.set_ylabel(r"$|\\theta_{end} - \\theta_{start}|$")
    ax.set_title(f"{name}: {changed.mean():.0%} changed at bf16")
    ax.legend(fontsize=8)
    print(f"{name}: E[R] {tr.expected_rewards[0]:.4f} -> {tr.expected_rewards[-1]:.4f}, "
          f"bf16 changed {changed.mean():.1%} of {P} parameters")
plt.show()"""),
    md(r"""
SGD moves each parameter by $\eta\,G_i$, so the parameters with a small Fisher (hence a small
gradient) barely move and most of them stay the same in bf16. Adam divides by
$\sqrt{\hat v}$: it moves almost every parameter with a non-zero gradient by about the step
size, and whether that shows in bf16 depends on the parameter's own magnitude. The share that
changes depends on the step size as well; the sweep below measures it for one step.
"""),
    code("""
lrs = np.logspace(-5, -1, 9)
share = {opt: [bf16_changed(*policy_gradient(task, steps=1, lr=lr, optimizer=opt).thetas).mean()
               for lr in lrs] for opt in ("sgd", "adam")}
fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
for opt, s in share.items():
    ax.semilogx(lrs, 100 * np.array(s), "o-", label=opt)
ax.axhspan(5, 30, color="gold", alpha=0.3, label="5-30%")
ax.set_xlabel("learning rate")
ax.set_ylabel("% parameters changed at bf16 (one step)")
ax.set_title("Share of parameters a single step changes in bf16")
ax.legend()
plt.show()"""),
]
