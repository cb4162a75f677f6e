"""Lesson 7: the identities hold for attention too; where a small GPT-2's Fisher sits, its
key bias that no logit feels, and the gradient under its Fisher bound."""
from ._cells import IMPORTS, checks, code, exercise, footer, header, md, quiz

STEM = "07_transformer"

CELLS = [
    header(STEM, [
        "say why the identities of lessons 1–5 hold for any model whose next-token "
        "distribution is a softmax of its logits, attention included, and check them on a "
        "GPT-2, on- and off-policy;",
        "group a transformer's parameters (embeddings, attention, MLP, LayerNorm) by their "
        "names and compare where its Fisher sits with the MLP of the earlier lessons, on a "
        "like-for-like footing;",
        "explain why an attention key bias has exactly zero Fisher, and show it three ways;",
        "draw the gradient against its bound $\\mathrm{std}(A)\\sqrt{F_i}$ for a transformer.",
    ], [
        "[Lesson 1](01_sequence_to_tokens.ipynb): $F_i = E[h_i^2] = E[\\sum_t f_i(s_t)]$ and "
        "why the cross terms vanish.",
        "[Lesson 4](04_gradient_is_covariance.ipynb): the gradient as a covariance and its "
        "bound; [lesson 5](05_offpolicy_centering.ipynb): the centered and raw streams.",
        "What attention computes: queries, keys, values and a softmax over positions.",
    ], r"""
## The claim

Look back at what the identities used. The token score is
$\xi_{t,i} = j_{i,y_t} - \bar j_i$ because $\log p_a = z_a - \log\sum_b e^{z_b}$, and it averages
to zero given the state because the probabilities sum to one. Nothing in those two facts
knows how the logits $z(s)$ were computed. So the cross terms vanish, the sequence Fisher is
the token-sum Fisher, the gradient is a covariance and $|G_i| \le \mathrm{std}(A)\sqrt{F_i}$,
for **any** differentiable model that ends in a softmax: an MLP over a window, or a
transformer that attends over the whole history.

**Claim.** The identities are not a property of the MLP: they hold for attention too. This
lesson checks every one of them on a small GPT-2, then asks a question the identities do not
answer: where, among the transformer's parameters, does its Fisher sit?
"""),
    md(r"""
## The model: a GPT-2 small enough to enumerate

`gpt2_small` computes what Hugging Face's `GPT2LMHeadModel` computes, written out in autograd
in float64 (the test suite holds its logits to `transformers`' at $10^{-12}$): one block, two
heads, embedding width $d = 8$, vocabulary $V = 5$ (token 0 is EOS) plus BOS. A
state's input is `[BOS] + prompt + generated tokens`, the whole history, no window:

* **embeddings**: $X_t = \mathrm{wte}[\text{token at } t] + \mathrm{wpe}[t]$ for each input
  position $t$;
* **attention** (pre-LayerNorm, residual): `ln_1`, then `c_attn` makes queries, keys and
  values, the heads attend to earlier positions, and `c_proj` maps the result back;
* **MLP** (pre-LayerNorm, residual): `ln_2`, `mlp.c_fc` (width $4d$), GELU, `mlp.c_proj`;
* **head**: `ln_f`, then the logits of the last position are $\mathrm{LN}_f(X)\,\mathrm{wte}^\top$:
  the output layer is the token embedding itself (**tied**).

Every response is still listed, so every number below is an exact finite sum. The parameters
are `theta`, laid out in `named_parameters()` order:
"""),
    code(IMPORTS + """
import os, platform, time
from fisher_ref.checks.identities import exact_checks
from fisher_ref.teaching.views import compact_table

task = load_config("gpt2_small")
model = task.model
print(f"{'block':>36} {'shape':>8} {'offset':>6} {'size':>5}")
for name, shape, offset in model.layout():
    print(f"{name:>36} {str(shape):>8} {offset:6d} {int(np.prod(shape)):5d}")
t0 = time.perf_counter()
r = exact(task, progress=False)
print(f"P = {model.num_params} parameters; prompts {task.prompts}, responses up to "
      f"{task.max_len} tokens")
print(f"{r.n_responses} responses through {r.n_states} states, exact in "
      f"{time.perf_counter() - t0:.2f} s on this machine ({platform.machine()}, "
      f"{os.cpu_count()} CPU cores)")
mlp_task = load_config("default")
r_mlp = exact(mlp_task, progress=False)
same = {key: (getattr(mlp_task, key), getattr(task, key))
        for key in ("prompts", "max_len")}
same["reward"] = (mlp_task.spec["reward"], task.spec["reward"])
print(f"the MLP of lessons 0-6 (config default): P = {mlp_task.model.num_params}")
print(f"same prompts, reward and response length: "
      f"{all(a == b for a, b in same.values())}")"""),
    md(r"""
## Every identity, on attention

`exact_checks` is what `python -m fisher_ref verify` prints: one row per identity, each
comparing two routes to one quantity (a relative error) or measuring a quantity that must
vanish against its natural scale. The tolerance is $10^{-10}$; float64 rounding is near
$10^{-16}$. The rows are numbered as in docs/theory.md §2.9:

| no. | identity | lesson |
|---|---|---|
| 1 | zero-mean score: $E[\xi_{t,i} \mid s_t] = 0$, so $E[h_i] = 0$ | 1 |
| 2 | cross terms vanish: $E[\xi_{u,i}\xi_{t,i}] = 0$ for $u \ne t$ | 1 |
| 3 | sequence Fisher = token-sum Fisher, $F_i = E[\sum_t f_i(s_t)]$ | 1 |
| 4 | centered form = pairwise form; a uniform logit shift changes nothing | 2 |
| 5 | $f/f^{unif} = \kappa(s)\,\alpha_i(s)$: concentration times alignment | 3 |
| 6 | $E[A h_i]$ = autograd of the exact $E[R]$ | 4 |
| 7 | $G_i = \mathrm{Cov}(A, h_i)$ and $\lvert G_i \rvert \le \mathrm{std}(A)\sqrt{F_i}$ | 4 |
| 8 | top-$q$ overlap of $\lvert G \rvert$ and $F$: a diagnostic set by two spreads (info) | 4 |

The table's `C[u,t]` is `cross_terms`, `rho(s)` the reach, `mu` the sampler; rows marked
`info` report a number and grade nothing.
"""),
    code("""
rows = exact_checks(r)
print(compact_table(rows))"""),
    md(r"""
Off-policy too. `gpt2_offpolicy` has two blocks and no EOS, and draws its responses at
temperature 1.5 (the sampler $\mu$ of lesson 5). The centered stream (score centered under
$\mu$) must satisfy every identity; the raw stream must not have mean zero, and a constant
added to its advantage must eventually break the bound:
"""),
    code("""
off_task = load_config("gpt2_offpolicy")
r_off = exact(off_task, progress=False)
print(f"gpt2_offpolicy: {off_task.model.spec.n_layer} blocks, "
      f"P = {off_task.model.num_params}, {r_off.n_responses} responses")
print(f"sampler {off_task.sampler.to_json()}")
rows_off = exact_checks(r_off)
print(compact_table([row for row in rows_off if row.stream != "policy"]))

summary = {"default (MLP)": exact_checks(r_mlp),
           "gpt2_small": rows, "gpt2_offpolicy": rows_off}
for name, rs in summary.items():
    graded = [row for row in rs if row.kind in ("equal", "zero")]
    print(f"{name:>15}: {len(graded)} exact rows, largest value "
          f"{max(row.value for row in graded):.1e}")"""),
    md(r"""
The same identities hold to rounding on the transformer as on the MLP, on- and off-policy.
That is the first claim, checked.

## Where the Fisher sits: parameter groups

The identities say how the Fisher adds up, not where it lands. Group the parameters by their
names in `layout()`:

| group | GPT-2 blocks | MLP blocks (lessons 0–6) |
|---|---|---|
| embeddings | `wte` (also the tied output layer), `wpe` | `E` |
| attention | `attn.c_attn`, `attn.c_proj` | — |
| MLP | `mlp.c_fc`, `mlp.c_proj` | `W1`, `b1` |
| LayerNorm | `ln_1`, `ln_2`, `ln_f` | — |
| output layer | — (it is `wte`, counted with the embeddings) | `W2`, `b2` |

`W1`, `b1` is the MLP model's hidden layer, the counterpart of `mlp.c_fc`. `W2`, `b2` map the
hidden units straight to the logits: that is an output layer, the role `wte` plays at the end
of GPT-2, so they get a group of their own rather than being called "MLP".

The two models differ in size and in `init_scale` (0.5 for the GPT-2, 1 for the MLP), so raw
Fisher values are not comparable. Two measures are: each group's **share of the total Fisher**
$\sum_i F_i$ beside its **share of the parameters**, and their ratio, the group's **mean Fisher
per parameter relative to the model's mean**. A third model separates architecture from
initialisation: `gpt2_small` with GPT-2's own LayerNorm initialisation (every gain 1, every
bias 0) instead of the shipped random draw.
"""),
    code("""
GROUPS = ["embeddings", "attention", "MLP", "LayerNorm", "output layer"]
WHERE = {"wte": "embeddings", "wpe": "embeddings", "E": "embeddings",
         "attn": "attention", "mlp": "MLP", "W1": "MLP", "b1": "MLP",
         "ln_1": "LayerNorm", "ln_2": "LayerNorm", "ln_f": "LayerNorm",
         "W2": "output layer", "b2": "output layer"}

# "transformer.h.0.attn.c_attn.bias" -> "attention"
def group_of(name):
    return next(WHERE[part] for part in name.split(".") if part in WHERE)

# GPT-2's LayerNorm init: gain 1, bias 0
ln_init = task.theta.copy()
for name, shape, offset in model.layout():
    if group_of(name) == "LayerNorm":
        gain = 1.0 if name.endswith("weight") else 0.0
        ln_init[offset:offset + int(np.prod(shape))] = gain
models = {"MLP (default)": (mlp_task, r_mlp), "GPT-2 (gpt2_small)": (task, r),
          "GPT-2, LayerNorm gain 1, bias 0": (task.with_(theta=ln_init), None)}
share_F, share_P, mean_F = {}, {}, {}
for label, (t, res) in models.items():
    Fm = (res if res is not None else exact(t, progress=False)).sequence_fisher  # (P,)
    per = {g: [0.0, 0] for g in GROUPS}
    for name, shape, offset in t.model.layout():
        size = int(np.prod(shape))
        per[group_of(name)][0] += Fm[offset:offset + size].sum()
        per[group_of(name)][1] += size
    share_F[label] = np.array([per[g][0] for g in GROUPS]) / Fm.sum()          # (5,)
    share_P[label] = np.array([per[g][1] for g in GROUPS]) / Fm.size           # (5,)
    mean_F[label] = np.array([per[g][0] / max(per[g][1], 1) for g in GROUPS])  # (5,)"""),
    code("""
short = {"MLP (default)": "MLP", "GPT-2 (gpt2_small)": "GPT-2",
         "GPT-2, LayerNorm gain 1, bias 0": "GPT-2, LN 1/0"}
print("share of F / share of parameters (- : no such group)")
print(f"{'':>14}" + "".join(f"{g:>14}" for g in GROUPS))
for label in models:
    cells = [f"{f:.0%} / {p:.0%}" if p else "-"
             for f, p in zip(share_F[label], share_P[label])]
    print(f"{short[label]:>14}" + "".join(f"{c:>14}" for c in cells))"""),
    code("""
COLORS = dict(zip(models, ("tab:gray", "tab:purple", "tab:cyan")))
x = np.arange(len(GROUPS))
fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
for k, label in enumerate(models):
    per_param = share_F[label] / np.maximum(share_P[label], 1e-300)
    ratio = np.where(share_P[label] > 0, per_param, np.nan)
    for ax, y in zip(axes, (100 * share_F[label], 100 * share_P[label], ratio)):
        ax.bar(x + (k - 1) * 0.27, y, width=0.27, label=label, color=COLORS[label])
titles = ("share of the total Fisher (%)", "share of the parameters (%)",
          "mean F per parameter / the model's mean")
for ax, title in zip(axes, titles):
    ax.set_xticks(x, GROUPS, rotation=25, ha="right", rotation_mode="anchor")
    ax.set_title(title)
axes[2].set_yscale("log")
axes[2].axhline(1.0, color="k", lw=0.8, ls="--")
fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncols=3)
plt.show()"""),
    code("""
sF, sP = share_F["GPT-2 (gpt2_small)"], share_P["GPT-2 (gpt2_small)"]
inner = [GROUPS.index("attention"), GROUPS.index("MLP")]
outer = [0, GROUPS.index("LayerNorm")]
blocks_F = model.unpack(r.sequence_fisher)                # name -> Fisher of that block
ln_f = (sum(v.sum() for n, v in blocks_F.items() if "ln_f" in n)
        / r.sequence_fisher.sum())
print(f"gpt2_small: attention + MLP hold {sP[inner].sum():.0%} of the parameters and "
      f"{sF[inner].sum():.0%} of the Fisher;")
print(f"embeddings + LayerNorm hold {sP[outer].sum():.0%} and {sF[outer].sum():.0%} "
      f"(ln_f alone: {ln_f:.0%})")
gains = np.concatenate([v for n, v in model.unpack(task.theta).items()
                        if "ln_" in n and n.endswith("weight")])
print(f"the shipped LayerNorm gains: {gains.size} values from {gains.min():.2f} to "
      f"{gains.max():.2f},")
print(f"  {(gains < 0).sum()} negative, {(np.abs(gains) < 0.1).sum()} within 0.1 of 0")
hf = share_F["GPT-2, LayerNorm gain 1, bias 0"]
print(f"attention's share of F: {sF[1]:.1%} as shipped, "
      f"{hf[1]:.1%} with LayerNorm gain 1, bias 0")"""),
    md(r"""
Read the table and the bars together (no bar: the model has no such group).

* **In both architectures the embeddings carry more Fisher per parameter than average.** In
  the GPT-2, part of that is the tied head: `wte` is also the output layer. The EOS row shows
  it (below): in the MLP the embedding of EOS never enters a window and has $F = 0$; in the
  GPT-2 the same row is EOS's output vector, so it has Fisher although EOS is never read.
* **As shipped, the GPT-2's Fisher sits next to the logits**: the final LayerNorm `ln_f` and
  the embeddings hold most of it, while attention and the MLP block, most of the parameters,
  hold little.
* **That split is a property of this initialisation, not of the architecture.** With
  LayerNorm gains 1 and biases 0 (GPT-2's own initialisation), attention's share grows more
  than five times over. The shipped draw gives the LayerNorm gains random values, some near 0
  and some negative (printed above), and every path from an inner parameter to the logits
  passes through such gains.

What the toy does **not** show: how a *trained* transformer's Fisher splits across its
groups. The split moves with the initialisation, the width, the depth and the reward; a
one-block, width-8 model at random weights cannot stand in for a trained GPT-2. What holds at
any size and after any training is structural: the identities above, and exact zeros, like
the next one.
"""),
    code("""
eos_mlp = mlp_task.model.unpack(r_mlp.sequence_fisher)["E"][0]          # (d,) F of E[0]
# (d,) F of wte[0]
eos_gpt2 = blocks_F["transformer.wte.weight"][0]
print("F of the EOS row (token 0):")
print("  MLP E[0]     =", eos_mlp)
print("  GPT-2 wte[0] =", np.round(eos_gpt2, 4))"""),
    md(r"""
## A parameter no logit feels: the key bias

In a block, `c_attn` reads $Y = \mathrm{LN}_1(X)$, the residual stream $X$ after the first
LayerNorm, and computes $[Q\ K\ V'] = Y W_{\mathrm{attn}} + b_{\mathrm{attn}}$: queries, keys
and values ($V'$, to keep $V$ for the vocabulary). Its bias has three parts, $b_Q$, $b_K$ and
$b_{V'}$, $d$ numbers each. A head of width $d_h = d / (\text{number of heads})$ scores query
position $t$ against each earlier key position $u$ and takes a softmax over $u$. Predict the
key bias's Fisher before the derivation:
"""),
    *quiz("key-bias"),
    md(r"""
With $K^0_u$ the key without its bias, the score is

$$S_{tu} = \frac{Q_t \cdot (K^0_u + b_K)}{\sqrt{d_h}} = \frac{Q_t \cdot K^0_u}{\sqrt{d_h}}
+ \underbrace{\frac{Q_t \cdot b_K}{\sqrt{d_h}}}_{\text{the same for every } u}.$$

The attention weights are a softmax over $u$, and a softmax does not change when all its
inputs shift by one number. So $b_K$ changes no attention weight, no output, no logit: its
sensitivities $j_{i,a}$ are zero at every state and its Fisher is zero, at any parameter
values. The query bias is different: $b_Q \cdot K^0_u$ changes with $u$. Three routes: the
exact Fisher, autograd's sensitivities, and a finite change of $b_K$ with no derivative at
all, at the shipped $\theta$ and at an unrelated random one:
"""),
    code("""
from fisher_ref.teaching.views import state_sensitivities

d = model.spec.embed_dim
layout = {n: (s, o) for n, s, o in model.layout()}
(n3,), off = layout["transformer.h.0.attn.c_attn.bias"]
parts = {"query": off + np.arange(d), "key": off + d + np.arange(d),
         "value": off + 2 * d + np.arange(d)}
F = r.sequence_fisher                                     # (P,)
J = state_sensitivities(task, r.states)                   # (N, P, V)
for part, idx in parts.items():
    print(f"{part:>5} bias: max F = {F[idx].max():.1e} "
          f"(largest F of all {F.max():.2f}),")
    print(f"{'':>12}max |j| over states and tokens = {np.abs(J[:, idx]).max():.1e}")"""),
    code("""
toks = r.states["tokens"]
# (N, n_positions) every state's input
W = model.windows(toks, (toks >= 0).sum(axis=1))
rng = np.random.default_rng(0)
thetas = {"shipped theta": task.theta,
          "random theta": 2.0 * rng.standard_normal(model.num_params)}
moves = {}
for label, theta in thetas.items():
    z = model.logits(theta, W)                            # (N, V)
    for part in ("key", "query"):
        moved = theta.copy()
        moved[parts[part]] += rng.standard_normal(d)      # a change of size about 1
        moves[label, part] = np.abs(model.logits(moved, W) - z).max() / np.abs(z).max()
        print(f"{label:>13}: b_{part[0].upper()} += noise moves the logits by "
              f"{moves[label, part]:.1e} of the largest |logit|")"""),
    code("""
fig, ax = plt.subplots(figsize=(8, 3.4), constrained_layout=True)
for (part, idx), color in zip(parts.items(), ("tab:blue", "tab:red", "tab:green")):
    ax.bar(idx - off, np.maximum(F[idx], 1e-40), color=color, label=f"{part} bias")
ax.axhline(1e-24 * F.max(), color="k", ls=":",
           label="rounding level ($10^{-24}$ max F)")
ax.set_yscale("log")
ax.set_xlabel("entry of c_attn.bias")
ax.set_ylabel(r"$F_i$")
ax.set_title("The key bias has no Fisher: softmax ignores a shift shared by all keys")
ax.legend(fontsize=8)
plt.show()"""),
    md(r"""
The key bias's Fisher sits more than 24 orders of magnitude below the largest (the dotted
line), where float64 rounding of a sum that is exactly zero leaves it. (Not all of $K$ is
blind: the key *weights* multiply $Y_u$, which differs from position to position; an exercise
below asks for them.) `gpt2_small` also has parameters with $F_i = 0$ exactly, for a plainer
reason: rows of the position embedding `wpe` at positions no input reaches (another exercise
asks which).
"""),
    md(r"""
## The gradient and its bound

As in lesson 4: the reward counts the token 2s in a response, the baseline is 0, and every
parameter must satisfy $|G_i| \le \mathrm{std}(A)\sqrt{F_i}$. Each dot is one parameter of the
GPT-2, coloured by group, with the diagonal where the bound is reached; parameters whose
Fisher is at rounding level (the key bias, the unused `wpe` rows) are left out. On the right,
how much of its bound each parameter uses, $|\mathrm{corr}(A, h_i)|$, for the GPT-2 and for
the MLP.
"""),
    code("""
cap, G = r.bound, np.abs(r.gradient)                      # (P,) each
live = F > 1e-24 * F.max()
wpe_shape, wpe_off = {n: (s, o) for n, s, o in model.layout()}["transformer.wpe.weight"]
unused_wpe = wpe_off + np.flatnonzero(F[wpe_off:wpe_off + int(np.prod(wpe_shape))] == 0)
group = np.empty(model.num_params, dtype=object)
for name, shape, offset in model.layout():
    group[offset:offset + int(np.prod(shape))] = group_of(name)"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
for g in GROUPS[:4]:
    at = live & (group == g)
    axes[0].loglog(cap[at], np.maximum(G[at], 1e-300), ".", alpha=0.6, label=g)
lo, hi = cap[live].min(), cap[live].max()
axes[0].loglog([lo, hi], [lo, hi], "k-", label=r"$|G_i| = \\mathrm{cap}_i$")
axes[0].set_ylim(max(G[live & (G > 0)].min() / 3, lo / 1e3), hi * 2)
axes[0].set_xlabel(r"$\\mathrm{cap}_i = \\mathrm{std}(A)\\,\\sqrt{F_i}$")
axes[0].set_ylabel(r"$|G_i|$")
axes[0].set_title(f"gpt2_small: each |G| under its bound ({live.sum()} parameters)")
axes[0].legend(fontsize=8)
bins = np.linspace(0, 1, 26)
axes[1].hist(r.correlation[live], bins=bins, density=True, alpha=0.6,
             label="GPT-2 (gpt2_small)", color=COLORS["GPT-2 (gpt2_small)"])
axes[1].hist(r_mlp.correlation[r_mlp.bound > 0], bins=bins, density=True, alpha=0.6,
             label="MLP (default)", color=COLORS["MLP (default)"])
axes[1].set_xlabel(r"$|\\mathrm{corr}(A, h_i)| = |G_i| / \\mathrm{cap}_i$")
axes[1].set_ylabel("density of parameters")
axes[1].set_title("How much of the bound each parameter uses")
axes[1].legend(fontsize=8)
plt.show()
print(f"left out (F at rounding level): {(~live).sum()} parameters; "
      f"largest |G| / bound: {r.correlation.max():.3f}")
print(f"median |corr|: GPT-2 {np.median(r.correlation[live]):.2f}, "
      f"MLP {np.median(r_mlp.correlation[r_mlp.bound > 0]):.2f}")"""),
    md(r"""
With 1,000 parameters, the top 1% is 10 of them, enough for lesson 4's question: how many of
the 10 parameters with the largest $|G_i|$ are among the 10 with the largest $F_i$?
"""),
    code("""
from scipy.stats import hypergeom
p_values = []
print("p: the chance that a random set of as many parameters shares as many")
for q, n, o, rnd in r.topk_overlap((0.01, 0.05, 0.1)):
    hits = round(o * n)
    # P(random set >= hits)
    p_values.append(hypergeom.sf(hits - 1, model.num_params, n, n))
    print(f"top {100 * q:3.0f}% ({n:3d} params): {hits:3d} shared = {o:5.0%}, random "
          f"{rnd:4.0%}, p = {p_values[-1]:.1e}")"""),
    md(r"""
The bound holds for every parameter of the transformer, exactly as for the MLP: it is
Cauchy–Schwarz on $G_i = \mathrm{Cov}(A, h_i)$ and $F_i = \mathrm{Var}(h_i)$, nothing about the
layers. And as in lesson 4, a large Fisher is necessary for a large gradient coordinate but not
sufficient: the top sets overlap far beyond chance, not completely.

## What this toy shows, and what it does not

**It shows**, exactly: every identity of the earlier lessons holds for a GPT-2 with attention,
LayerNorm and a tied head, on- and off-policy, because none of them depends on how the logits
are computed; the Fisher bound caps every one of its gradient coordinates; and structural
zeros appear where the architecture makes a parameter invisible to the logits (the key bias,
at any parameter values) or where no input reaches it (unused positions).

**It does not show** how a trained transformer's Fisher divides among embeddings, attention,
MLP and LayerNorm. On this model that split changes several-fold with the LayerNorm
initialisation alone; width, depth, training and the reward would move it too.
"""),
    checks("""
assert all(a == b for a, b in same.values()) and mlp_task.baseline == task.baseline
assert all(row.passed for row in rows) and all(row.passed for row in rows_off)
assert (gains < 0).any() and (np.abs(gains) < 0.1).any()
assert sF[inner].sum() < 0.2 < 0.8 < sP[inner].sum() and sF[0] + ln_f > 0.5
assert hf[1] > 5 * sF[1]                                  # attention's share, LN gain 1
assert all(share_F[label][0] > share_P[label][0] for label in models)   # embeddings
assert np.all(eos_mlp == 0) and np.all(eos_gpt2 > 0)      # the EOS row
assert F[parts["key"]].max() <= 1e-24 * F.max() < F[parts["query"]].min()
assert max(moves[label, "key"] for label in thetas) <= 1e-12
assert min(moves[label, "query"] for label in thetas) > 1e-6
assert set(np.flatnonzero(~live)) == set(parts["key"]) | set(unused_wpe)   # left out
assert np.all(G <= cap * (1 + 1e-10) + 1e-12 * G.max())  # the bound, every parameter
assert max(p_values) < 1e-6                               # far more than chance"""),
    *exercise("key-weight-slice"),
    *exercise("attention-proj-share"),
    *exercise("unused-positions"),
    footer(STEM, [
        "The identities (zero-mean score, vanishing cross terms, $F = E[\\sum_t f]$, gradient "
        "as covariance, the bound) need only a softmax at the end: they hold for attention, "
        "on- and off-policy, to rounding.",
        "Group parameters by their `layout()` names and compare shares of $F$ with shares of "
        "parameters; on this toy where the Fisher sits depends on the initialisation, so it "
        "says nothing about a trained model's split.",
        "An attention key bias shifts all scores of a query alike, and softmax ignores that "
        "shift: its Fisher and gradient are zero at any parameter values.",
    ]),
]
