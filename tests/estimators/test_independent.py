"""expected_loss_gradient against a brute force that shares no code with the package.

Everything here is rebuilt from the documents alone: the MLP window model's forward
(docs/theory.md section 4.1: BOS-padded window, ``tanh(e W1 + b1) W2 + b2``, the flat
layout E, W1, b1, W2, b2), the temperature and perturbed samplers (section 6), the
responses (ending at EOS = 0 or at ``max_len``), the ``count`` reward and the batch of
issue 18 (a plain dataclass of its own, not ``LossBatch``). Every ordered group of
``G`` responses is listed, each group's loss is differentiated with respect to
``theta`` by torch autograd through that forward, and the mean, the variance over one
group draw and the sequence-KL gradient are held to the package at 1e-10.

The losses are written against the documented batch fields only (none is a preset):
DAPO's clipped ratio at the first step, position weights within the group, a
full-vocabulary KL and an entropy bonus through ``logp_all``, a loss reading the
sampler's whole distribution, the lengths, the tokens and the prompt index.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from fisher_ref import task_from_json
from fisher_ref.estimators import expected_loss_gradient

RTOL = 1e-10


# ---------------------------------------------------------------- the task, by hand

@dataclass
class Spec:
    V: int
    k: int
    d: int
    H: int
    eos: bool
    seed: int
    prompts: list
    weights: list
    T: int
    token: int  # count reward
    sampler: dict | None = None
    reference: dict | None = None

    def json(self):
        spec = {"model": {"arch": "mlp_window", "vocab_size": self.V, "context": self.k,
                          "embed_dim": self.d, "hidden": self.H, "eos": self.eos,
                          "init_seed": self.seed, "init_scale": 1.0},
                "prompts": self.prompts, "prompt_weights": self.weights, "max_len": self.T,
                "reward": {"name": "count", "token": self.token}}
        if self.sampler is not None:
            spec["sampler"] = self.sampler
        if self.reference is not None:
            spec["reference"] = self.reference
        return spec

    @property
    def P(self):
        V, k, d, H = self.V, self.k, self.d, self.H
        return (V + 1) * d + k * d * H + H + H * V + V

    def theta(self):
        return np.random.default_rng(self.seed).standard_normal(self.P)


def mlp_logits(s, theta, window):
    """Logits ``(V,)`` of one window (a tuple of k ids, BOS = V), theory.md 4.1."""
    V, k, d, H = s.V, s.k, s.d, s.H
    o = 0

    def take(n, shape):
        nonlocal o
        out = theta[o:o + n].reshape(shape)
        o += n
        return out
    E = take((V + 1) * d, (V + 1, d))
    W1 = take(k * d * H, (k * d, H))
    b1 = take(H, (H,))
    W2 = take(H * V, (H, V))
    b2 = take(V, (V,))
    e = torch.cat([E[c] for c in window]) if k else torch.zeros(0, dtype=theta.dtype)
    return torch.tanh(e @ W1 + b1) @ W2 + b2


def window_of(s, state):
    last = list(state)[-s.k:] if s.k else []
    return tuple([s.V] * (s.k - len(last)) + last)


def responses(s):
    out = []
    for n in range(1, s.T + 1):
        for y in itertools.product(range(s.V), repeat=n):
            if s.eos and 0 in y[:-1]:
                continue
            if n < s.T and not (s.eos and y[-1] == 0):
                continue
            out.append(y)
    return out


def dist_logits(s, dist, theta, window):
    """Logits of a sampler / reference spec (theory.md section 6), no gradient."""
    if dist["kind"] == "temperature":
        return mlp_logits(s, theta, window).detach() / dist["temperature"]
    if dist["kind"] == "perturbed":
        eps = np.random.default_rng(dist.get("seed", 0)).standard_normal(s.P)
        return mlp_logits(s, theta.detach() + dist["scale"] * torch.tensor(eps), window)
    raise AssertionError(dist)


@dataclass
class Batch:
    logp: torch.Tensor
    old_logp: torch.Tensor
    sampler_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    mask: torch.Tensor
    rewards: torch.Tensor
    lengths: torch.Tensor
    tokens: torch.Tensor
    prompt: int
    logp_all: torch.Tensor
    sampler_logp_all: torch.Tensor
    ref_logp_all: torch.Tensor | None


def per_response(s, theta, prompt, y):
    """``(T, V)`` log-probabilities of the policy (in theta's graph), the sampler and the
    reference at each position of ``y`` (rows past the end 0)."""
    rows = {"p": [], "mu": [], "ref": []}
    for t in range(len(y)):
        w = window_of(s, list(prompt) + list(y[:t]))
        lp = torch.log_softmax(mlp_logits(s, theta, w), -1)
        rows["p"].append(lp)
        rows["mu"].append(lp.detach() if s.sampler is None else
                          torch.log_softmax(dist_logits(s, s.sampler, theta, w), -1))
        if s.reference is not None:
            rows["ref"].append(torch.log_softmax(dist_logits(s, s.reference, theta, w), -1))
    pad = [torch.zeros(s.V, dtype=torch.float64)] * (s.T - len(y))
    return {key: torch.stack(v + pad) if v else None for key, v in rows.items()}


def make_batch(s, parts, ys, x):
    B = len(ys)
    tokens = torch.full((B, s.T), -1, dtype=torch.int64)
    for i, y in enumerate(ys):
        tokens[i, :len(y)] = torch.tensor(y)
    mask = tokens >= 0
    lpa = torch.stack([p["p"] for p in parts])
    spa = torch.stack([p["mu"] for p in parts])
    rpa = None if s.reference is None else torch.stack([p["ref"] for p in parts])

    def at(a):
        if a is None:
            return None
        g = torch.stack([torch.stack([a[i, t, tokens[i, t]] if mask[i, t] else
                                      torch.zeros((), dtype=torch.float64)
                                      for t in range(s.T)]) for i in range(B)])
        return g
    logp = at(lpa)
    R = torch.tensor([float(sum(1 for t in y if t == s.token)) for y in ys],
                     dtype=torch.float64)
    return Batch(logp=logp, old_logp=logp.detach(), sampler_logp=at(spa), ref_logp=at(rpa),
                 mask=mask, rewards=R, lengths=mask.sum(1), tokens=tokens, prompt=x,
                 logp_all=lpa, sampler_logp_all=spa, ref_logp_all=rpa)


def brute(s, loss, G):
    """``(mean, variance, kl_gradient)`` by listing every ordered group."""
    theta = torch.tensor(s.theta(), requires_grad=True)
    ys = responses(s)
    grads, weights = [], []
    kl = torch.zeros((), dtype=torch.float64)
    for x, (prompt, wx) in enumerate(zip(s.prompts, s.weights)):
        if wx == 0:
            continue
        parts = [per_response(s, theta, prompt, y) for y in ys]
        mu = [math.exp(sum(float(p["mu"][t, y[t]]) for t in range(len(y))))
              for p, y in zip(parts, ys)]
        for g in itertools.product(range(len(ys)), repeat=G):
            w = wx * math.prod(mu[i] for i in g)
            L = loss(make_batch(s, [parts[i] for i in g], [ys[i] for i in g], x))
            d = torch.autograd.grad(L, theta, retain_graph=True, allow_unused=True)[0]
            grads.append(np.zeros(s.P) if d is None else d.numpy())
            weights.append(w)
        if s.reference is not None:
            for p, y in zip(parts, ys):
                lp = sum(p["p"][t, y[t]] for t in range(len(y)))
                lr = sum(p["ref"][t, y[t]] for t in range(len(y)))
                kl = kl + wx * torch.exp(lp) * (lp - lr)
    g, w = np.array(grads), np.array(weights)
    assert abs(w.sum() - 1) < 1e-12
    mean = w @ g
    var = w @ (g - mean) ** 2
    klg = None if s.reference is None else torch.autograd.grad(kl, theta)[0].numpy()
    return mean, var, klg


# ---------------------------------------------------------------- losses, by hand

def _adv_grpo(R):
    if R.shape[0] < 2:
        return R - 0.5
    return (R - R.mean()) / (R.std() + 1e-6)


def dapo_clipped(b):
    """DAPO at the first step: clip-higher ratio against old_logp, token-mean."""
    A = _adv_grpo(b.rewards)[:, None]
    r = torch.exp(b.logp - b.old_logp)
    pg = -torch.minimum(r * A, torch.clamp(r, 1 - 0.2, 1 + 0.28) * A)
    m = b.mask.double()
    return (pg * m).sum() / m.sum()


def position_weighted(b):
    """Responses weighted by their slot in the group (not symmetric)."""
    B = b.logp.shape[0]
    w = torch.linspace(1.0, 2.0, B, dtype=torch.float64) if B > 1 else torch.ones(1).double()
    seq = (b.logp * b.mask).sum(1)
    return -(w * (b.rewards - 0.7) * seq).sum() / B + 0.05 * b.logp[-1].pow(2).sum()


def full_vocab_kl(b):
    """KL(p || ref) over the whole vocabulary at every real position, summed."""
    p = b.logp_all.exp()
    kl = (p * (b.logp_all - b.ref_logp_all)).sum(-1)
    return 0.5 * (kl * b.mask).sum() / b.logp.shape[0]


def entropy_and_sampler_kl(b):
    """An entropy bonus and KL(mu || p) through the sampler's distribution, masked."""
    p = b.logp_all.exp()
    ent = -(p * b.logp_all).sum(-1)
    kl_mu = (b.sampler_logp_all.exp() * (b.sampler_logp_all - b.logp_all)).sum(-1)
    m = b.mask.double()
    return ((-0.1 * ent + kl_mu) * m).sum() / m.sum() - (b.rewards * (b.logp * m).sum(1)).mean()


def sequence_is_lengths(b):
    """Sequence IS against the sampler, divided by a constant max length."""
    rho = torch.exp(((b.logp - b.sampler_logp) * b.mask).sum(1)).detach()
    return -(rho * b.rewards * (b.logp * b.mask).sum(1)).mean() / b.mask.shape[1]


def reads_tokens_lengths_prompt(b):
    """Per-token weights from the token ids, the lengths and the prompt index."""
    wt = torch.where(b.tokens == 1, 2.0, 1.0).double() * b.mask
    scale = 1.0 + 0.25 * b.prompt
    return -scale * ((b.rewards / b.lengths)[:, None] * wt * b.logp).sum() \
        + 0.1 * (b.lengths.double()[:, None] * b.logp).sum()


def k3_in_loss_with_rho(b):
    d = b.ref_logp - b.logp
    rho = torch.exp(b.logp - b.old_logp)
    return (rho * (torch.exp(d) - 1 - d) * b.mask).sum() / b.mask.sum()


def prefix_is_rloo(b):
    B = b.logp.shape[0]
    R = b.rewards
    A = (R - (R.sum() - R) / (B - 1)) if B > 1 else R
    lr = ((b.logp - b.sampler_logp) * b.mask).detach()
    w = torch.exp(torch.cumsum(lr, 1))
    return -(w * A[:, None] * b.logp * b.mask).sum() / B


def unvectorisable(b):
    """A data-dependent branch and .item() (trainers' loss code does this)."""
    if float(b.rewards.sum().item()) > 0.5:
        return -(b.rewards * (b.logp * b.mask).sum(1)).mean()
    return (b.logp * b.mask).sum() * 0.3


def boolean_indexed(b):
    """Token-mean through ``logp[mask]`` (a dynamic shape: vmap cannot take it)."""
    A = (b.rewards - b.rewards.mean())[:, None].expand_as(b.logp)
    return -(A[b.mask] * b.logp[b.mask]).sum() / b.mask.sum() + 0.2 * b.logp[b.mask].mean()


# ---------------------------------------------------------------- tasks

def spec(name):
    base = dict(V=3, k=2, d=2, H=3, eos=True, seed=4, prompts=[[1], [2, 1]],
                weights=[0.7, 0.3], T=2, token=1)
    if name == "on":
        return Spec(**base)
    if name == "on_ref":
        return Spec(**base, reference={"kind": "perturbed", "scale": 0.5, "seed": 9})
    if name == "stale":  # off policy, a stale copy, with a reference
        return Spec(**base, sampler={"kind": "perturbed", "scale": 0.3, "seed": 2},
                    reference={"kind": "perturbed", "scale": 0.6, "seed": 11})
    if name == "hot":  # temperature < 1, an empty prompt and one of weight 0, k = 1
        return Spec(**{**base, "k": 1, "prompts": [[], [2], [1]], "weights": [0.5, 0.0, 0.5]},
                    sampler={"kind": "temperature", "temperature": 0.6},
                    reference={"kind": "temperature", "temperature": 1.4})
    if name == "no_eos":  # no EOS: every response has length T; V = 2, T = 3
        return Spec(**{**base, "V": 2, "eos": False, "T": 3, "token": 0, "prompts": [[1], [0, 1]]},
                    sampler={"kind": "temperature", "temperature": 1.8},
                    reference={"kind": "perturbed", "scale": 0.4, "seed": 1})
    raise KeyError(name)


def task_of(s):
    t = task_from_json(s.json())
    np.testing.assert_array_equal(t.theta, s.theta())  # the layout read the same way
    return t


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _close(name, a, b):
    if b is None:
        assert a is None, name
        return
    assert np.linalg.norm(b) > 0 or np.linalg.norm(a) == 0, name
    assert _rel(a, b) <= RTOL, f"{name}: relative error {_rel(a, b):.3g}"


CASES = [
    (dapo_clipped, "stale", 1), (dapo_clipped, "stale", 2), (dapo_clipped, "on_ref", 3),
    (position_weighted, "on", 2), (position_weighted, "stale", 3), (position_weighted, "hot", 2),
    (full_vocab_kl, "on_ref", 1), (full_vocab_kl, "stale", 2), (full_vocab_kl, "no_eos", 2),
    (entropy_and_sampler_kl, "hot", 1), (entropy_and_sampler_kl, "stale", 2),
    (sequence_is_lengths, "stale", 1), (sequence_is_lengths, "no_eos", 2),
    (reads_tokens_lengths_prompt, "hot", 2), (reads_tokens_lengths_prompt, "on", 1),
    (k3_in_loss_with_rho, "stale", 1), (k3_in_loss_with_rho, "hot", 2),
    (prefix_is_rloo, "no_eos", 2), (prefix_is_rloo, "stale", 3),
    (unvectorisable, "stale", 2), (boolean_indexed, "hot", 2), (boolean_indexed, "on_ref", 1),
]


@pytest.mark.parametrize("loss,name,G", CASES,
                         ids=[f"{f.__name__}-{n}-G{G}" for f, n, G in CASES])
def test_mean_variance_kl_against_independent_brute_force(loss, name, G):
    s = spec(name)
    lg = expected_loss_gradient(task_of(s), loss, group_size=G)
    mean, var, klg = brute(s, loss, G)
    _close("mean", lg.mean, mean)
    _close("variance", lg.variance, var)
    _close("kl_gradient", lg.kl_gradient, klg)
    assert lg.n_groups == sum(len(responses(s)) ** G for w in s.weights if w > 0)


@pytest.mark.parametrize("loss", [dapo_clipped, full_vocab_kl])
def test_symmetric_loss_as_multisets_is_the_brute_force(loss):
    s = spec("stale")
    lg = expected_loss_gradient(task_of(s), loss, group_size=3, symmetric=True)
    mean, var, klg = brute(s, loss, 3)
    _close("mean", lg.mean, mean)
    _close("variance", lg.variance, var)
    _close("kl_gradient", lg.kl_gradient, klg)


def test_policy_gradient_is_the_brute_force_of_reinforce():
    """policy_gradient is grad E_p[R]: on policy, the mean of -REINFORCE."""
    s = spec("on_ref")

    def reinforce(b):
        return -(b.rewards * (b.logp * b.mask).sum(1)).mean()
    lg = expected_loss_gradient(task_of(s), reinforce, group_size=1)
    mean, _, _ = brute(s, reinforce, 1)
    _close("policy_gradient", lg.policy_gradient, -mean)
