r"""Exact enumeration in torch, level by level on the device.

All states of one depth are processed at once: logits, probabilities and the
sensitivities ``j`` (``vmap(jacrev)``) of the whole level, then every child
``b*V + a`` (state ``b`` followed by token ``a``) inherits its parent's score
history with :math:`\xi_t = j_{\cdot,a} - c(s_t)` written in slot ``t``.
Children that end (EOS, or ``max_len`` tokens) are complete responses; the
others form the next level. Rewards come from
:func:`fisher_ref.rewards.evaluate_reward` on the enumerated responses.

Streams as in :mod:`fisher_ref.exact`: ``"policy"`` (drawn from ``p``,
centered at :math:`\bar j_p`); with a sampler ``"raw"`` (from ``mu``, centered
at :math:`\bar j_p`) and ``"centered"`` (from ``mu``, centered at
:math:`\bar j_\mu`). For a stream with response weights ``w(y)`` and state
reach :math:`\pi_w(s)`:

.. math::
    E[h] = \sum_y w\,h,\quad F = \sum_y w\,h^2,\quad C_{ut} = \sum_y w\,\xi_u\xi_t,\quad
    \textstyle\sum_s \pi_w(s)\,m(s),\quad G = \sum_y w\,(R-b)\,h,\quad
    \mathrm{Cov}(A,h) = E[Rh] - E[R]E[h],

the bound :math:`\mathrm{std}(A)\sqrt F`, the correlation
:math:`|\mathrm{Cov}|/\mathrm{bound}`, and the gradient by torch autograd of
:math:`E[R] = \sum_y w_x \prod_t p(y_t|s_t) R(y)`.
"""
from __future__ import annotations

import numpy as np
import torch

from ..rewards import evaluate_reward
from .model import sampler_logits, state_windows, token_fisher, torch_model

__all__ = ["enumerate_tree", "torch_exact", "STREAM_QUANTITIES"]

STREAM_QUANTITIES = ("score_mean", "sequence_fisher", "token_fisher_sum",
                     "token_fisher_sum_paths", "cross_terms", "gradient", "covariance",
                     "bound", "correlation", "expected_reward", "reward_std",
                     "importance_gradient")


def enumerate_tree(task, device="cpu"):
    """The prefix tree of ``task`` level by level (structure only, no numerics).

    Returns:
        list of ``T`` dicts, one per depth: ``tokens (N, L)`` long ``-1`` padded,
        ``length (N,)``, ``prompt (N,)``; ``term (N*V,)`` bool over children;
        ``rewards`` float64 numpy ``(n_term,)``, ``responses`` list of token lists.
    """
    m, T, V = task.model, task.max_len, task.model.vocab_size
    L = max(len(p) for p in task.prompts) + T
    tokens = torch.full((len(task.prompts), L), -1, dtype=torch.long)
    for i, pr in enumerate(task.prompts):
        tokens[i, :len(pr)] = torch.tensor(pr, dtype=torch.long)
    length = torch.tensor([len(p) for p in task.prompts], dtype=torch.long)
    prompt = torch.arange(len(task.prompts))
    plen = length.clone()
    levels = []
    for depth in range(T):
        n = tokens.shape[0]
        a_tok = torch.arange(V).repeat(n)  # (N*V,)
        ct = tokens.repeat_interleave(V, dim=0)  # (N*V, L)
        cl = length.repeat_interleave(V)
        ct[torch.arange(n * V), cl] = a_tok
        cl = cl + 1
        cp = prompt.repeat_interleave(V)
        term = torch.full((n * V,), depth + 1 == T) | ((a_tok == 0) & bool(m.eos))
        responses = [(int(pi), ct[c, plen[pi]:cl[c]].tolist())
                     for c, pi in zip(term.nonzero().flatten().tolist(), cp[term].tolist())]
        rewards = np.array([evaluate_reward(task.reward, task.prompts[pi], r)
                            for pi, r in responses], dtype=np.float64)
        levels.append({"tokens": tokens.to(device), "length": length.to(device),
                       "prompt": prompt.to(device), "term": term.to(device),
                       "rewards": rewards, "responses": responses})
        keep = ~term
        tokens, length, prompt = ct[keep], cl[keep], cp[keep]
    return levels


def _streams(task):
    if task.sampler is None:
        return [("policy", "p", "p")]
    return [("policy", "p", "p"), ("raw", "q", "p"), ("centered", "q", "q")]


def _cross(w, hist):
    """:math:`C_{ut} = \\sum_y w\\,\\xi_u\\xi_t`, one row ``u`` at a time: ``(T, T, P)``."""
    X = hist * w[:, None, None]  # (M, T, P)
    return torch.stack([(X[:, u, None, :] * hist).sum(0) for u in range(hist.shape[1])])


def _finish(w, wp, R, hist, g, baseline):
    """Stream quantities from response weights ``w (M,)``, policy probs ``wp (M,)``,
    rewards ``R (M,)``, scores ``hist (M, T, P)`` and path sums ``g (M, P)``."""
    h = hist.sum(dim=1)  # (M, P)
    mass = w.sum()
    ER = (w @ R) / mass
    b = ER if baseline == "mean" else torch.as_tensor(float(baseline), dtype=w.dtype,
                                                        device=w.device)
    std_A = torch.clamp((w @ (R * R)) / mass - ER * ER, min=0.0).sqrt()
    Eh, F, Rh = w @ h, w @ (h * h), (w * R) @ h  # (P,) each
    cov = Rh - ER * Eh
    bound = std_A * F.sqrt()
    corr = torch.where(bound > 0, cov.abs() / torch.where(bound > 0, bound, 1.0),
                       torch.zeros_like(bound))
    return {"score_mean": Eh, "sequence_fisher": F, "token_fisher_sum_paths": w @ g,
            "cross_terms": _cross(w, hist),
            "gradient": Rh - b * Eh, "covariance": cov, "bound": bound,
            "correlation": corr, "expected_reward": ER, "reward_std": std_A,
            "baseline": b, "importance_gradient": (wp * R) @ h - b * (wp @ h)}


def torch_exact(task, device="cpu", dtype="float64", levels=None):
    r"""Every quantity of DESIGN §1 for ``task`` by enumeration in torch.

    Args:
        task: a :class:`fisher_ref.tasks.Task` with an MLP model.
        device: torch device.
        dtype: compute dtype of logits and sensitivities (sums in
            :func:`fisher_ref.torch.model.accumulation_dtype`).
        levels: a precomputed :func:`enumerate_tree` (else built here).

    Returns:
        dict: ``streams`` {name: {quantity: float64 numpy}} (``token_fisher_sum``
        and :data:`STREAM_QUANTITIES`), ``gradient_autodiff`` ``(P,)``, ``states``
        (``tokens (N, L-1)``, ``prompt``, ``depth``, ``reach``, ``probs (N, V)``,
        ``token_fisher (N, P)``, ``uniform (N, P)``; sorted by prompt, depth,
        tokens as in fisher_ref) and ``sequences`` (``tokens (M, T)``,
        ``prompt``, ``prob``, ``sampler_prob``, ``reward``; sorted by prompt, tokens);
        ``ranges`` {``"sequence_fisher"``, ``"token_fisher_sum"``: ``(P,)``}, the largest
        :math:`|x(y) - E[x]|` over on-policy responses of :math:`x = h^2` and
        :math:`x = \sum_t f(s_t)` (the bound ``b`` of a Bernstein test).

    Example:
        >>> from fisher_ref import load_config
        >>> out = torch_exact(load_config("default"))
        >>> F, tsum = out["streams"]["policy"]["sequence_fisher"], out["streams"]["policy"]["token_fisher_sum"]
        >>> bool(np.allclose(F, tsum, rtol=1e-10, atol=0))
        True
    """
    tm = torch_model(task.model, device=device, dtype=dtype)
    acc, dev, T, P, V = tm.acc_dtype, tm.device, task.max_len, tm.num_params, tm.vocab_size
    levels = enumerate_tree(task, dev) if levels is None else levels
    th = tm.theta(task.theta)
    th_mu = None if task.sampler is None else tm.theta(task.sampler.params(task.model, task.theta))
    th_grad = th.clone().requires_grad_(True)
    streams = _streams(task)
    S = len(streams)
    w0 = torch.as_tensor(task.prompt_weights, dtype=acc, device=dev)
    reach = {"p": w0, "q": w0.clone()}
    reach_grad = w0.clone()
    hist = torch.zeros((S, len(task.prompts), T, P), dtype=acc, device=dev)
    g = torch.zeros((S, len(task.prompts), P), dtype=acc, device=dev)
    token_sum = torch.zeros((S, P), dtype=acc, device=dev)
    done = {k: [] for k in ("p", "q", "grad", "hist", "g")}
    states = []
    for depth, lv in enumerate(levels):
        n = lv["tokens"].shape[0]
        W = state_windows(lv["tokens"], lv["length"], tm.context, tm.bos)  # (N, k)
        z = tm.logits(th, W)  # (N, V)
        J = tm.sensitivities(th, W).to(acc)  # (N, P, V)
        za = z.to(acc)
        dist = {"p": za.softmax(-1)}  # (N, V)
        dist["q"] = dist["p"] if task.sampler is None else \
            sampler_logits(task.sampler, tm, th, th_mu, W, z).to(acc).softmax(-1)
        jbar = {k: (J * d[:, None, :]).sum(-1) for k, d in dist.items()}  # (N, P)
        xis, ms = [], []
        for s, (name, wname, cname) in enumerate(streams):
            xi = J - jbar[cname][:, :, None]  # (N, P, V)
            m = (dist[wname][:, None, :] * xi.square()).sum(-1)  # (N, P)
            token_sum[s] += reach[wname] @ m
            xis.append(xi.transpose(1, 2).reshape(n * V, P))  # (N*V, P)
            ms.append(m)
        states.append({"tokens": lv["tokens"], "prompt": lv["prompt"],
                       "depth": torch.full((n,), depth, device=dev), "reach": reach["p"],
                       "probs": dist["p"], "token_fisher": token_fisher(za, J),
                       "uniform": token_fisher(torch.zeros_like(za), J)})
        # children: row b*V + a is state b followed by token a
        ch = hist.repeat_interleave(V, dim=1)  # (S, N*V, T, P)
        ch[:, :, depth, :] = torch.stack(xis)
        cg = (g + torch.stack(ms)).repeat_interleave(V, dim=1)  # (S, N*V, P)
        cr = {k: (reach[k][:, None] * dist[k]).reshape(-1) for k in ("p", "q")}  # (N*V,)
        logp = torch.log_softmax(tm.logits(th_grad, W).to(acc), -1)  # (N, V), differentiable
        cr_grad = (reach_grad[:, None] * logp.exp()).reshape(-1)
        term = lv["term"]
        for key, val in (("p", cr["p"]), ("q", cr["q"]), ("grad", cr_grad)):
            done[key].append(val[term])
        done["hist"].append(ch[:, term])
        done["g"].append(cg[:, term])
        keep = ~term
        reach = {k: v[keep] for k, v in cr.items()}
        reach_grad, hist, g = cr_grad[keep], ch[:, keep], cg[:, keep]
    R = torch.as_tensor(np.concatenate([lv["rewards"] for lv in levels]), dtype=acc, device=dev)
    wp, wq = torch.cat(done["p"]), torch.cat(done["q"])
    H, G = torch.cat(done["hist"], dim=1), torch.cat(done["g"], dim=1)
    (grad_ad,) = torch.autograd.grad(torch.cat(done["grad"]) @ R, th_grad)
    out_streams = {}
    for s, (name, wname, _) in enumerate(streams):
        res = _finish(wp if wname == "p" else wq, wp, R, H[s], G[s], task.baseline)
        res["token_fisher_sum"] = token_sum[s]
        out_streams[name] = {k: _np(v) for k, v in res.items()}
    live = wp > 0  # responses the policy can produce
    h0 = H[0].sum(dim=1)  # (M, P)
    ranges = {q: _np((x[live] - x[live].T.matmul(wp[live]) / wp[live].sum()).abs().amax(0))
              for q, x in (("sequence_fisher", h0 * h0), ("token_fisher_sum", G[0]))}
    return {"streams": out_streams, "gradient_autodiff": _np(grad_ad), "ranges": ranges,
            "states": _sorted_states(states),
            "sequences": _sorted_sequences(levels, wp, wq, R, T)}


def _np(x):
    x = x.detach()
    return x.to("cpu", torch.float64).numpy() if x.ndim else float(x)


def _sorted_states(states):
    out = {k: torch.cat([s[k] for s in states]) for k in states[0]}
    out = {k: (_np(v) if v.is_floating_point() else v.cpu().numpy()) for k, v in out.items()}
    out["tokens"] = out["tokens"][:, :-1]  # (N, L-1): a state never holds all L tokens
    cols = [out["tokens"][:, c] for c in range(out["tokens"].shape[1] - 1, -1, -1)]
    order = np.lexsort(cols + [out["depth"], out["prompt"]])
    return {k: v[order] for k, v in out.items()}


def _sorted_sequences(levels, wp, wq, R, T):
    resp = [r for lv in levels for r in lv["responses"]]
    tokens = np.full((len(resp), T), -1, dtype=np.int64)  # (M, T)
    for i, (_, r) in enumerate(resp):
        tokens[i, :len(r)] = r
    prompt = np.array([pi for pi, _ in resp], dtype=np.int64)
    cols = [tokens[:, c] for c in range(T - 1, -1, -1)]
    order = np.lexsort(cols + [prompt])
    out = {"tokens": tokens, "prompt": prompt, "prob": _np(wp), "sampler_prob": _np(wq),
           "reward": _np(R)}
    return {k: v[order] for k, v in out.items()}
