"""Lesson 5: off-policy samples need the score centered under the sampler; what centering buys
(invariance to a constant in the advantage, a valid bound) and what it does not (a better
direction)."""
from ._cells import IMPORTS, checks, code, exercise, footer, header, md, quiz

STEM = "05_offpolicy_centering"

CELLS = [
    header(STEM, [
        "explain why the policy-centered score has a non-zero mean when responses come from "
        "another sampler $\\mu$, and what that breaks;",
        "center the score under $\\mu$ and check that the covariance structure and the bound "
        "come back;",
        "compare the directions of the policy-centered and the $\\mu$-centered gradient with "
        "the policy "
        "gradient as a constant $c$ is added to the advantage, and say what centering buys "
        "and what it does not;",
        "measure the bias left when only the top-$m$ tokens of $\\mu$ are known.",
    ], [
        "[Lesson 4](04_gradient_is_covariance.ipynb): the gradient as a covariance and its bound.",
        "[Lesson 1](01_sequence_to_tokens.ipynb): why $E[\\xi_t \\mid s_t] = 0$ on-policy.",
    ], r"""
## The claim

**Claim.** Lessons 1–4 leaned on one fact: under the distribution the responses come from, the
score has conditional mean zero. When responses come from a different sampler $\mu$ — a stale
copy of the model, a higher temperature, an inference engine — the score as lessons 1–4
form it, centered at the policy's mean sensitivity, $\xi_t = j_{y_t} - \bar j_p$, has mean
$\sum_a \mu_a j_a - \bar j_p = \bar j_\mu - \bar j_p \ne 0$ under $\mu$ (step 1 of
lesson 1 fails). Call it the **policy-centered** score. This lesson measures what its
non-zero mean breaks, and repairs it by centering the score under $\mu$ instead. Load two
off-policy configurations, then predict what that repair needs.
"""),
    code(IMPORTS + """
import textwrap

LABEL = {"raw": "policy-centered", "centered": "mu-centered"}   # the streams, in words

configs = ["offpolicy_temperature", "offpolicy_stale"]
results = {}
for name in configs:
    task = load_config(name)
    V = task.model.vocab_size
    results[name] = exact(task, topk=tuple(range(1, V + 1)), progress=False)
    print(f"{name}: V = {V}, baseline R_0 = {task.baseline}, "
          f"{results[name].n_responses} responses")
    print(textwrap.fill(f"sampler {task.sampler}", 86, initial_indent="  ",
                        subsequent_indent="    "))"""),
    *quiz("centering-needs-mu"),
    md(r"""
The repair: center under $\mu$, $\tilde\xi_t = j_{y_t} - \bar j_\mu$ with
$\bar j_\mu = \sum_a \mu_a j_a$, a sum over **every** token. Its mean under $\mu$ is zero
by construction, so every step of lessons 1 and 4 goes through again, with expectations
under $\mu$.

`exact` runs the streams side by side: `"raw"`, the policy-centered score (drawn from $\mu$,
centered at $\bar j_p$; the stream keeps its short name), `"centered"`, the $\mu$-centered
score (drawn from $\mu$, centered at $\bar j_\mu$), and `"top{m}"` (centered using only the
$m$ most likely tokens of $\mu$).

## The policy-centered score's mean under $\mu$ is not zero

For every parameter, $|E_\mu[h_i]|$ for the policy-centered and the $\mu$-centered score,
and how far each stream's Fisher $E_\mu[h^2]$ is from its token sum. Off-policy the token sum uses each
stream's second moment of the token score under $\mu$,

$$f^{pol}_i(s) = \sum_a \mu_a\,\big(j_{i,a} - \bar j_{p,i}\big)^2, \qquad
f^{cen}_i(s) = \sum_a \mu_a\,\big(j_{i,a} - \bar j_{\mu,i}\big)^2 .$$

$f^{cen}$ is the token Fisher formula with $\mu$ in place of $p$ (a variance under $\mu$);
$f^{pol} = f^{cen} + (\bar j_\mu - \bar j_p)^2$ (policy-centered) adds the squared bias.
$E_\mu[h^2] = E_\mu[\sum_t f(s_t)]$ holds only when the cross terms vanish.
"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for ax, name in zip(axes, configs):
    st = results[name].streams
    for stream, color in [("raw", "tab:red"), ("centered", "tab:blue")]:
        mean_h = np.sort(np.abs(st[stream].score_mean))[::-1]
        ax.semilogy(np.maximum(mean_h, 1e-18), color=color, label=LABEL[stream])
    ax.axhline(1e-12, color="k", ls=":", label="rounding level")
    ax.set_xlabel("parameters, sorted")
    ax.set_ylabel(r"$|E_\\mu[h_i]|$")
    ax.set_title(name)
    ax.legend()
fig.suptitle("Mean of the score under the sampler")
plt.show()
gaps = {}
for name in configs:
    for stream in ("raw", "centered"):
        s = results[name].streams[stream]
        gaps[name, stream] = (np.abs(s.sequence_fisher - s.token_fisher_sum).max()
                              / s.sequence_fisher.max())
        mean_h = np.abs(s.score_mean).max()
        print(f"{name:>21} {LABEL[stream]:>15}: max|E h| {mean_h:.1e}, "
              f"|F - sum f|/max F {gaps[name, stream]:.1e}")"""),
    md(r"""
## Add a constant to the advantage

Off-policy, add a constant $c$ to every advantage of the policy-centered stream. Predict
first:
"""),
    *quiz("uncentered-constant"),
    md(r"""
The plot counts the parameters whose gradient breaks its cap
$\mathrm{std}(A)\sqrt{E_\mu[h^2]}$, for $c$ from 0 upwards. Beside it, the uncentered form
of Cauchy–Schwarz, $|E_\mu[A h_i]| \le \sqrt{E_\mu[A^2]\,E_\mu[h_i^2]}$, which holds for
any two random variables:
"""),
    code("""
cs = np.concatenate([[0.0], np.logspace(-2, 2, 17)])
broken = {}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for ax, name in zip(axes, configs):
    for stream, color in [("raw", "tab:red"), ("centered", "tab:blue")]:
        s = results[name].streams[stream]
        over = [np.abs(s.gradient_with_constant(c)) > s.bound * (1 + 1e-9) for c in cs]
        broken[name, stream] = np.mean(over, axis=1)
        ax.plot(cs, 100 * broken[name, stream], "o-", color=color, label=LABEL[stream])
    ax.set_xscale("symlog", linthresh=1e-2)      # linear near 0: c = 0 on the axis
    ax.set_xlim(0, cs[-1] * 1.5)
    ax.set_ylim(-3, 103)
    ax.set_xlabel("constant c added to every advantage (0, then log scale)")
    ax.set_ylabel("% parameters with |G| > bound")
    ax.set_title(name)
    ax.legend()
plt.show()
uncentered = {}                                    # sqrt(E[(A+c)^2] E[h^2]) broken?
for name in configs:
    s = results[name].streams["raw"]
    mean_A = s.expected_reward - s.baseline               # E_mu[A]
    cap2 = [(s.reward_std ** 2 + (mean_A + c) ** 2) * s.sequence_fisher for c in cs]
    over = [np.abs(s.gradient_with_constant(c)) > (1 + 1e-12) * np.sqrt(u)
            for c, u in zip(cs, cap2)]
    uncentered[name] = np.mean(over, axis=1)
    print(f"{name}: std(A) sqrt(E[h^2]) broken at c = 0 by")
    print(f"{'':>6}{broken[name, 'raw'][0]:.1%} (policy-centered), "
          f"{broken[name, 'centered'][0]:.1%} (mu-centered);")
    print(f"{'':>6}sqrt(E[A^2] E[h^2]) broken at any c plotted by "
          f"{uncentered[name].max():.1%} (policy-centered)")"""),
    md(r"""
So "the bound fails" needs a qualifier: only the form with $\mathrm{std}(A)$ fails. The
uncentered form $\sqrt{E_\mu[A^2]E_\mu[h_i^2]}$ is Cauchy–Schwarz for the product
$E_\mu[A h_i]$ itself and never fails; the step from it to $\mathrm{std}(A)$ replaces
$E_\mu[A h_i]$ by a covariance, which needs $E_\mu[h_i] = 0$. The gradient with $A + c$ is
$G + c\,E_\mu[h]$. $\mu$-centered, $E_\mu[\tilde h] = 0$ and it is $G$ for every $c$;
policy-centered, it drifts linearly in $c$ while $\mathrm{std}(A)$ does not move (the
uncentered cap grows with $|E_\mu[A] + c|$, and keeps up). Where the
policy-centered gradient breaks its cap already at $c = 0$, the advantage itself carries such a constant:
$A = (A - E_\mu[A]) + E_\mu[A]$, and its mean $E_\mu[A]$ (which includes the baseline $R_0$)
acts like $c$.

## What centering buys, and what it does not

An update also cares about direction, not only about a bound. Compare each gradient's direction with the
policy gradient $\nabla_\theta E_p[R]$ (`r.gradient`) by their cosine, as the constant $c$
varies, on both samplers:
"""),
    code("""
def cosine(a, b):
    return a @ b / (np.linalg.norm(a) * np.linalg.norm(b))

c_grid = np.linspace(-10, 10, 201)                        # includes c = 0
cos = {}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True, sharey=True)
for ax, name in zip(axes, configs):
    r = results[name]
    for stream, color in [("raw", "tab:red"), ("centered", "tab:blue")]:
        s = r.streams[stream]
        cos[name, stream] = np.array([cosine(s.gradient_with_constant(c), r.gradient)
                                      for c in c_grid])
        ax.plot(c_grid, cos[name, stream], color=color, label=LABEL[stream])
    ax.axvline(0.0, color="k", lw=0.8, ls=":", label="c = 0 (the task's own advantage)")
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_xlabel("constant c added to every advantage")
    ax.set_title(name)
axes[0].set_ylabel("cosine with the policy gradient")
axes[0].legend(fontsize=8)
plt.show()
at0 = int(np.flatnonzero(c_grid == 0)[0])
for name in configs:
    raw_cos, cen_cos = cos[name, "raw"], cos[name, "centered"]
    print(f"{name}: policy-centered {raw_cos[at0]:.3f} at c = 0,")
    print(f"{'':>6}from {raw_cos.min():.3f} to {raw_cos.max():.3f} over c in "
          f"[-10, 10];")
    print(f"{'':>6}mu-centered {cen_cos[at0]:.3f} for every c")"""),
    md(r"""
Read the two panels together.

* **Policy-centered, the direction depends on an arbitrary constant.** Shifting every
  advantage by the same $c$ should not matter to a learning signal, yet the policy-centered
  gradient's cosine with the policy gradient swings widely with $c$, down to negative
  values: it can point away from the policy gradient.
* **$\mu$-centered, it does not.** The blue line is flat: centering makes the gradient a covariance
  under $\mu$, blind to $c$, and restores the bound $|G_i| \le \mathrm{std}(A)\sqrt{F_i}$
  under $\mu$ coordinate by coordinate.
* **Centering does not buy a better direction.** The centered gradient is
  $\mathrm{Cov}_\mu(A, \tilde h)$, weighted by the sampler, not the policy gradient. Its
  cosine is high but below 1, and on `offpolicy_stale`, with the task's own baseline
  ($c = 0$), the policy-centered gradient is *closer* to the policy gradient than the
  $\mu$-centered one (printed above).

So centering buys invariance to the constant in the advantage and a valid bound; it does not
promise the direction of the policy gradient. The route that does recover the policy gradient
from $\mu$'s samples is importance weighting, $p(y)/\mu(y)$ on the policy-centered score.
Also compare the sizes: the $\mu$-centered gradient is a covariance under $\mu$, so each
entry is $\mathrm{std}_\mu(A)\,\sqrt{F^\mu_i}\,|\mathrm{corr}_\mu(A, \tilde h_i)|$, and
its norm against the policy gradient's is the product of how the three factors change
from $p$ to $\mu$:
"""),
    code("""
norm_ratio, std_ratio, fisher_ratio = {}, {}, {}
for name in configs:
    r = results[name]
    g, cen = r.gradient, r.streams["centered"].gradient           # (P,) each
    iw = r.streams["raw"].importance_gradient
    pol, mu = r.streams["policy"], r.streams["centered"]
    norm_ratio[name] = np.linalg.norm(cen) / np.linalg.norm(g)
    std_ratio[name] = mu.reward_std / pol.reward_std
    print(f"{name}: norm of mu-centered / policy gradient {norm_ratio[name]:.2f}")
    print(f"{'':>6}std(A) under mu / p {std_ratio[name]:.2f}")
    fisher_ratio[name] = np.sqrt(mu.sequence_fisher.sum() / pol.sequence_fisher.sum())
    print(f"{'':>6}E[R] under mu {mu.expected_reward:.3f}, "
          f"under p {pol.expected_reward:.3f}; "
          f"sqrt(sum F) under mu / p {fisher_ratio[name]:.2f}")
    print(f"{'':>6}importance-weighted vs policy gradient: relative error "
          f"{np.abs(iw - g).max() / np.abs(g).max():.1e}")"""),
    md(r"""
Why is the $\mu$-centered gradient about twice as long as the policy gradient? Most of it is
the reward's spread: both samplers draw the rewarded token more often than the policy does
($E[R]$ is larger under $\mu$), so $\mathrm{std}(A)$ is larger under $\mu$, by the printed
std ratio. The Fisher's square root changes far less, and the correlations make up the rest
of the norm ratio. A longer gradient is not a better one: it is the covariance of a
different distribution, and its step goes where $\mu$'s rewards vary, not $p$'s.

## Knowing only part of $\mu$

An inference engine often returns only the top few log-probabilities. Suppose only the $m$
most likely tokens of $\mu$ are known at each state. The quiz at the top asked what
centering needs; here is what missing tokens cost. Center with the top-$m$ tokens of $\mu$, renormalised: for $m = V$ it is exact. Two measures of
what a smaller $m$ costs: the largest $|E_\mu[h_i]|$, and the share of parameters whose
gradient breaks the bound once a constant $c = 10$ is added to the advantage.
"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
bias_m = {}
for name in configs:
    r = results[name]
    ms = np.arange(1, r.task.model.vocab_size + 1)
    st = {m: r.streams[f"top{m}"] for m in ms}
    bias_m[name] = np.array([np.abs(st[m].score_mean).max() for m in ms])
    broken_m = [np.mean(np.abs(st[m].gradient_with_constant(10.0))
                        > st[m].bound * (1 + 1e-9)) for m in ms]
    axes[0].semilogy(ms, np.maximum(bias_m[name], 1e-18), "o-", label=name)
    axes[1].plot(ms, 100 * np.array(broken_m), "o-", label=name)
axes[0].axhline(1e-12, color="k", ls=":", label="rounding level")
axes[0].set_ylabel(r"$\\max_i |E_\\mu[h_i]|$")
axes[0].set_title("Bias left by partial centering")
axes[1].set_ylabel("% parameters with |G(c=10)| > bound")
axes[1].set_title("The bound with c = 10 added to A")
m_max = max(results[name].task.model.vocab_size for name in configs)
for ax in axes:
    ax.set_xlabel("m (top-m tokens of the sampler known)")
    # m is a whole number of tokens
    ax.set_xticks(np.arange(1, m_max + 1))
    ax.legend(fontsize=8)
plt.show()"""),
    checks("""
for name in configs:
    st = results[name].streams
    # raw: mean not zero
    assert np.abs(st["raw"].score_mean).max() > 1e-3
    assert np.abs(st["centered"].score_mean).max() <= 1e-12          # centered: zero
    assert gaps[name, "centered"] <= 1e-10 < 1e-6 < gaps[name, "raw"]
    assert broken[name, "centered"].max() == 0 and broken[name, "raw"][-1] > 0
    assert np.ptp(cos[name, "centered"]) <= 1e-10                    # flat in c
    assert cos[name, "raw"].min() < 0 < 0.5 < cos[name, "centered"][at0] < 1 - 1e-3
    r = results[name]
    assert np.abs(r.streams["raw"].importance_gradient - r.gradient).max() <= (
        1e-10 * np.abs(r.gradient).max())
    assert bias_m[name][-1] <= 1e-12 and bias_m[name][:-1].min() > 1e-3   # top-m, m < V
    # only the std(A) form
    assert uncentered[name].max() == 0 < broken[name, "raw"].max()
    assert 1.3 < std_ratio[name] < norm_ratio[name]
    assert abs(np.log(fisher_ratio[name])) < 0.2
    # "about twice as long"
    assert norm_ratio[name] > 1.5
assert cos["offpolicy_stale", "raw"][at0] > cos["offpolicy_stale", "centered"][at0]"""),
    *exercise("raw-score-mean"),
    *exercise("best-constant"),
    footer(STEM, [
        "Under a sampler $\\mu \\ne p$ the policy-centered score has mean "
        "$\\bar j_\\mu - \\bar j_p \\ne 0$: cross terms survive, a constant added to $A$ moves "
        "the gradient, and the bound with $\\mathrm{std}(A)$ fails (the uncentered "
        "$\\sqrt{E_\\mu[A^2]E_\\mu[h^2]}$ always holds).",
        "Centering under $\\mu$, $\\tilde\\xi = j_{y_t} - \\bar j_\\mu$, restores all of it; it "
        "needs $\\mu$'s whole next-token distribution, and top-$m$ leaves a bias.",
        "What centering buys is invariance to the constant in the advantage and a valid bound, "
        "not a better direction: the centered gradient is a covariance under $\\mu$, close to "
        "the policy gradient but not equal, and a policy-centered gradient with a lucky constant "
        "can be "
        "closer. Importance weights recover the policy gradient.",
    ]),
]
