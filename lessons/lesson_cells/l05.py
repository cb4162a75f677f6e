"""Lesson 5: off-policy samples need the score centered under the sampler."""
from ._cells import IMPORTS, code, exercise, footer, header, md, quiz

STEM = "05_offpolicy_centering"

CELLS = [
    header(STEM, [
        "explain why the raw score has a non-zero mean when responses come from another "
        "sampler $\\mu$, and what that breaks;",
        "center the score under $\\mu$ and check that the covariance structure and the bound "
        "come back;",
        "say what the centered gradient is, and that it is not the policy gradient;",
        "measure the bias left when only the top-$k$ tokens of $\\mu$ are known.",
    ], [
        "[Lesson 4](04_gradient_is_covariance.ipynb): the gradient as a covariance and its bound.",
        "[Lesson 1](01_sequence_to_tokens.ipynb): why $E[\\xi_t \\mid s_t] = 0$ on-policy.",
    ], r"""
## The claim

**Claim.** Lessons 1–4 leaned on one fact: under the distribution the responses come from, the
score has conditional mean zero. When responses come from a different sampler $\mu$ — a stale
copy of the model, a higher temperature, an inference engine — the raw score
$\xi_t = j_{y_t} - \bar j_p$ has mean $\bar j_\mu - \bar j_p \ne 0$ under $\mu$. Then the
cross terms no longer cancel, the gradient is no longer a covariance, and the bound
$|G| \le \mathrm{std}(A)\sqrt F$ can fail.

The repair: center under $\mu$, $\tilde\xi_t = j_{y_t} - \bar j_\mu$ with
$\bar j_\mu = \sum_a \mu_a j_a$. Every identity comes back, with expectations under $\mu$.
It needs $\mu$'s **whole** next-token distribution at each state.

`exact` runs the streams side by side: `"raw"` (drawn from $\mu$, centered at $\bar j_p$),
`"centered"` (drawn from $\mu$, centered at $\bar j_\mu$), and `"top{k}"` (centered using only
the $k$ most likely tokens of $\mu$).
"""),
    code(IMPORTS + """
configs = ["offpolicy_temperature", "offpolicy_stale"]
results = {}
for name in configs:
    task = load_config(name)
    V = task.model.vocab_size
    results[name] = exact(task, topk=tuple(range(1, V + 1)), progress=False)
    print(f"{name}: sampler {task.sampler}, V = {V}, "
          f"{results[name].n_responses} responses")"""),
    md(r"""
## The raw score's mean under $\mu$ is not zero

For every parameter, $|E_\mu[h_i]|$ for the raw and the centered score, and how far each
stream's Fisher $E_\mu[h^2]$ is from its token sum $E_\mu[\sum_t m(s_t)]$. Here $m(s)$ is the
off-policy counterpart of the token Fisher: the second moment, under $\mu$, of the stream's
token score at state $s$,

$$m_i(s) = \sum_a \mu_a(s)\,\big(j_{i,a}(s) - c_i(s)\big)^2,$$

with the center $c_i = \bar j_{p,i}$ for the raw stream and $c_i = \bar j_{\mu,i}$ for the centered
one. Centered, $m$ is the variance of the sensitivities under $\mu$ (the token Fisher formula
with $\mu$ in place of $p$);
raw, it adds the squared bias $(\bar j_\mu - \bar j_p)^2$. $E_\mu[h^2] = E_\mu[\sum_t m(s_t)]$
holds only when the cross terms vanish.
"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for ax, name in zip(axes, configs):
    st = results[name].streams
    for stream, color in [("raw", "tab:red"), ("centered", "tab:blue")]:
        m = np.sort(np.abs(st[stream].score_mean))[::-1]
        ax.semilogy(np.maximum(m, 1e-18), color=color, label=stream)
    ax.axhline(1e-12, color="k", ls=":", label="rounding level")
    ax.set_xlabel("parameters, sorted")
    ax.set_ylabel(r"$|E_\\mu[h_i]|$")
    ax.set_title(name)
    ax.legend()
fig.suptitle("Mean of the score under the sampler")
plt.show()
for name in configs:
    st = results[name].streams
    for stream in ("raw", "centered"):
        s = st[stream]
        gap = np.abs(s.sequence_fisher - s.token_fisher_sum).max() / s.sequence_fisher.max()
        print(f"{name:>22} {stream:>8}: max|E h| = {np.abs(s.score_mean).max():.1e}, "
              f"|F - token sum| / max F = {gap:.1e}")"""),
    md(r"""
## Add a constant to the advantage

The gradient with $A + c$ is $G + c\,E_\mu[h]$. Centered, that is $G$ for every $c$;
raw, it drifts linearly in $c$, while the cap $\mathrm{std}(A)\sqrt{E_\mu[h^2]}$ does not move.
The plot counts the parameters whose gradient breaks its cap, starting at $c = 0$. Where the
raw gradient breaks it already at $c = 0$ (printed below), the advantage itself carries such a
constant: $A = (A - E_\mu[A]) + E_\mu[A]$, and its mean $E_\mu[A]$ (which includes the task's
baseline $b$) acts like $c$.
"""),
    code("""
cs = np.concatenate([[0.0], np.logspace(-2, 2, 17)])
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for ax, name in zip(axes, configs):
    st = results[name].streams
    for stream, color in [("raw", "tab:red"), ("centered", "tab:blue")]:
        s = st[stream]
        broken = [np.mean(np.abs(s.gradient_with_constant(c)) > s.bound * (1 + 1e-9)) for c in cs]
        ax.plot(cs, 100 * np.array(broken), "o-", color=color, label=stream)
    ax.set_xscale("symlog", linthresh=1e-2)             # linear near 0, so c = 0 is on the axis
    ax.set_xlim(0, cs[-1] * 1.5)
    ax.set_ylim(-3, 103)
    ax.set_xlabel("constant c added to every advantage (0, then log scale)")
    ax.set_ylabel("% parameters with |G| > bound")
    ax.set_title(name)
    ax.legend()
plt.show()
for name in configs:
    st = results[name].streams
    for stream in ("raw", "centered"):
        s = st[stream]
        broken0 = np.mean(np.abs(s.gradient) > s.bound * (1 + 1e-9))
        drift = max(np.abs(s.gradient_with_constant(c) - s.gradient).max() for c in cs)
        print(f"{name:>22} {stream:>8}: baseline b = {results[name].task.baseline}, bound broken "
              f"at c = 0 by {broken0:.1%}; largest change of G over the c scanned = {drift:.1e}")"""),
    md(r"""
## What the centered gradient is, and is not

The centered gradient is $E_\mu[A\,\tilde h] = \mathrm{Cov}_\mu(A, \tilde h)$: a covariance under
the **sampler**, with all the structure of lessons 1–4 (mean-zero score, the bound). It is
**not** the policy gradient $\nabla_\theta E_p[R]$: the responses are weighted by $\mu$, not by
the policy. How far apart the two are on these tasks, and the route that does recover the
policy gradient from $\mu$'s samples (importance weights $P(y)/\mu(y)$ on the raw score):
"""),
    code("""
for name in configs:
    r = results[name]
    g, cen = r.gradient, r.streams["centered"].gradient           # (P,) each
    cos = cen @ g / (np.linalg.norm(cen) * np.linalg.norm(g))
    iw = r.streams["raw"].importance_gradient
    print(f"{name}: centered vs policy gradient: cosine {cos:.3f}, norm ratio "
          f"{np.linalg.norm(cen) / np.linalg.norm(g):.2f};  importance-weighted vs policy: "
          f"relative error {np.abs(iw - g).max() / np.abs(g).max():.1e}")
    assert 0.5 < cos < 1 - 1e-3                           # close, not equal: the text, checked"""),
    md(r"""
The directions are close (cosine printed above) but not equal, and the sizes differ: use the
centered gradient for what it is, an update direction whose coordinates obey the Fisher bound
under the sampler, not as an unbiased estimate of the policy gradient.
"""),
    *quiz("uncentered-constant"),
    md(r"""
## Knowing only part of $\mu$

An inference engine often returns only the top few log-probabilities. Center with the top-$k$
tokens of $\mu$, renormalised: for $k = V$ it is exact; below that, a bias remains. Two measures
of what it costs, against $k$: the largest $|E_\mu[h_i]|$, and the share of parameters whose
gradient breaks the bound once a constant $c = 10$ is added to the advantage.
"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for name in configs:
    r = results[name]
    V = r.task.model.vocab_size
    ks = np.arange(1, V + 1)
    bias = [np.abs(r.streams[f"top{k}"].score_mean).max() for k in ks]
    broken = [np.mean(np.abs(r.streams[f"top{k}"].gradient_with_constant(10.0))
                      > r.streams[f"top{k}"].bound * (1 + 1e-9)) for k in ks]
    axes[0].semilogy(ks, np.maximum(bias, 1e-18), "o-", label=name)
    axes[1].plot(ks, 100 * np.array(broken), "o-", label=name)
axes[0].axhline(1e-12, color="k", ls=":", label="rounding level")
axes[0].set_xlabel("k (top-k tokens of the sampler known)")
axes[0].set_ylabel(r"$\\max_i |E_\\mu[h_i]|$")
axes[0].set_title("Bias left by partial centering")
axes[1].set_xlabel("k (top-k tokens of the sampler known)")
axes[1].set_ylabel("% parameters with |G(c=10)| > bound")
axes[1].set_title("The bound with c = 10 added to A")
k_max = max(results[name].task.model.vocab_size for name in configs)
for ax in axes:
    ax.set_xticks(np.arange(1, k_max + 1))                # k is a whole number of tokens
    ax.legend(fontsize=8)
plt.show()"""),
    *quiz("centering-needs-mu"),
    *exercise("raw-score-mean"),
    *exercise("centered-vs-policy"),
    footer(STEM, [
        "Under a sampler $\\mu \\ne p$ the raw score has mean $\\bar j_\\mu - \\bar j_p \\ne 0$: "
        "cross terms survive, a constant added to $A$ moves the gradient, the bound fails.",
        "Centering under $\\mu$, $\\tilde\\xi = j_{y_t} - \\bar j_\\mu$, restores all of it; it "
        "needs $\\mu$'s whole next-token distribution, and top-$k$ leaves a bias.",
        "The centered gradient is a covariance under $\\mu$, close in direction to the policy "
        "gradient but not equal to it; importance weights recover the policy gradient.",
    ]),
]
