"""Lesson 5: off-policy samples need the score centered under the sampler."""
from ._cells import IMPORTS, code, md, quiz

STEM = "05_offpolicy_centering"

CELLS = [
    md(r"""
# 5. Off-policy: center the score under the sampler

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
stream's Fisher $E_\mu[h^2]$ is from its token sum $E_\mu[\sum_t m(s_t)]$ (equal only when the
cross terms vanish).
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
The plot counts the parameters whose gradient breaks its cap. (For the stale sampler the raw
gradient breaks it already at $c = 0$: that task's baseline $b = 0.5$ is itself such a constant.)
"""),
    code("""
cs = np.concatenate([[0.0], np.logspace(-2, 2, 17)])
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for ax, name in zip(axes, configs):
    st = results[name].streams
    for stream, color in [("raw", "tab:red"), ("centered", "tab:blue")]:
        s = st[stream]
        broken = [np.mean(np.abs(s.gradient_with_constant(c)) > s.bound * (1 + 1e-9)) for c in cs]
        ax.plot(cs[1:], 100 * np.array(broken[1:]), "o-", color=color, label=stream)
    ax.set_xscale("log")
    ax.set_ylim(-3, 103)
    ax.set_xlabel("constant c added to every advantage")
    ax.set_ylabel("% parameters with |G| > bound")
    ax.set_title(name)
    ax.legend()
plt.show()
for name in configs:
    s = results[name].streams["centered"]
    drift = max(np.abs(s.gradient_with_constant(c) - s.gradient).max() for c in cs)
    print(f"{name}: centered gradient, largest change over c = {drift:.1e}; "
          f"bound broken by {np.mean(np.abs(s.gradient) > s.bound * (1 + 1e-9)):.0%}")"""),
    md(r"""
A side note on what each gradient estimates: the centered gradient is the covariance
$\mathrm{Cov}_\mu(A, \tilde h)$ — the sampler's view, with all the structure of lessons 1–4.
The policy's own gradient can also be recovered from $\mu$'s samples by importance weights
$P(y)/\mu(y)$; the engine computes both:
"""),
    code("""
for name in configs:
    r = results[name]
    iw = r.streams["raw"].importance_gradient
    print(f"{name}: importance-weighted raw gradient vs on-policy gradient: relative error "
          f"{np.abs(iw - r.gradient).max() / np.abs(r.gradient).max():.1e}")"""),
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
for ax in axes:
    ax.legend(fontsize=8)
plt.show()"""),
    *quiz("centering-needs-mu"),
]
