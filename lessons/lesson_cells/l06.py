"""Lesson 6: Monte Carlo estimators, their standard errors, and the token-sum estimator."""
from ._cells import IMPORTS, checks, code, exercise, footer, header, md, quiz

STEM = "06_monte_carlo"

CELLS = [
    header(STEM, [
        "estimate the sequence Fisher from sampled responses, with a standard error and a "
        "z-score $\\zeta$ against the exact value, and check that the z-scores of all "
        "parameters look like standard normal draws;",
        "compare two unbiased estimators, $\\overline{h_i^2}$ and $\\overline{\\sum_t f_i(s_t)}$, "
        "by their exact variances;",
        "check whether nominal 95% intervals cover the exact value 95% of the time.",
    ], [
        "[Lesson 1](01_sequence_to_tokens.ipynb): $F_i = E[h_i^2] = E[\\sum_t f_i(s_t)]$.",
        "The standard error $\\sigma/\\sqrt n$ of a mean; the normal distribution.",
    ], r"""
## The claim

**Claim.** Every quantity of lessons 1–5 is an average over responses, so sampling $n$
responses gives an estimate with a standard error $\mathrm{se} = \sigma/\sqrt n$ ($\sigma$ the
standard deviation of the per-response value). With the exact value known, the z-score
$\zeta = (\text{estimate} - \text{exact})/\mathrm{se}$ should look like a draw from the
standard normal distribution.

Two estimators of the same $F_i$:

* $\overline{h_i^2}$ — the squared sequence score of each response;
* $\overline{\sum_t f_i(s_t)}$ — the token Fisher summed along each response's states.

Both have mean $F_i$ on-policy (lesson 1). Which has the smaller variance, and why? Predict:
"""),
    code(IMPORTS),
    *quiz("rao-blackwell"),
    md(r"""
The token sum replaces each sampled token's $\xi_{t,i}^2$ by its average over the next token,
$f_i(s_t) = E[\xi_{t,i}^2 \mid s_t]$ (a Rao–Blackwell step), and it carries no cross terms,
which are pure noise with mean zero. Its variance is usually smaller, though no theorem
promises that here (the sum over positions is not a conditional expectation of $h_i^2$): below
we measure the ratio per parameter.
"""),
    code("""
import os, platform
from fisher_ref.monte_carlo import (estimate, bonferroni_z, running_estimates,
                                    exact_variance_reduction, variance_reduction)

task = load_config("default")
r = exact(task, progress=False)
P = task.model.num_params
mc = estimate(task, 4000, np.random.default_rng(0), keep_samples=True)
zs = mc.z_scores(r)                                       # {(stream, quantity): (P,)}
z_max = bonferroni_z(1e-6, P)
print(f"n = {mc.n} responses, sampled in {mc.seconds:.2f} s on this machine "
      f"({platform.machine()}, {os.cpu_count()} CPU cores)")
print(f"threshold |zeta| <= {z_max:.2f} (false-failure rate 1e-6 over {P} parameters)")
for (stream, quantity), z in zs.items():
    print(f"{stream:>7} {quantity:>16}: max |zeta| = {np.nanmax(np.abs(z)):.2f}")"""),
    md(r"""
The largest $|\zeta|$ says no estimate is far off. Whether the z-scores *as a whole* look like
standard normal draws needs all of them: pooled over parameters and quantities, their
histogram against the normal density, and their sorted values against the normal quantiles
(a QQ plot: normal draws lie on the diagonal). The z-scores of one run are not independent
(one set of responses feeds them all), so expect a wobbly line, not a perfect one.
"""),
    code("""
from scipy.stats import norm

zeta = np.concatenate([z[np.isfinite(z)] for z in zs.values()])          # every z-score
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
grid = np.linspace(-4, 4, 200)
axes[0].hist(zeta, bins=40, range=(-4, 4), density=True, color="tab:blue", alpha=0.7,
             label=f"{zeta.size} z-scores")
axes[0].plot(grid, norm.pdf(grid), "k-", label="standard normal")
axes[0].set_xlabel(r"$\\zeta$ = (estimate $-$ exact) / se")
axes[0].set_ylabel("density")
axes[0].legend(fontsize=8)
# normal quantiles
expected = norm.ppf((np.arange(zeta.size) + 0.5) / zeta.size)
axes[1].plot(expected, np.sort(zeta), ".", ms=3, label="z-scores")
axes[1].plot([-4, 4], [-4, 4], "k-", lw=0.8, label="normal draws")
axes[1].set_xlabel("standard normal quantile")
axes[1].set_ylabel(r"sorted $\\zeta$")
axes[1].set_title("QQ plot")
axes[1].legend(fontsize=8)
plt.show()
print(f"mean {zeta.mean():+.2f}, sd {zeta.std():.2f}; share with |zeta| > 1.96: "
      f"{np.mean(np.abs(zeta) > 1.96):.1%} (normal: 5%)")"""),
    md(r"""
Centred on zero, near the diagonal in the middle, with tails a little lighter than a normal
distribution's (the printed sd and the share beyond ±1.96): roughly standard normal, as
correlated z-scores from one set of responses can be, and none near the threshold. The
standard errors are not too small on this run; whether they are right *on average* is the
coverage question below.
"""),
    md(r"""
## Convergence of the two estimators

The same sampled responses, two running estimates of one parameter's $F_i$, each with its
±2 se band, and the exact value:
"""),
    code("""
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}
(nb2,), off = layout["b2"]
i = off + int(np.argmax(r.sequence_fisher[off:off + nb2]))
F = r.sequence_fisher[i]
fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
for key, label, color in [("h2", r"$\\overline{h_i^2}$", "tab:blue"),
                          ("token_sum", r"$\\overline{\\sum_t f_i(s_t)}$", "tab:red")]:
    run = running_estimates(mc.samples["policy"][key][:, i], exact=F)
    n = run["n"]
    ax.plot(n, run["mean"], color=color, label=label)
    lo, hi = run["mean"] - 2 * run["se"], run["mean"] + 2 * run["se"]
    ax.fill_between(n[1:], lo[1:], hi[1:], color=color, alpha=0.2)
ax.axhline(F, color="k", ls="--", label=f"exact $F_{{{i}}}$ = {F:.4f}")
ax.set_xscale("log")
ax.set_xlabel("number of sampled responses")
ax.set_ylabel(rf"estimate of $F_{{{i}}}$")
ax.set_title("Two unbiased estimators of the sequence Fisher (bands: ± 2 se)")
ax.legend()
plt.show()"""),
    md(r"""
## How much variance the token sum saves

Exactly, per parameter: $\mathrm{Var}(h_i^2) / \mathrm{Var}(\sum_t f_i(s_t))$ — the factor by
which the token-sum estimator needs fewer samples for the same standard error — against the
same ratio measured from the 4000 samples.
"""),
    code("""
exact_ratio = exact_variance_reduction(r)                 # (P,)
mc_ratio = variance_reduction(mc)                         # (P,)
ok = (np.isfinite(exact_ratio) & np.isfinite(mc_ratio)
      & (exact_ratio > 0) & (mc_ratio > 0))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
axes[0].hist(np.log10(exact_ratio[ok]), bins=30, color="tab:red", alpha=0.8)
axes[0].axvline(0.0, color="k", ls="--", label="no saving")
axes[0].set_xlabel(r"$\\log_{10}$ Var($h^2$) / Var($\\sum_t f$)  (exact)")
axes[0].set_ylabel("parameters")
axes[0].set_title("Variance saved by the token-sum estimator")
axes[0].legend()
axes[1].loglog(exact_ratio[ok], mc_ratio[ok], ".", alpha=0.7, label="parameters")
lim = [exact_ratio[ok].min(), exact_ratio[ok].max()]
axes[1].loglog(lim, lim, "k-", label="measured = exact")
axes[1].set_xlabel("exact variance ratio")
axes[1].set_ylabel("measured variance ratio (n = 4000)")
axes[1].set_title("Measured against exact")
axes[1].legend()
plt.show()
print(f"median saving: {np.median(exact_ratio[ok]):.1f}x fewer samples; "
      f"smallest: {exact_ratio[ok].min():.2f}x")"""),
    md(r"""
## Are the standard errors right?

If the se is right, the interval estimate ± 1.96 se contains the exact value 95% of the time.
Repeat a run many times with fresh seeds and count, over all parameters and runs, how often it
does — for both estimators, at two sample sizes.
"""),
    code("""
runs = 50
rate = {}
for n_small in (200, 2000):
    cover = {"sequence_fisher": [], "token_fisher_sum": []}
    for seed in range(runs):
        m = estimate(task, n_small, np.random.default_rng(1000 + seed))
        for q in cover:
            e = m.streams["policy"][q]
            live = e.se > 0
            err = np.abs(e.mean - getattr(r, q))[live]
            cover[q].append(err <= 1.959963984540054 * e.se[live])
    for q, c in cover.items():
        c = np.concatenate(c)
        rate[n_small, q] = c.mean()
        print(f"n = {n_small:>5}, {q:>16}: {c.mean():.1%} of {c.size} intervals cover "
              f"the exact value")
"""),
    md(r"""
With few samples the intervals for $h^2$ cover less often than 95%. The se is itself estimated
from the samples, and $h^2$ has a long right tail (rare responses with large scores): a small
sample tends to miss the tail and underestimate both the mean and its se. The skewness of the
4000 samples of each estimator (0 for a symmetric distribution) shows the tails:
"""),
    code("""
from scipy.stats import skew

live_F = r.sequence_fisher > 0
skew_h2 = skew(mc.samples["policy"]["h2"][:, live_F], axis=0)            # (P_live,)
skew_ts = skew(mc.samples["policy"]["token_sum"][:, live_F], axis=0)     # (P_live,)
print(f"median skewness over parameters: h^2 {np.median(skew_h2):.1f}, "
      f"token sum {np.median(skew_ts):.1f}")
print(f"h^2 more skewed for {np.mean(skew_h2 > skew_ts):.0%} of the parameters")"""),
    md(r"""
The token sum has the shorter tail and covers better, and the $h^2$ intervals come closer to
nominal as $n$ grows.

The se falls like $1/\sqrt n$. Predict how much a hundredfold sample narrows it, then read
the exact values:
"""),
    *quiz("se-scaling"),
    code("""
var_h2 = r.streams["policy"].variances["h2"][i]
for n in (100, 10_000, 1_000_000):
    print(f"n = {n:>9,}: se of mean h^2 for parameter {i} = {np.sqrt(var_h2 / n):.2e}")"""),
    checks("""
# no estimate far off
assert all(np.nanmax(np.abs(z)) <= z_max for z in zs.values())
# roughly standard normal
assert abs(zeta.mean()) < 0.5 and 0.6 < zeta.std() < 1.5
# the token sum saves
assert np.all(exact_ratio[ok] > 1) and np.median(exact_ratio[ok]) > 1
h2_small = rate[200, "sequence_fisher"]                   # coverage, as the text says
assert h2_small < 0.95 and h2_small < rate[200, "token_fisher_sum"]
assert h2_small < rate[2000, "sequence_fisher"]
assert np.median(skew_h2) > 2 * np.median(skew_ts) > 0
assert np.mean(skew_h2 > skew_ts) > 0.9"""),
    *exercise("se-by-hand"),
    *exercise("samples-needed"),
    footer(STEM, [
        "Every exact quantity is an average over responses; sampling estimates it with a "
        "standard error $\\sigma/\\sqrt n$; the z-scores against the exact values stay far "
        "inside the threshold and, pooled, look roughly standard normal (histogram and QQ "
        "plot), a little narrower in the tails.",
        "The token-sum estimator has the same mean as $\\overline{h_i^2}$ and, on these "
        "models, a smaller variance (measured per parameter, not promised by a theorem).",
        "Standard errors estimated from few samples of a long-tailed quantity can be too "
        "small: check coverage.",
    ]),
]
