"""Lesson 8: which RL estimator is unbiased? The exact expected gradient of the losses
trainers ship: importance ratios, truncation and masking, GRPO's difficulty weight, the
length normalisation, KL penalties, and centering against reweighting."""
from ._cells import IMPORTS, checks, code, exercise, footer, header, md, quiz

STEM = "08_rl_estimators"

CELLS = [
    header(STEM, [
        "write the expected gradient of a trainer's loss as an exact sum over groups of "
        "responses, and say what *unbiased* means for a loss that is minimised;",
        "derive which importance weight (token, sequence, cumulative prefix) is unbiased off "
        "policy, and measure the others' bias and MSE as the sampler drifts and as $T$ grows;",
        "derive the bias of truncated (TIS) and masked (MIS) weights and read it against the "
        "cap;",
        "compute GRPO's difficulty weight $w_B(\\gamma)$ exactly and compare it with the "
        "large-$B$ formula $1/\\sqrt{\\gamma(1-\\gamma)}$;",
        "show that dividing by the length changes the objective, that k3 in the loss follows "
        "the forward KL, and when centering beats reweighting.",
        "predict how token-mean's bias falls with the number of groups $K$ in a batch, and "
        "what PPO's clip does to the expected gradient once $\\theta_{old} \\ne \\theta$.",
    ], [
        "[Lesson 4](04_gradient_is_covariance.ipynb): the policy gradient "
        "$G = E_p[A h]$ and why a constant baseline leaves it unchanged.",
        "[Lesson 5](05_offpolicy_centering.ipynb): the sampler $\\mu$, the raw and the "
        "centered score.",
        "How an RL trainer writes its loss: per-token log-probabilities, advantages, "
        "importance ratios (PPO, GRPO).",
    ], r"""
## The claim

Trainers do not write $E_p[A h]$; they write a **loss** $\mathcal L$ to be minimised, from
the policy's log-probabilities $\log p(y_{i,t}|s_{i,t})$ of a group of $B$ responses
$y_1, \dots, y_B$ to one prompt. Everything else in it (rewards, the sampler's and the
reference policy's log-probabilities) is detached. So by the chain rule

$$\nabla_\theta \mathcal L = \sum_{i,t} \lambda_{i,t}\,\xi_{i,t}, \qquad
\lambda_{i,t} = \frac{\partial \mathcal L}{\partial \log p(y_{i,t}|s_{i,t})},$$

and on a model small enough to list every group its expectation is a finite sum,
$E[\nabla\mathcal L] = E_x\big[\sum_{y_1..y_B} \prod_i \mu(y_i|x)\,\nabla\mathcal L\big]$ (the
prompts $x$ in their weights).
`fisher_ref.estimators.expected_loss_gradient` computes it (the $\lambda_{i,t}$ by torch
autograd of your loss), with its variance over one group.

A loss is **unbiased** when $E[\nabla\mathcal L] = -G$, $G = \nabla_\theta E_p[R]$ the policy
gradient (the minus sign: it is minimised). A learning rate absorbs a positive scale, so we
fit $E[\nabla\mathcal L] \approx \omega\,G$ by least squares and judge what is left:

* the **relative bias** $\|E[\nabla\mathcal L] - \omega G\| / \|\omega G\|$, the part that
  no learning rate can fix (`lg.relative_bias`, `lg.scale` $= \omega$);
* the **relative MSE** of an average of $n$ groups, $\mathrm{mse}(n)/\|\omega G\|^2$, with
  $\mathrm{mse}(n) = \|E[\nabla\mathcal L] - \omega G\|^2 + \mathrm{tr\,Var}[\nabla\mathcal
  L]/n$ (`lg.mse(n)`).

**Claim.** Of the corrections trainers ship, only some are unbiased, and which ones can be
derived in a line; the others' bias is measured here exactly, with no sampling noise.

Symbols new in this lesson: $\mathcal L$ a loss; $B$ the group size; $r_t = p(y_t|s_t) /
\mu(y_t|s_t)$ a token's ratio, $r(y) = \prod_t r_t$ the sequence ratio; $C$ a cap;
$\omega$ the fitted scale; $\gamma$ a prompt's pass rate $P(R = 1)$; $w_B(\gamma)$ GRPO's
difficulty weight; $p_{ref}$ a reference policy and $\Delta_t = \log p(y_t|s_t) -
\log p_{ref}(y_t|s_t)$.
"""),
    code(IMPORTS + """
from fisher_ref.engine.plan import EngineOptions
from fisher_ref.estimators import expected_loss_gradient, presets
from fisher_ref.estimators.reduction import (
    difficulty_weight, difficulty_weight_large_g, reduced_gradient)
from fisher_ref.rewards import FunctionReward
from fisher_ref.samplers import make_sampler


def rel_mse(lg, n):
    \"\"\"Relative MSE of the average of n groups: mse(n) / ||omega G||^2.\"\"\"
    return lg.mse(n) / (lg.scale * np.linalg.norm(lg.policy_gradient)) ** 2


# V = 5, T = 3, two prompts, R = count of 2
base = load_config("default")
G0 = exact(base, progress=False).gradient      # (P,) the policy gradient G
print(f"P = {G0.size} parameters, |G| = {np.linalg.norm(G0):.4f}")"""),
    md(r"""
## Token, sequence or prefix ratios

Responses come from $\mu$; the advantage $A(y) = R(y) - R_0$ depends on the whole response.
Trainers weight each token's term $-A\log p(y_t|s_t)$ by a detached ratio: the token's own
$r_t$ (the PPO ratio, verl's token-level rollout correction), the sequence ratio $r(y)$ on
every token, or the prefix product $\prod_{u \le t} r_u$. Predict first:
"""),
    *quiz("which-ratio"),
    md(r"""
Weight the whole score by the sequence ratio and the sampler cancels:

$$E_\mu[r(y)\,A\,h] = \sum_y \mu(y)\,\frac{p(y)}{\mu(y)}\,A(y)\,h(y) = E_p[A h] = G .$$

A weight per token does less. The token ratio $r_t$ corrects the draw of $y_t$ only: the
tokens before it (which fix $s_t$) and after it (which fix $A$) are still drawn from $\mu$.
The prefix product $\prod_{u \le t} r_u$ corrects everything up to $y_t$, but not the suffix
that $A$ also depends on.

Three ways for $\mu$ to drift from $p$: a temperature (flatter than $p$), a stale copy of the
parameters (perturbed by a normal draw of growing scale), and longer responses ($T$, at
temperature 1.5). For each estimator, the relative bias and the relative MSE at $n = 64$
groups:
"""),
    code("""
ratios = {"sequence": presets.sequence_is, "token": presets.token_is,
          "prefix": presets.prefix_is}
temp = lambda t: make_sampler({"kind": "temperature", "temperature": t})
stale = lambda s: make_sampler({"kind": "perturbed", "scale": s, "seed": 7})
drifts = {
    "sampler temperature": [(t, base.with_(sampler=temp(t)))
                            for t in (1.0, 1.25, 1.5, 2.0, 2.5, 3.0)],
    "stale copy: perturbation scale": [(s, base.with_(sampler=stale(s)))
                                       for s in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)],
    "longest response T (temperature 1.5)": [
        (T, base.with_(max_len=T, sampler=temp(1.5))) for T in (1, 2, 3, 4, 5)],
}
bias, mse = {}, {}
for axis, points in drifts.items():
    for x, task in points:
        known = G0 if task.max_len == base.max_len else None   # p, and so G, unchanged
        for name, make in ratios.items():
            lg = expected_loss_gradient(task, make(), policy_gradient=known)
            bias[axis, name, x], mse[axis, name, x] = lg.relative_bias, rel_mse(lg, 64)"""),
    code("""
fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), constrained_layout=True)
colors = {"sequence": "tab:blue", "token": "tab:red", "prefix": "tab:orange"}
titles = ["a hotter sampler", "a stale copy of the policy", "longer responses"]
for k, (axis, points) in enumerate(drifts.items()):
    xs = [x for x, _ in points]
    axes[0, k].set_title(titles[k])
    for name, color in colors.items():
        axes[0, k].plot(xs, [bias[axis, name, x] for x in xs], "o-", color=color,
                        label=name)
        axes[1, k].semilogy(xs, [mse[axis, name, x] for x in xs], "o-", color=color)
    axes[1, k].set_xlabel(axis)
axes[0, 0].set_ylabel("relative bias")
axes[1, 0].set_ylabel("relative MSE, n = 64 groups")
axes[0, 0].legend(title="importance weight")
plt.show()
for axis, points in drifts.items():
    x = points[-1][0]
    print(f"{axis} = {x}:")
    print("    " + ", ".join(f"{name} bias {bias[axis, name, x]:.3f}"
                             for name in ratios))"""),
    md(r"""
The sequence ratio is exact at every drift (the blue line sits at zero); the token and prefix
ratios are exact only when there is nothing to correct ($\mu = p$, or $T = 1$, where all
three weights coincide), and their bias grows with the drift and with $T$, as the number of
uncorrected draws grows. The MSE tells the other half of the story: under the temperature
the sequence ratio is also the *least* noisy, but under the stale copy its variance grows by
orders of magnitude (a product of ratios is heavy-tailed), and a biased token ratio has the
smaller MSE at $n = 64$.

## Truncate or mask the weight

Capping the sequence weight at $C$ (TIS) or dropping the responses whose weight leaves
$[1/C, C]$ (MIS, IcePop) trades the variance for a bias. From the identity above,

$$E_\mu[\min(r, C)\,A\,h] - G = -E_p\big[(1 - C/r)_+\,A\,h\big], \qquad
E_\mu[r\,1[r \in [1/C, C]]\,A\,h] - G = -E_p\big[1[r \notin [1/C, C]]\,A\,h\big]:$$

both biases vanish once $[1/C, C]$ holds every ratio. At token level the same caps act on
$r_t$ instead. Predict first:
"""),
    *quiz("tis-large-cap"),
    code("""
stale_task = load_config("offpolicy_stale")
b0, G_st = stale_task.baseline, exact(stale_task, progress=False).gradient
seqs = exact(stale_task, progress=False,
             options=EngineOptions(keep_sequences=True)).sequences
r_max = (seqs["prob"] / seqs["sampler_prob"]).max()              # the largest r(y)
caps = np.logspace(0.1, 4, 14)
capped = {"sequence TIS": lambda C: presets.sequence_tis(C, baseline=b0),
          "token TIS": lambda C: presets.token_tis(C, baseline=b0),
          "sequence MIS": lambda C: presets.sequence_mis((1 / C, C), baseline=b0),
          "token MIS": lambda C: presets.token_mis((1 / C, C), baseline=b0)}
trunc = {name: np.array([expected_loss_gradient(stale_task, make(C),
                                                policy_gradient=G_st).relative_bias
                         for C in caps])
         for name, make in capped.items()}
token_is = presets.token_is(baseline=b0)
token_is_bias = expected_loss_gradient(stale_task, token_is).relative_bias
fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
for name, style in zip(capped, ["o-", "s-", "o--", "s--"]):
    ax.semilogx(caps, trunc[name], style, label=name)
ax.axvline(r_max, color="k", ls=":", label=f"largest ratio r(y) = {r_max:.0f}")
ax.axhline(token_is_bias, color="tab:red", lw=0.8, label="token IS, uncapped")
# linear near 0: zero bias shows
ax.set_yscale("symlog", linthresh=0.01)
ax.set_xlabel("cap C (band [1/C, C] for MIS)")
ax.set_ylabel("relative bias")
ax.set_title("offpolicy_stale")
ax.legend(fontsize=8)
plt.show()
print(f"C = {caps[-1]:.0f}: sequence TIS bias {trunc['sequence TIS'][-1]:.1e}, "
      f"token TIS {trunc['token TIS'][-1]:.3f} (token IS {token_is_bias:.3f})")"""),
    md(r"""
A sequence-level cap is a knob between variance and bias that reaches the unbiased estimator
at $C = \max r$; below it the bias is not zero, however often a cap is called "a correction"
(and on this stale sampler the ratios reach the thousands, so any practical cap is well
below it). A token-level cap converges to token IS, whose bias no cap removes.

## GRPO's difficulty weight

GRPO's advantage $A_1 = (R_1 - \bar R)/(\mathrm{std}(R) + \epsilon)$ depends on the other
responses only through their rewards. With a binary reward and on policy, split the
responses by reward: $H_1 = \sum_{y: R(y) = 1} p(y)\,h(y) = \nabla\gamma$ and
$H_0 = \sum_{y: R(y) = 0} p(y)\,h(y) = -\nabla\gamma$ (the scores average to zero), so

$$E[A_1 h_1] = \mathcal A_B(1)\,H_1 + \mathcal A_B(0)\,H_0
= \big(\mathcal A_B(1) - \mathcal A_B(0)\big)\,\nabla\gamma = w_B(\gamma)\,\nabla\gamma,
\qquad \mathcal A_B(1) = E[A_1 \mid R_1 = 1],$$

and likewise $\mathcal A_B(0)$: averages over the others' successes
$\nu \sim \mathrm{Bin}(B - 1, \gamma)$. Each prompt's
$\nabla\gamma_x$ is weighted by $w_B(\gamma_x)$. For large $B$, $\bar R \to \gamma$ and
$\mathrm{std}(R) \to \sqrt{\gamma(1-\gamma)}$, so $w_B \to 1/\sqrt{\gamma(1-\gamma)}$: rare
successes get a large weight. Predict what happens at $B = 2$:
"""),
    *quiz("grpo-two"),
    code(r"""
gammas = np.linspace(0.01, 0.99, 99)
w = {B: np.array([difficulty_weight(g, B) for g in gammas]) for B in (2, 4, 8, 16)}
fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
for B, line in w.items():
    ax.plot(gammas, line, label=f"exact $w_{{{B}}}$")
ax.plot(gammas, 1 / np.sqrt(gammas * (1 - gammas)), "k--",
        label=r"large-$B$ limit $1/\sqrt{\gamma(1-\gamma)}$")
ax.plot(gammas, [difficulty_weight_large_g(g, 8) for g in gammas], "k:",
        label=r"large-$B$ formula at $B = 8$")
ax.set_ylim(0, 8)
ax.set_xlabel(r"pass rate $\gamma$")
ax.set_ylabel("difficulty weight")
ax.legend(fontsize=8)
plt.show()
w8, f8 = difficulty_weight(0.02, 8), difficulty_weight_large_g(0.02, 8)
print(f"w_2 from {w[2].min():.4f} to {w[2].max():.4f}; at gamma = 0.02, B = 8: exact "
      f"{w8:.2f}, large-B formula {f8:.2f}")"""),
    md(r"""
The same weight on a model: give the default model a binary reward (the response is the
single token 2) and hold GRPO's exact expected gradient, groups of 2 enumerated, against
$-E_x[w_2(\gamma_x)\,\nabla\gamma_x]$, one policy gradient per prompt; at $B = 8$,
where the groups are too many to list, the sum over reward classes gives it:
"""),
    code("""
binary = base.with_(reward={"name": "match", "target": [2]})
grpo_sum = presets.policy_gradient_loss("grpo", aggregation="seq-mean-token-sum")
lg_grpo = expected_loss_gradient(binary, grpo_sum, group_size=2, symmetric=True)
per_prompt, pass_rate = [], []
for x, wx in zip(binary.prompts, binary.prompt_weights):
    r_x = exact(binary.with_(prompts=[x], prompt_weights=[1.0]), progress=False)
    pass_rate.append(r_x.sequences["prob"] @ r_x.sequences["reward"])    # gamma_x
    per_prompt.append((wx, r_x.gradient))                                # grad gamma_x
by_weight = {B: sum(wx * difficulty_weight(gx, B) * gr
                    for (wx, gr), gx in zip(per_prompt, pass_rate)) for B in (2, 8)}
red8 = reduced_gradient(binary, 8, "grpo")
for B, got in ((2, -lg_grpo.mean), (8, red8)):
    err = np.abs(got - by_weight[B]).max() / np.abs(by_weight[B]).max()
    print(f"B = {B}: |E[A h] - E_x[w_B(gamma_x) grad gamma_x]| / max = {err:.1e}")
print("pass rates:", np.round(pass_rate, 4))"""),
    md(r"""
## The length bias of `seq-mean-token-mean`

GRPO's original loss divides each response's token sum by its length $L$. One identity
does the work: for any function $\phi(y)$ of the response that does not depend on $\theta$,

$$E_p[\phi(y)\,h(y)] = \sum_y p(y)\,\phi(y)\,\nabla_\theta\log p(y)
= \nabla_\theta \sum_y p(y)\,\phi(y) = \nabla_\theta E_p[\phi] .$$

With a fixed advantage, predict what the loss's expected gradient is the gradient of:
"""),
    *quiz("length-objective"),
    md(r"""
How the length moves: the first-order change of $E_p[L]$ along a step down the loss is
$\langle \nabla E_p[L], -E[\nabla\mathcal L]\rangle$, and $\nabla E_p[L]$ is itself the
expected gradient of REINFORCE with the length as the reward. Against the baseline $R_0$:
"""),
    code("""
length_loss = lambda b: -(b.lengths * b.logp.sum(1)).mean()      # REINFORCE, R = L
# grad E[L]
grad_len = -expected_loss_gradient(base, length_loss, policy_gradient=G0).mean
R0s = np.linspace(-1.0, 3.0, 9)
aggs = ["seq-mean-token-sum", "seq-mean-token-mean"]
drift = {agg: [] for agg in aggs}
for R0 in R0s:
    for agg in aggs:
        loss = presets.policy_gradient_loss("constant", aggregation=agg, baseline=R0)
        step = -expected_loss_gradient(base, loss, policy_gradient=G0).mean
        drift[agg].append(grad_len @ step)
fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
for agg, style in zip(aggs, ["o-", "s-"]):
    ax.plot(R0s, drift[agg], style, label=agg)
ax.axhline(0, color="0.6", lw=0.8)
ax.set_xlabel("baseline $R_0$ (the rewards are 0 to 3)")
ax.set_ylabel("change of E[L] per unit step")
ax.legend()
plt.show()
# R0 = 2
f_reward = FunctionReward(lambda x, y: (np.sum(np.asarray(y) == 2) - 2.0) / len(y))
mean_len = presets.policy_gradient_loss("constant", aggregation=aggs[1], baseline=2.0)
lhs = expected_loss_gradient(base, mean_len, policy_gradient=G0).mean
# grad E[(R - R0)/L]
rhs = exact(base.with_(reward=f_reward), progress=False).gradient
len_err = np.abs(lhs + rhs).max() / np.abs(rhs).max()
print(f"R0 = 2: |E[grad L] + grad E[(R - R0)/L]| / max = {len_err:.1e}")"""),
    md(r"""
Summing the tokens, the baseline changes nothing (lesson 4: a constant multiplies
$E[h] = 0$). Dividing by $L$, it does: the loss is REINFORCE on $\phi = (R - R_0)/L$, so its
objective is $E_p[(R - R_0)/L]$, and as $R_0$ rises above the rewards the advantages turn
negative, and the loss is lowered by making responses *longer*. GRPO's group advantage is
not fixed per response, but the $1/L$ acts the same way. The length gained per unit of
reward gained along each aggregation's step, groups of $B = 2$:
"""),
    code("""
rate = {}
for agg in ("seq-mean-token-sum", "seq-mean-token-mean", "token-mean",
            "seq-mean-token-sum-norm"):
    loss = presets.policy_gradient_loss("grpo", aggregation=agg)
    step = -expected_loss_gradient(base, loss, 2, symmetric=True,
                                   policy_gradient=G0).mean
    rate[agg] = (grad_len @ step) / (G0 @ step)
    print(f"{agg:>24}: dE[L] / dE[R] = {rate[agg]:.3f}")
print(f"{'along G itself':>24}: dE[L] / dE[R] = {grad_len @ G0 / (G0 @ G0):.3f}")"""),
    md(r"""
## KL penalties: k1, k2, k3

A KL term against a reference policy $p_{ref}$ (here a perturbed copy of $\theta$) is
written per sampled token from $\Delta_t$. The derivative of each term times
$\nabla\log p$, averaged on policy over the next token $a \sim p$ at a fixed state
($\xi_a$ the score of candidate $a$, $\sum_a p_a\xi_a = 0$):

* k1 $= \Delta$: $E_{a\sim p}[\xi_a] = 0$; no gradient on average;
* k2 $= \Delta^2/2$: $E_{a\sim p}[\Delta_a\xi_a] = \nabla_\theta KL(p\|p_{ref})$ at the state;
* k3 $= e^{-\Delta} - 1 + \Delta$: derivative $1 - e^{-\Delta} = 1 - p_{ref}/p$.

The sequence-level KL the objective penalises differentiates the states' distribution too:
$\nabla KL(p_{seq}\|p_{ref,seq}) = E_p[(\sum_t \Delta_t)\,h]$, k1 summed into the reward
(`lg.kl_gradient`). Predict k3's per-state direction:
"""),
    *quiz("k3-direction"),
    code("""
kl_terms = {"k1 in the loss": presets.kl_loss("k1"),
            "k2 in the loss": presets.kl_loss("k2"),
            "k3 in the loss": presets.kl_loss("k3"), "ratio * k3": presets.rho_k3(),
            "k1 in the reward": presets.kl_in_reward()}
forward = lambda b: ((b.ref_logp_all.exp() * (b.ref_logp_all - b.logp_all)).sum(-1)
                     # sum_t KL(p_ref || p) at s_t
                     * b.mask).sum(-1).mean()
reverse = lambda b: ((b.logp_all.exp() * (b.logp_all - b.ref_logp_all)).sum(-1)
                     # sum_t KL(p || p_ref) at s_t
                     * b.mask).sum(-1).mean()
ref_scales = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)
kl_bias, kl_far, kl_size = {}, {}, {}
for lam in ref_scales:
    ref = make_sampler({"kind": "perturbed", "scale": lam, "seed": 5})
    task = base.with_(reference=ref)
    fwd, rev = (expected_loss_gradient(task, f, policy_gradient=G0).mean
                for f in (forward, reverse))
    for name, loss in kl_terms.items():
        lg = expected_loss_gradient(task, loss, policy_gradient=G0)
        # grad KL(p_seq || p_ref,seq)
        kg = lg.kl_gradient
        kl_bias[name, lam] = np.linalg.norm(lg.mean - kg) / np.linalg.norm(kg)
        kl_size[name, lam] = np.linalg.norm(lg.mean) / np.linalg.norm(kg)
        kl_far[name, lam] = [np.linalg.norm(lg.mean - t) / np.linalg.norm(t)
                             for t in (fwd, rev)]"""),
    code("""
fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
# k2 and rho*k3 coincide
for name, style in zip(kl_terms, ["o-", "s-", "^-", "x--", "d-"]):
    ax.plot(ref_scales, [kl_bias[name, lam] for lam in ref_scales], style, label=name)
ax.set_xlabel("reference: perturbation scale of theta")
ax.set_ylabel(r"$\\|E[\\nabla L] - \\nabla KL_{seq}\\| / \\|\\nabla KL_{seq}\\|$")
ax.legend(fontsize=8)
plt.show()
print(f"{'at scale 0.4':>18}  vs sequence KL   vs forward sum   vs reverse sum")
for name in kl_terms:
    f_err, r_err = kl_far[name, 0.4]
    print(f"{name:>18}  {kl_bias[name, 0.4]:14.1e}  {f_err:14.1e}  {r_err:14.1e}")"""),
    md(r"""
Read the table by its zeros. k3 in the loss is exactly the sum over the visited states of
$\nabla KL(p_{ref}\|p)$, the **forward** KL, with the states' distribution held fixed; k2,
and k3 multiplied by the differentiable ratio $p/p_{old}$ (1 in value, not in
gradient), are exactly the per-state **reverse** KL. None of them is the sequence-level KL
gradient, and their distance from it grows as the reference moves away; only k1 summed into
the reward is it, at every scale. k1 in the loss has no gradient on average (the line at 1
is a zero vector).

## Centering against reweighting

Lesson 5 centered the score under $\mu$ instead of reweighting it. Centering is biased,
since its gradient is a covariance under $\mu$, not $G$, but it multiplies by no ratio.
Write bias for the relative bias and var for the variance trace divided by $\|\omega G\|^2$;
then the relative MSE of $n$ groups is $\mathrm{bias}^2 + \mathrm{var}/n$: the smaller
variance wins at small $n$, the smaller bias at large $n$. Predict the temperature sampler:
"""),
    *quiz("centering-or-is"),
    code("""
ns = np.unique(np.logspace(0, 4, 41).astype(int))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True, sharey=True)
lgs, top_ratio = {}, {}
for ax, name in zip(axes, ["offpolicy_temperature", "offpolicy_stale"]):
    task = load_config(name)
    for est, loss in [("centered", presets.centered(task.baseline)),
                      ("sequence IS", presets.sequence_is(baseline=task.baseline))]:
        lgs[name, est] = lg = expected_loss_gradient(task, loss)
        ax.loglog(ns, [rel_mse(lg, n) for n in ns], label=f"{est}: bias "
                  f"{lg.relative_bias:.2f}, scale {lg.scale:+.2f}")
    s = exact(task, progress=False,
              options=EngineOptions(keep_sequences=True)).sequences
    top_ratio[name] = (s["prob"] / s["sampler_prob"]).max()     # the largest r(y)
    ax.set_xlabel("n, groups averaged")
    ax.set_title(f"{name}: largest r(y) = {top_ratio[name]:.4g}")
    ax.legend(fontsize=8)
axes[0].set_ylabel("relative MSE")
plt.show()"""),
    md(r"""
On the temperature sampler the ratios stay below 1.6, so reweighting costs little variance:
sequence IS is better at every $n$. On the stale sampler the ratios reach the thousands,
centering's variance is several times smaller, and it wins up to a crossover $n^*$ (the
exercise below computes it). Centering also leaves a scale $\omega \ne -1$, which a learning
rate absorbs, and a direction error, which nothing does.
"""),
    md(r"""
## How many groups share the divisor

verl's `token-mean`, TRL's `dapo` and DAPO divide the batch's token sum by the number of
tokens **in the batch**, $N = \sum_i |y_i|$, and a trainer's batch holds $K$ groups, not
one. `expected_loss_gradient(..., groups_per_batch=K)` enumerates every batch of $K$
groups. The gradient is then a ratio $X/N$, with $X = -\sum_i A_i h_i$ summed over the
batch, and $N$ moves with the responses that $X$ scores, so
$E[X/N] \ne E[X]/E[N]$. To second order (the delta method),

$$E\Big[\frac XN\Big] \approx \frac{E X}{E N} - \frac{\mathrm{Cov}(X, N)}{(E N)^2}
+ \frac{E X\,\mathrm{Var}\,N}{(E N)^3} .$$

$X$ and $N$ are sums over $K$ independent groups: their means, covariance and variance all
grow like $K$, so both corrections are $1/K$ of the first term. As $K \to \infty$,
$N/K \to G\,E|y|$, a constant: the aggregation `"token-mean-limit"` divides by
$K G\,E|y|$ (from `batch.limit`), and a constant divisor only rescales. Predict first, for
REINFORCE with one response per group on the `tabular` task:
"""),
    *quiz("token-mean-batches"),
    code("""
tab = load_config("tabular")           # V = 3, T = 3, two prompts, R = count of 1
G_tab = exact(tab, progress=False).gradient
token_means = {"REINFORCE, G = 1": ("constant", 1, [1, 2, 3, 4, 5]),
               "RLOO, G = 2": ("rloo", 2, [1, 2]), "GRPO, G = 2": ("grpo", 2, [1, 2])}
tm_bias, tm_limit = {}, {}
for name, (adv, gs, Ks) in token_means.items():
    per_batch = presets.policy_gradient_loss(adv, aggregation="token-mean")
    tm_bias[name] = [expected_loss_gradient(tab, per_batch, gs, symmetric=True,
                                            groups_per_batch=K, policy_gradient=G_tab)
                     .relative_bias for K in Ks]
    large = presets.policy_gradient_loss(adv, aggregation="token-mean-limit")
    tm_limit[name] = expected_loss_gradient(tab, large, gs, symmetric=True,
                                            policy_gradient=G_tab).relative_bias"""),
    code("""
fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
for c, (name, (_, _, Ks)) in enumerate(token_means.items()):
    ax.plot(Ks, tm_bias[name], "os^"[c] + "-", color=f"C{c}", label=name)
    ax.axhline(tm_limit[name], color=f"C{c}", ls="--", lw=1)
Ks = token_means["REINFORCE, G = 1"][2]
ax.plot(Ks, [tm_bias["REINFORCE, G = 1"][0] / K for K in Ks], "k:",
        label="REINFORCE's bias at K = 1, divided by K")
ax.set_xlabel("groups per batch K (dashed: the large-batch limit)")
ax.set_ylabel("relative bias, token-mean")
ax.set_xticks(Ks)
ax.legend(fontsize=8)
plt.show()
print(f"{'relative bias':>16}" + "".join(f"{'K = ' + str(K):>9}" for K in Ks)
      + f"{'large batch':>13}")
for name, (_, _, ks) in token_means.items():
    row = "".join(f"{b:9.4f}" for b in tm_bias[name]) + " " * 9 * (len(Ks) - len(ks))
    print(f"{name:>16}{row}{tm_limit[name]:13.1e}")"""),
    md(r"""
The per-group check ($K = 1$) over-states what a trainer that normalises over a mini-batch
pays: REINFORCE's bias falls like $1/K$ (the dotted line) and RLOO's about halves from one
group to two; both vanish at the large-batch limit, where the divisor is a constant. GRPO
keeps a part at the limit: its advantage divides by each *group's* reward standard
deviation, a divisor inside the group that no number of groups averages away (the
difficulty weight above). $K = 3$ at $G = 2$ is over two million batches here, too slow
for a lesson; the bias keeps falling towards the dashed lines.

## PPO's clip at a later step

PPO's data are drawn from $\theta_{old}$ and its loss weights each token by
$r_t = p_\theta(y_t|s_t)/p_{\theta_{old}}(y_t|s_t)$, clipped:
$\max(-A r_t, -A\,\mathrm{clip}(r_t, 1-\epsilon, 1+\epsilon))$. At the first step of an
epoch $\theta_{old} = \theta$, every $r_t = 1$, and the clip is inactive. The task key
`old_policy` sets $\theta_{old}$ apart (`"sampler"`: $\theta_{old}$ drew the responses,
here a stale copy of $\theta$). Unclipped (`ppo_clip(clip=False)`) the loss is token IS,
whose bias is small at a small drift. Take RLOO advantages and the large-batch divisor, so
that at the first step nothing is biased, and predict:
"""),
    *quiz("ppo-clip-later"),
    code("""
from fisher_ref.estimators import check_loss, clipped_share

ppo = lambda clip: presets.ppo_clip(advantage="rloo", aggregation="token-mean-limit",
                                    clip=clip)
later = lambda s: tab.with_(sampler=make_sampler({"kind": "perturbed", "scale": s,
                                                  "seed": 1}), old_policy="sampler")
olds = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
ppo_lg = {(s, clip): expected_loss_gradient(later(s), ppo(clip), 2, symmetric=True,
                                            policy_gradient=G_tab)
          for s in olds for clip in (True, False)}
share = {s: clipped_share(ppo_lg[s, True], ppo_lg[s, False]) for s in olds}
first = check_loss(tab, ppo(True), 2, "unbiased-up-to-scale", symmetric=True)
at_half = check_loss(later(0.5), ppo(True), 2, "unbiased-up-to-scale", symmetric=True)
print(f"first step: {'PASS' if first.passed else 'FAIL'}, relative bias "
      f"{first.relative_bias:.1e}")
print(f"scale 0.5: {'PASS' if at_half.passed else 'FAIL'}, relative bias "
      f"{at_half.relative_bias:.3f} "
      f"(unclipped {ppo_lg[0.5, False].relative_bias:.3f}), "
      f"clipped share {share[0.5]:+.3f}")"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for clip, style in ((True, "o-"), (False, "s--")):
    label = "clipped, eps = 0.2" if clip else "unclipped (token IS)"
    axes[0].plot(olds, [ppo_lg[s, clip].relative_bias for s in olds], style,
                 label=label)
    axes[1].loglog(ns, [rel_mse(ppo_lg[0.5, clip], n) for n in ns], style[1:],
                   label=label)
axes[0].set_xlabel("theta_old: perturbation scale of theta")
axes[0].set_ylabel("relative bias")
axes[1].set_xlabel("n, groups averaged (theta_old at scale 0.5)")
axes[1].set_ylabel("relative MSE")
for ax in axes:
    ax.legend(fontsize=8)
plt.show()
for n in (1, 16, 256):
    print(f"n = {n:>3}: relative MSE clipped {rel_mse(ppo_lg[0.5, True], n):.3f}, "
          f"unclipped {rel_mse(ppo_lg[0.5, False], n):.3f}")"""),
    md(r"""
The clip is not a correction of the estimator but a trust region: it drops the push on the
tokens whose ratio has already left $[1-\epsilon, 1+\epsilon]$ in the direction their
advantage wants, and keeps it on the others. While no ratio leaves the band it does
nothing; past that drift it turns the expected gradient (here a relative bias over ten
times token IS's, which no learning rate removes) and lengthens it along the unclipped one
(a negative clipped share: the dropped terms pointed against it). In return one batch's
gradient is less noisy, so the clipped loss has the smaller MSE for a few groups and the
larger once many are averaged: the clip trades bias for variance.

## Check your own loss

Every number above came from `expected_loss_gradient`; `check_loss` turns one into a verdict
for a test suite (`assert check_loss(...)`), judged at the exact-identity tolerance. Any
function of a `LossBatch` written as your trainer writes it will do; the how-to is
`docs/check/rl_losses.md`:
"""),
    code("""
import textwrap
from fisher_ref.estimators import check_loss

verdicts = {}
for name, loss in [("sequence IS", presets.sequence_is(baseline=b0)),
                   ("token IS", presets.token_is(baseline=b0))]:
    verdict = check_loss(stale_task, loss, expect="unbiased")
    verdicts[name] = verdict.passed
    print(textwrap.fill(f"{name}: {verdict}", 88, subsequent_indent="    "))"""),
    checks("""
tol = 1e-10
for axis, points in drifts.items():                              # (a)
    for x, _ in points:
        assert bias[axis, "sequence", x] <= tol
        drifted = x > 0 if axis.startswith("stale") else x > 1
        assert (min(bias[axis, "token", x], bias[axis, "prefix", x]) > 0.05) == drifted
tem, st = "sampler temperature", "stale copy: perturbation scale"
for t in (1.25, 1.5, 2.0, 2.5, 3.0):
    assert mse[tem, "sequence", t] < min(mse[tem, "token", t], mse[tem, "prefix", t])
assert mse[st, "sequence", 0.5] > 10 * mse[st, "token", 0.5]
T_axis = "longest response T (temperature 1.5)"
assert all(np.diff([bias[T_axis, "token", T] for T in range(2, 6)]) > 0)
assert trunc["sequence TIS"][-1] <= tol and trunc["sequence MIS"][-1] <= tol   # (b)
assert np.array_equal(trunc["sequence TIS"] <= tol, caps >= r_max)
assert caps[0] < r_max < caps[-1]
assert abs(trunc["token TIS"][-1] - token_is_bias) <= tol * token_is_bias
assert np.ptp(w[2]) <= 1e-6 and abs(w[2][0] - 2 ** -0.5) <= 1e-6                # (c)
assert round(w8, 2) == 2.41 and round(f8, 2) == 6.25
assert all(np.all(w[B] < w[2 * B]) for B in (2, 4, 8))
assert np.abs(-lg_grpo.mean - by_weight[2]).max() <= tol * np.abs(by_weight[2]).max()
assert np.abs(red8 - by_weight[8]).max() <= tol * np.abs(by_weight[8]).max()
token_sum, token_mean = drift["seq-mean-token-sum"], drift["seq-mean-token-mean"]
assert np.ptp(token_sum) <= tol * np.abs(token_sum).max()
assert all(np.diff(token_mean) > 0) and token_mean[-1] > 0
# (d)
assert rate["seq-mean-token-mean"] > 1.5 * rate["seq-mean-token-sum"] and len_err <= tol
for lam in ref_scales:                                                          # (e)
    assert kl_far["k3 in the loss", lam][0] <= tol
    assert kl_far["k2 in the loss", lam][1] <= tol
    assert kl_far["ratio * k3", lam][1] <= tol
    assert kl_bias["k1 in the reward", lam] <= tol
    assert min(kl_bias["k3 in the loss", lam], kl_bias["k2 in the loss", lam]) > 0.05
    assert kl_size["k1 in the loss", lam] <= tol
for name in ("k2 in the loss", "k3 in the loss", "ratio * k3"):
    assert all(np.diff([kl_bias[name, lam] for lam in ref_scales]) > 0)
tm, so = "offpolicy_temperature", "offpolicy_stale"                              # (f)
assert all(rel_mse(lgs[tm, "sequence IS"], n) < rel_mse(lgs[tm, "centered"], n)
           for n in ns)
assert rel_mse(lgs[so, "centered"], 1) < rel_mse(lgs[so, "sequence IS"], 1)
assert rel_mse(lgs[so, "centered"], 10 ** 4) > rel_mse(lgs[so, "sequence IS"], 10 ** 4)
assert max(lgs[n, "sequence IS"].relative_bias for n in (tm, so)) <= tol
assert top_ratio[tm] < 1.6 and top_ratio[so] == r_max > 1000
v = {k: g.variance_trace / (g.scale * np.linalg.norm(g.policy_gradient)) ** 2
     for k, g in lgs.items()}
assert v[so, "sequence IS"] > 3 * v[so, "centered"]
assert abs(lgs[so, "centered"].scale + 1) > 0.1
assert verdicts == {"sequence IS": True, "token IS": False}
rb, rl, gr = (tm_bias[k] for k in token_means)                                   # (g)
assert all(np.diff(rb) < 0)
assert all(abs(K * b / rb[0] - 1) < 0.2 for K, b in enumerate(rb, 1))
assert abs(rl[0] / rl[1] - 2) < 0.1 and gr[1] < gr[0]
assert max(tm_limit["REINFORCE, G = 1"], tm_limit["RLOO, G = 2"]) <= tol
assert tm_limit["GRPO, G = 2"] > 0.01 and tm_limit["GRPO, G = 2"] < gr[1]
assert first.passed and first.relative_bias <= tol and not at_half.passed        # (h)
for sc in (0.0, 0.1):                                        # no ratio leaves the band
    assert np.abs(ppo_lg[sc, True].mean - ppo_lg[sc, False].mean).max() <= tol
assert at_half.relative_bias > 10 * ppo_lg[0.5, False].relative_bias and share[0.5] < 0
assert abs(at_half.relative_bias - ppo_lg[0.5, True].relative_bias) <= tol
assert rel_mse(ppo_lg[0.5, True], 1) < rel_mse(ppo_lg[0.5, False], 1)
assert rel_mse(ppo_lg[0.5, True], 256) > rel_mse(ppo_lg[0.5, False], 256)"""),
    *exercise("difficulty-weight-by-hand"),
    *exercise("k3-state-gradient"),
    *exercise("crossover-batch"),
    footer(STEM, [
        "A loss's gradient is $\\sum_{i,t} \\lambda_{i,t}\\xi_{i,t}$, so its expectation over "
        "every group is a finite sum on a small model: bias and variance are exact numbers, not "
        "estimates.",
        "Off policy only the sequence ratio $r(y)$ is unbiased; token and prefix ratios leave "
        "a bias that grows with the drift and with $T$. Truncating or masking $r(y)$ is "
        "biased until the band holds every ratio; a token-level cap tends to token IS.",
        "GRPO weights each prompt's $\\nabla\\gamma$ by $w_B(\\gamma)$, far below "
        "$1/\\sqrt{\\gamma(1-\\gamma)}$ at small $B$ and constant at $B = 2$.",
        "Dividing by the length optimises $E_p[A/L]$: with negative advantages it makes "
        "responses longer. k3 in the loss follows the per-state forward KL, k2 and "
        "$(p/p_{old})\\cdot$k3 the per-state reverse KL; only k1 in the reward is the sequence KL.",
        "Centering beats reweighting only while its smaller variance outweighs its bias: "
        "never on a flatter sampler, up to a crossover $n^*$ on a stale one.",
        "A token-mean divisor is random: its bias falls like $1/K$ with the groups in the "
        "batch, to zero at the large-batch limit for REINFORCE and RLOO, not for GRPO. PPO's "
        "clip is inactive at the first step; later it trades a bias for a smaller variance.",
    ]),
]
