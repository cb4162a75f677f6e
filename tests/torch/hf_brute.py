"""An independent float64 brute force over a Hugging Face causal LM, for the torch tests.

No fisher_ref code: every response by recursion, every score by one
``torch.autograd.grad`` per token, and the module kept in float64 by a
``TorchFunctionMode`` of its own (fisher_ref uses a ``TorchDispatchMode`` below
autograd): any ``torch.float32`` / ``float16`` / ``bfloat16`` argument becomes
``torch.float64``, ``Tensor.float()`` becomes ``Tensor.double()``, torch's default dtype
is float64, and every tensor a torch function returns is checked to be float64 (else
:class:`AssertionError`), so the reference is demonstrably float64 end to end.
"""
import torch
from torch.overrides import TorchFunctionMode

LOW = (torch.float32, torch.float16, torch.bfloat16)
TO_DOUBLE = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}


class Float64Functions(TorchFunctionMode):
    """Rewrites low floating dtypes in torch-function arguments to float64 and checks
    every floating result is float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in TO_DOUBLE:
            return args[0].double()
        swap = lambda x: torch.float64 if x in LOW else x  # noqa: E731
        args = tuple(swap(a) if isinstance(a, torch.dtype) else a for a in args)
        kwargs = {k: swap(v) if isinstance(v, torch.dtype) else v for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor) and o.is_floating_point():
                assert o.dtype == torch.float64, f"{func} returned {o.dtype}"
        return out


def float64_logits(module, ids):
    """``module(ids)``'s last-position logits with every op in float64."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with Float64Functions():
            out = module(input_ids=ids) if hasattr(module, "config") else module(ids)
    finally:
        torch.set_default_dtype(old)
    out = getattr(out, "logits", out)
    return out[:, -1] if out.ndim == 3 else out


def brute_force(module, params, prompts, weights, T, V, eos, bos, reward, temperature=None,
                baseline="mean", logits=float64_logits, sampler=None):
    """Every quantity of every stream by enumeration.

    Args:
        module: float64 module in eval mode.
        params: the tensors theta is made of (a list, in layout order).
        temperature: the sampler ``mu = softmax(z / temperature)``, or ``None``.
        sampler: a second module, the sampler ``mu = softmax(its logits)`` (instead of a
            temperature).

    Returns:
        ``{stream: {quantity: numpy}}`` plus ``"gradient_autodiff"`` and
        ``"states.token_fisher"`` (states sorted by prompt, depth, tokens).
    """
    def log_probs(state):
        ids = torch.tensor([([bos] if bos is not None else []) + list(state)])
        return torch.log_softmax(logits(module, ids)[0, :V], dim=-1)  # (V,)

    def scores(lp):
        rows = []
        for a in range(V):
            g = torch.autograd.grad(lp[a], params, retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1)
                                   for x, p in zip(g, params)]).detach())
        return torch.stack(rows)  # (V, P): j_a - logsumexp' = score of token a

    visits, resp = [], []

    def visit(pi, state, depth, rp, rq, hist, logP):
        lp = log_probs(state)
        p = lp.exp().detach()
        sc = scores(lp)  # (V, P) policy scores xi_a = j_a - jbar_p
        z = lp.detach()
        if sampler is not None:
            ids = torch.tensor([([bos] if bos is not None else []) + list(state)])
            with torch.no_grad():
                mu = torch.softmax(logits(sampler, ids)[0, :V], -1)
        else:
            mu = p if temperature is None else torch.softmax(z / temperature, -1)
        jbar_shift = (mu[:, None] * sc).sum(0)  # jbar_mu - jbar_p
        visits.append(dict(pi=pi, state=tuple(state), depth=depth, rp=rp, rq=rq, p=p, mu=mu,
                           sc=sc, shift=jbar_shift))
        for a in range(V):
            h = hist + [(sc[a], sc[a] - jbar_shift)]
            if depth + 1 == T or (eos and a == 0):
                y = tuple(state[len(prompts[pi]):]) + (a,)
                resp.append(dict(pi=pi, P=rp * p[a], Q=rq * mu[a], R=reward(prompts[pi], y),
                                 hist=h, logP=logP + lp[a]))
            else:
                visit(pi, state + [a], depth + 1, rp * p[a], rq * mu[a], h, logP + lp[a])

    for pi, pr in enumerate(prompts):
        w = torch.tensor(weights[pi], dtype=torch.float64)
        visit(pi, list(pr), 0, w, w, [], 0.0)

    streams = {"policy": ("P", 0, "p")}
    if temperature is not None or sampler is not None:
        streams.update(raw=("Q", 0, "mu"), centered=("Q", 1, "mu"))
    R = torch.tensor([r["R"] for r in resp], dtype=torch.float64)
    Pw = torch.stack([r["P"] for r in resp])
    P = len(torch.cat([p.reshape(-1) for p in params]))
    out = {}
    for name, (wk, c, dist) in streams.items():
        w = torch.stack([r[wk] for r in resp])  # (M,)
        hist = torch.zeros(len(resp), T, P, dtype=torch.float64)
        for m, r in enumerate(resp):
            for t, x in enumerate(r["hist"]):
                hist[m, t] = x[c]
        h = hist.sum(1)  # (M, P)
        F = w @ h ** 2
        ER = w @ R
        b = ER if baseline == "mean" else baseline
        std = torch.sqrt(w @ (R - ER) ** 2)
        rho = torch.where(w > 0, Pw / w, torch.zeros_like(w))
        moments = []
        for v in visits:
            q = v["p"] if dist == "p" else v["mu"]
            xi = v["sc"] - (v["shift"] if c else 0)  # (V, P)
            reach = v["rp"] if wk == "P" else v["rq"]
            moments.append(reach * (q[:, None] * xi ** 2).sum(0))
        out[name] = {
            "score_mean": w @ h, "sequence_fisher": F, "token_fisher_sum": sum(moments),
            "cross_terms": torch.einsum("m,mup,mtp->utp", w, hist, hist),
            "gradient": (w * (R - b)) @ h, "covariance": (w * (R - ER)) @ h,
            "bound": std * F.sqrt(), "reward_std": std, "expected_reward": ER,
            "importance_gradient": (w * rho * (R - b)) @ h}
    # the exact E[R] = sum_y w_x prod_t p(y_t|s_t) R(y), differentiated by autograd
    total = sum(weights[r["pi"]] * torch.exp(r["logP"]) * r["R"] for r in resp)
    g = torch.autograd.grad(total, params, allow_unused=True)
    out["gradient_autodiff"] = torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1)
                                          for x, p in zip(g, params)])
    order = sorted(range(len(visits)), key=lambda i: (visits[i]["pi"], visits[i]["depth"],
                                                      visits[i]["state"]))
    out["states.token_fisher"] = torch.stack([
        (visits[i]["p"][:, None] * visits[i]["sc"] ** 2).sum(0) for i in order])

    def np_(x):
        return {k: np_(v) for k, v in x.items()} if isinstance(x, dict) else \
            x.detach().numpy() if isinstance(x, torch.Tensor) else x
    return np_(out)


def plain_logits(module, ids):
    """``module(ids)``'s last-position logits as the module computes them (its own casts)."""
    out = getattr(module(input_ids=ids), "logits")
    return out[:, -1]
