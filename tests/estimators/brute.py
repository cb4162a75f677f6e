"""An independent brute force for the expected gradient of a loss: every group of
responses listed by ``itertools``, each group's loss differentiated with respect to
``theta`` by torch autograd through the torch twin of the model (no scores, no chain
rule through ``logp_all``, no vmap).

:func:`brute_force_batches` does the same for mini-batches of ``K`` groups: every ordered
tuple of ``K`` (prompt, ordered response tuple) pairs, weighted by the product of their
probabilities (no multisets, no exchangeability), with the old policy, the padding to
the longest response and the large-batch constants rebuilt here."""
from __future__ import annotations

import itertools

import numpy as np
import torch

import cases
from fisher_ref import task_from_json
from fisher_ref.estimators.batch import BatchLimit, LossBatch
from fisher_ref.torch.registry import torch_model

TINY = {"vocab_size": 3, "context": 2, "embed_dim": 2, "hidden": 3, "eos": True,
        "init_seed": 0, "init_scale": 1.0}


def tiny_task(sampler=None, reference=None, eos=True, max_len=2, baseline=0.0, seed=0,
              one_prompt=False, old_policy=None, vocab=3):
    """A tiny MLP task (V = 3, or ``vocab``; two prompts of unequal weight, or one)."""
    prompts, weights = ([[2 % vocab, 1]], [1.0]) if one_prompt else ([[1], [2 % vocab, 1]],
                                                                    [0.6, 0.4])
    spec = {"model": dict(TINY, eos=eos, init_seed=seed, vocab_size=vocab), "prompts": prompts,
            "prompt_weights": weights, "max_len": max_len,
            "reward": {"name": "count", "token": 1}, "baseline": baseline}
    if sampler is not None:
        spec["sampler"] = sampler
    if reference is not None:
        spec["reference"] = reference
    if old_policy is not None:
        spec["old_policy"] = old_policy
    return task_from_json(spec)


def _log_softmax_np(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _per_response(task, adapter, theta, prompt, y):
    """``logp_all (T, V)`` in the graph of ``theta``; sampler and reference ``(T, V)``."""
    m, T, V = task.model, task.max_len, task.model.vocab_size
    states = [tuple(prompt) + tuple(y[:t]) for t in range(len(y))]
    L = max(len(s) for s in states)
    tok = np.full((len(states), max(L, 1)), -1, dtype=np.int64)
    for i, s in enumerate(states):
        tok[i, :len(s)] = s
    W = np.asarray(m.windows(tok, np.array([len(s) for s in states])), dtype=np.int64)
    lp = torch.log_softmax(adapter.logits(theta, torch.tensor(W)), dim=-1)  # (n, V)
    pad = torch.zeros((T - len(y), V), dtype=torch.float64)
    out = {"logp_all": torch.cat([lp, pad])}
    old = getattr(task, "old_policy", None)
    for key, dist in (("sampler", task.sampler), ("ref", getattr(task, "reference", None)),
                      ("old", task.sampler if old == "sampler" else old)):
        if dist is None:
            out[key] = None if key == "ref" or (key == "old" and old is None) \
                else out["logp_all"].detach().clone()
            continue
        z = np.asarray(dist.logits(m, task.theta, W), dtype=float)
        out[key] = torch.cat([torch.tensor(_log_softmax_np(z)), pad])
    return out


def _rows(rows, ys, T, keys):
    """The responses ``rows`` padded to ``T``: each of ``keys`` stacked ``(B, T, V)`` (or
    ``None``), the tokens ``(B, T)``, the mask, and ``at(a)``, the gather of ``a (B, T, V)``
    at the tokens (0 past the end)."""
    stacked = {k: None if rows[0][k] is None else torch.stack([r[k][:T] for r in rows])
               for k in keys}
    tokens = torch.tensor([list(y) + [-1] * (T - len(y)) for y in ys])
    mask = tokens >= 0
    idx = tokens.clamp(min=0)[..., None]

    def at(a):
        return None if a is None else torch.where(mask, a.gather(-1, idx)[..., 0], 0.0)
    return stacked, tokens, mask, at


def _batch(rows, ys, R, T, prompt):
    st, tokens, mask, at = _rows(rows, ys, T, ("logp_all", "sampler", "ref"))
    lpa, spa, rpa = st["logp_all"], st["sampler"], st["ref"]
    logp = at(lpa)
    return LossBatch(logp=logp, old_logp=logp.detach(), sampler_logp=at(spa),
                     ref_logp=at(rpa), mask=mask, rewards=torch.tensor(R, dtype=torch.float64),
                     lengths=mask.sum(1), tokens=tokens, prompt=prompt, logp_all=lpa,
                     sampler_logp_all=spa, ref_logp_all=rpa)


def _covariance(w, g, mean):
    r""":math:`\sum_n w_n (g_n - m)(g_n - m)^T`, one outer product per group (no BLAS
    product of the whole matrix, no merge)."""
    cov = np.zeros((g.shape[1], g.shape[1]))
    for wn, gn in zip(w, g):
        d = gn - mean
        cov += wn * np.outer(d, d)
    return cov


def _drawn_groups(task, adapter, theta, ys, G):
    """Per prompt ``x``: ``(x, rows, drawn)``, its per-response rows and every ordered group
    of ``G`` responses of positive probability as ``(probability, (rows, ys, R, x))``."""
    for x, prompt in enumerate(task.prompts):
        rows = [_per_response(task, adapter, theta, prompt, y) for y in ys]
        R = [task.reward(prompt, list(y)) for y in ys]
        q = [float(np.exp(sum(r["sampler"][t, y[t]].item() for t in range(len(y)))))
             for r, y in zip(rows, ys)]
        drawn = []
        for g in itertools.product(range(len(ys)), repeat=G):
            w = task.prompt_weights[x] * np.prod([q[i] for i in g])
            if w > 0:
                drawn.append((w, ([rows[i] for i in g], [ys[i] for i in g],
                                  [R[i] for i in g], x)))
        yield x, rows, drawn


def brute_force(task, loss, group_size, covariance=False, per_group=False):
    """``(mean, variance, kl_gradient)`` by enumeration of every ordered group, and the
    full covariance ``(P, P)`` last when ``covariance``; with ``per_group`` instead every
    group's gradient ``(N, P)`` and probability ``(N,)``."""
    adapter = torch_model(task.model)
    theta = torch.tensor(task.theta, requires_grad=True)
    V, T, eos = task.model.vocab_size, task.max_len, task.model.eos
    ys = cases.all_responses(V, T, eos)
    grads, weights, kl = [], [], 0.0
    for x, rows, drawn in _drawn_groups(task, adapter, theta, ys, group_size):
        for w, (rows_g, ys_g, R_g, _) in drawn:
            b = _batch(rows_g, ys_g, R_g, T, x)
            (d,) = torch.autograd.grad(loss(b), theta, retain_graph=True, allow_unused=True)
            grads.append(np.zeros(theta.shape) if d is None else d.numpy())
            weights.append(w)
        if rows[0]["ref"] is not None:  # KL(p_seq || ref_seq) as a function of theta
            for r, y in zip(rows, ys):
                lp = sum(r["logp_all"][t, y[t]] for t in range(len(y)))
                lr = sum(r["ref"][t, y[t]] for t in range(len(y)))
                kl = kl + task.prompt_weights[x] * torch.exp(lp) * (lp - lr)
    g, w = np.array(grads), np.array(weights)
    if per_group:
        return g, w
    mean = w @ g
    var = w @ (g - mean) ** 2
    klg = None if isinstance(kl, float) else torch.autograd.grad(kl, theta)[0].numpy()
    if covariance:
        return mean, var, klg, _covariance(w, g, mean)
    return mean, var, klg


def state_kl_gradient(task, direction):
    r""":math:`\nabla_\theta \sum_x w_x \sum_y \mu(y) \sum_t KL_t` with the states' weights
    held fixed: ``direction="forward"`` :math:`KL(ref\|p_\theta)`, ``"reverse"``
    :math:`KL(p_\theta\|ref)` at each state of each response (autograd)."""
    adapter = torch_model(task.model)
    theta = torch.tensor(task.theta, requires_grad=True)
    total = 0.0
    for x, prompt in enumerate(task.prompts):
        for y in cases.all_responses(task.model.vocab_size, task.max_len, task.model.eos):
            r = _per_response(task, adapter, theta, prompt, y)
            n = len(y)
            q = float(np.exp(sum(r["sampler"][t, y[t]].item() for t in range(n))))
            lp, lr = r["logp_all"][:n], r["ref"][:n]
            if direction == "forward":
                kl = (lr.exp() * (lr - lp)).sum()
            else:
                kl = (lp.exp() * (lp - lr)).sum()
            total = total + task.prompt_weights[x] * q * kl
    return torch.autograd.grad(total, theta)[0].numpy()


def _limit(task, ys, G):
    """The large-batch constants by brute force: moments of |y| and R under the sampler."""
    adapter = torch_model(task.model)
    theta = torch.tensor(task.theta)
    n = r1 = r2 = 0.0
    for x, prompt in enumerate(task.prompts):
        for y in ys:
            r = _per_response(task, adapter, theta, prompt, y)
            q = task.prompt_weights[x] * float(np.exp(sum(r["sampler"][t, y[t]].item()
                                                          for t in range(len(y)))))
            R = task.reward(prompt, list(y))
            n, r1, r2 = n + q * len(y), r1 + q * R, r2 + q * R * R
    return {"tokens_per_response": n, "tokens_per_group": G * n, "reward_mean": r1,
            "reward_std": float(np.sqrt(r2 - r1 * r1))}


def _mini_batch(parts, T, K, limit, pad):
    """A LossBatch of the groups ``parts`` [(rows, ys, R, x), ...] in order."""
    rows = [r for p in parts for r in p[0]]
    ys = [y for p in parts for y in p[1]]
    Tb = max(len(y) for y in ys) if pad == "longest" else T
    st, tokens, mask, at = _rows(rows, ys, Tb, ("logp_all", "sampler", "ref", "old"))
    lpa, spa, rpa, opa = st["logp_all"], st["sampler"], st["ref"], st["old"]  # (K G, Tb, V)
    logp = at(lpa)
    G = len(parts[0][1])
    prompts = torch.tensor([p[3] for p in parts for _ in range(G)])
    groups = torch.tensor([k for k in range(K) for _ in range(G)])
    lim = BatchLimit(**limit, group_size=G)
    return LossBatch(logp=logp, old_logp=logp.detach() if opa is None else at(opa),
                     sampler_logp=at(spa), ref_logp=at(rpa), mask=mask,
                     rewards=torch.tensor([R for p in parts for R in p[2]],
                                          dtype=torch.float64),
                     lengths=mask.sum(1), tokens=tokens, prompt=parts[0][3] if K == 1 else None,
                     logp_all=lpa, sampler_logp_all=spa, ref_logp_all=rpa, old_logp_all=opa,
                     prompts=prompts, groups=groups, groups_per_batch=K, limit=lim)


def brute_force_batches(task, loss, group_size, groups_per_batch, pad="max_len",
                        covariance=False):
    """``(mean, variance, limit)`` over every ordered tuple of ``K`` groups (a group: a
    prompt and an ordered tuple of ``G`` responses), autograd per batch; the full
    covariance ``(P, P)`` last when ``covariance``."""
    adapter = torch_model(task.model)
    theta = torch.tensor(task.theta, requires_grad=True)
    V, T, eos = task.model.vocab_size, task.max_len, task.model.eos
    ys = cases.all_responses(V, T, eos)
    G, K = group_size, groups_per_batch
    limit = _limit(task, ys, G)
    units = [u for _, _, drawn in _drawn_groups(task, adapter, theta, ys, G) for u in drawn]
    grads, weights = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: more threads only contend
    try:
        for combo in itertools.product(units, repeat=K):
            b = _mini_batch([c[1] for c in combo], T, K, limit, pad)
            (d,) = torch.autograd.grad(loss(b), theta, retain_graph=True, allow_unused=True)
            grads.append(np.zeros(theta.shape) if d is None else d.numpy())
            weights.append(np.prod([c[0] for c in combo]))
    finally:
        torch.set_num_threads(threads)
    g, w = np.array(grads), np.array(weights)
    mean = w @ g
    if covariance:
        return mean, w @ (g - mean) ** 2, limit, _covariance(w, g, mean)
    return mean, w @ (g - mean) ** 2, limit
