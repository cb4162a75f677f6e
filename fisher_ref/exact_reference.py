r"""The plain (reference) exact engine, kept as the judge of :mod:`fisher_ref.exact`.

It carries every response's full score history and sums every response-level
quantity response by response; :func:`fisher_ref.exact.exact` regroups the same
finite sums to run faster and is tested against this one at 1e-10 relative.

One depth-first pass over the prefix tree feeds several *streams*. A stream is
a pair (distribution the responses are drawn from, centering of the score):

- ``"policy"`` — drawn from ``p``, centered at :math:`\bar j_p` (on-policy);
- ``"raw"`` — drawn from ``mu``, centered at :math:`\bar j_p` (the raw score);
- ``"centered"`` — drawn from ``mu``, centered at :math:`\bar j_\mu`;
- ``"top{k}"`` — drawn from ``mu``, centered with only the top-``k`` tokens of
  ``mu`` known (renormalised).

Every response-level expectation is a sum over complete responses of
probability times the response's own value (:math:`h`, :math:`h^2`,
:math:`\xi_u\xi_t`, :math:`A h`); every token-level one is a sum over states
of reach probability times the state's value. The identities of §1 relate the
two routes; nothing here assumes them.
"""
from __future__ import annotations

import numpy as np
from autograd import grad
import autograd.numpy as anp

from .enumeration import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, check_cost,
                          estimate_cost, state_windows)
from .model import log_softmax
from .progress import Progress
from .results import ExactResult, Moments, finish_stream
from .rewards import evaluate_reward
from .sensitivities import sensitivities
from .token_fisher import mean_sensitivity, token_fisher, token_second_moment, uniform_token_fisher

__all__ = ["exact_reference", "topk_center"]


def topk_center(q, sens, k):
    r"""Mean sensitivity under the top-``k`` tokens of ``q``, renormalised: ``(B, P)``."""
    if k >= q.shape[-1]:
        return mean_sensitivity(q, sens)
    thresh = -np.sort(-q, axis=-1)[:, k - 1:k]  # (B, 1)
    order = np.argsort(-q, axis=-1, kind="stable")
    keep = np.zeros_like(q, dtype=bool)
    np.put_along_axis(keep, order[:, :k], True, axis=-1)
    del thresh
    qk = np.where(keep, q, 0.0)
    qk = qk / qk.sum(axis=-1, keepdims=True)
    return mean_sensitivity(qk, sens)


def _check_topk(topk):
    """``topk`` as a tuple of positive integers (``k >= V`` means full centering)."""
    try:
        ks = tuple(topk)
    except TypeError:
        raise ValueError(f"topk must be a sequence of positive integers, got {topk!r}") from None
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"topk entries must be positive integers, got {k!r} in {topk!r}")
    return tuple(int(k) for k in ks)


def _streams(task, topk):
    if task.sampler is None:
        return [("policy", "p", "p")]
    out = [("policy", "p", "p"), ("raw", "q", "p"), ("centered", "q", "q")]
    out += [(f"top{k}", "q", k) for k in topk]
    return out


def _roots(task, n_streams, P, L):
    n = len(task.prompts)
    tokens = np.full((n, L + 1), -1, dtype=np.int64)
    for i, pr in enumerate(task.prompts):
        tokens[i, :len(pr)] = pr
    lengths = np.array([len(p) for p in task.prompts], dtype=np.int64)
    w = task.prompt_weights.astype(float)
    return {"prompt": np.arange(n), "tokens": tokens, "length": lengths, "depth": 0,
            "rp": w.copy(), "rq": w.copy(),
            "hist": np.zeros((n_streams, n, task.max_len, P)),
            "g": np.zeros((n_streams, n, P))}


def _take(block, sl):
    out = {k: (v[sl] if isinstance(v, np.ndarray) and k not in ("hist", "g") else v)
           for k, v in block.items()}
    out["hist"] = block["hist"][:, sl]
    out["g"] = block["g"][:, sl]
    return out


def _check_logits(z, W, V, who):
    if z.shape != (W.shape[0], V):
        raise ValueError(f"the {who} returned logits of shape {z.shape} for {W.shape[0]} "
                         f"windows; expected ({W.shape[0]}, {V}) (V={V})")


def _softmax_via_log(z):
    return np.exp(log_softmax(z))


def _probs(task, theta, W, softmax=_softmax_via_log):
    """Policy and sampler probabilities ``(B, V)`` each, with the logits checked."""
    z = np.asarray(task.model.logits(theta, W), dtype=float)  # (B, V)
    _check_logits(z, W, task.model.vocab_size, "model")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError("the model returned NaN or +inf logits")
    if np.isneginf(z).all(axis=-1).any():
        raise ValueError("the model returned a state whose logits are all -inf")
    p = softmax(z)  # (B, V)
    if task.sampler is None:
        return p, p
    zq = np.asarray(task.sampler.logits(task.model, theta, W), dtype=float)
    _check_logits(zq, W, task.model.vocab_size, "sampler")
    if np.isnan(zq).any() or np.isposinf(zq).any() or np.isneginf(zq).all(axis=-1).any():
        raise ValueError("the sampler returned NaN, +inf or all -inf logits")
    return p, softmax(zq)


def _check_support(block, p, q):
    bad = (p > 0) & (q == 0) & (block["rp"][:, None] > 0)
    if bad.any():
        b, a = map(int, np.argwhere(bad)[0])
        state = block["tokens"][b, :block["length"][b]].tolist()
        raise ValueError(
            f"the sampler gives probability 0 to token {a} at state {state} (prompt "
            f"{int(block['prompt'][b])}), which the policy emits with probability {p[b, a]:.3g}; "
            "responses the policy can produce would never be sampled, so importance "
            "weights p/mu are undefined there")


def _autodiff_gradient(task, theta, tokens, lengths, prompt_len, weights, R):
    r"""grad_theta of :math:`\sum_m w_m \prod_t p(y_t|s_t) R_m` over responses (autograd).

    The logits of each distinct window are evaluated once and gathered (the same
    function of theta, without repeated rows)."""
    M, T = tokens.shape[0], task.max_len
    t = np.arange(T)[None, :]
    mask = (t < (lengths - prompt_len)[:, None]).astype(float)  # (M, T)
    state_len = np.minimum(prompt_len[:, None] + t, lengths[:, None] - 1)  # (M, T)
    W = state_windows(np.repeat(tokens, T, axis=0), state_len.ravel(), task.model.context,
                      task.model.bos)  # (M*T, k)
    Wu, inv = np.unique(W, axis=0, return_inverse=True)  # (U, k), (M*T,)
    nxt = tokens[np.arange(M)[:, None], state_len].ravel()  # (M*T,)
    flat = inv.ravel() * task.model.vocab_size + nxt  # (M*T,) into the (U*V,) log-probs

    def expected_reward(th):
        lp = anp.reshape(log_softmax(task.model.logits(th, Wu)), (-1,))[flat]  # (M*T,)
        logP = anp.sum(anp.reshape(lp, (M, T)) * mask, axis=1)  # (M,)
        return anp.sum(weights * anp.exp(logP) * R)

    return grad(expected_reward)(theta)


def _plan(task, topk, chunk, keep_states, keep_sequences, max_seconds, max_bytes):
    """Validate the engine's arguments, size the run and refuse it past the limits.

    Returns:
        ``(streams, cost, keep_states, keep_sequences)`` with the ``"auto"`` choices
        resolved (keep the arrays when they fit in about 1 GiB).
    """
    P, T = task.model.num_params, task.max_len
    topk = _check_topk(topk)
    if topk and task.sampler is None:
        raise ValueError("topk centering needs a sampler mu; this task is on-policy "
                         "(add a 'sampler' to the task)")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer))
                              or chunk < 1):
        raise ValueError(f"chunk must be a positive integer (states per block) or None, "
                         f"got {chunk!r}")
    streams = _streams(task, topk)
    cost = estimate_cost(task, n_streams=len(streams), chunk=chunk)
    if keep_states == "auto":
        keep_states = cost.n_states * P * 8 * 3 < 2 ** 30
    if keep_sequences == "auto":
        keep_sequences = cost.n_responses * (T + 6) * 8 < 2 ** 30
    cost = estimate_cost(task, n_streams=len(streams), chunk=chunk, keep_states=keep_states,
                         keep_sequences=keep_sequences)
    check_cost(cost, max_seconds, max_bytes)
    return streams, cost, keep_states, keep_sequences


def exact_reference(task, *, topk=(), chunk=None, keep_states="auto", keep_sequences="auto",
          max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES, progress=True):
    r"""The plain engine: the arguments and result of :func:`fisher_ref.exact.exact`.

    Every response carries its full score history and every response-level sum is
    taken response by response; it is slow, and it is the judge of the fast engine.

    Example:
        >>> from fisher_ref import load_config
        >>> r = exact_reference(load_config("default"))
        >>> bool(np.allclose(r.sequence_fisher, r.token_fisher_sum, rtol=1e-10, atol=0))
        True
    """
    model, theta, T = task.model, task.theta, task.max_len
    V, P = model.vocab_size, model.num_params
    streams, cost, keep_states, keep_sequences = _plan(
        task, topk, chunk, keep_states, keep_sequences, max_seconds, max_bytes)
    S, chunk = len(streams), cost.chunk
    L = max(len(p) for p in task.prompts) + T
    moments = {name: Moments(P, T) for name, _, _ in streams}
    grad_ad = np.zeros(P)
    states, seqs = [], []
    prompt_len_all = np.array([len(p) for p in task.prompts], dtype=np.int64)
    bar = Progress(cost.n_states, "exact enumeration", enabled=progress)
    stack = [_roots(task, S, P, L)]
    while stack:
        block = stack.pop()
        n = block["tokens"].shape[0]
        if n > chunk:
            stack.append(_take(block, slice(0, n - chunk)))
            block = _take(block, slice(n - chunk, n))
            n = chunk
        depth = block["depth"]
        W = state_windows(block["tokens"], block["length"], model.context, model.bos)  # (B, k)
        p, q = _probs(task, theta, W)  # (B, V) each
        if task.sampler is not None:
            _check_support(block, p, q)
        J = sensitivities(model, theta, W)  # (B, P, V)
        if not np.isfinite(J).all():
            raise ValueError("non-finite logit sensitivities (check the model's derivatives)")
        jbar = {"p": mean_sensitivity(p, J), "q": mean_sensitivity(q, J)}  # (B, P)
        dist = {"p": p, "q": q}
        reach = {"p": block["rp"], "q": block["rq"]}
        xis, ms = [], []
        for s, (name, wname, cname) in enumerate(streams):
            center = jbar[cname] if isinstance(cname, str) else topk_center(q, J, cname)
            xi = J - center[:, :, None]  # (B, P, V): the score of every candidate token
            m = token_second_moment(dist[wname], J, center)  # (B, P)
            cond_mean = np.einsum("bv,bpv->bp", dist[wname], xi)  # (B, P): E[xi | s], summed
            moments[name].add_states(reach[wname], m, cond_mean, depth)
            xis.append(xi)
            ms.append(m)
        if keep_states:
            rec = {"tokens": block["tokens"][:, :L - 1].copy(), "prompt": block["prompt"],
                   "depth": np.full(n, depth), "reach": block["rp"], "probs": p,
                   "token_fisher": token_fisher(p, J), "uniform": uniform_token_fisher(J),
                   "score_mean": np.einsum("bv,bpv->bp", p, xis[0])}
            if task.sampler is not None:
                rec.update({"sampler_reach": block["rq"], "sampler_probs": q,
                            "sampler_token_fisher": token_fisher(q, J),
                            "raw_score_mean": np.einsum("bv,bpv->bp", q, xis[0])})
            states.append(rec)
        bar.update(n)
        # children: row b*V + a is state b followed by token a
        a_tok = np.tile(np.arange(V), n)  # (B*V,)
        tokens = np.repeat(block["tokens"], V, axis=0)
        lengths = np.repeat(block["length"], V)
        tokens[np.arange(n * V), lengths] = a_tok
        lengths = lengths + 1
        hist = np.repeat(block["hist"], V, axis=1)  # (S, B*V, T, P)
        for s in range(S):
            hist[s, :, depth, :] = xis[s].transpose(0, 2, 1).reshape(n * V, P)
        g = np.repeat(block["g"] + np.stack(ms), V, axis=1)  # (S, B*V, P)
        child = {"prompt": np.repeat(block["prompt"], V), "tokens": tokens, "length": lengths,
                 "depth": depth + 1, "rp": (block["rp"][:, None] * p).ravel(),
                 "rq": (block["rq"][:, None] * q).ravel(), "hist": hist, "g": g}
        term = (depth + 1 == T) | ((a_tok == 0) & model.eos)  # (B*V,)
        if term.any():
            done = _take(child, term)
            plen = prompt_len_all[done["prompt"]]
            R = np.array([evaluate_reward(task.reward, task.prompts[pi],
                                          tk[pl:ln].tolist())
                          for pi, tk, pl, ln in zip(done["prompt"], done["tokens"], plen,
                                                    done["length"])])
            for s, (name, wname, _) in enumerate(streams):
                moments[name].add_responses(done["rp" if wname == "p" else "rq"], R,
                                            done["hist"][s], done["g"][s], done["rp"])
            w_x = task.prompt_weights[done["prompt"]]
            grad_ad += _autodiff_gradient(task, theta, done["tokens"], done["length"], plen,
                                          w_x, R)
            if keep_sequences:
                resp = np.full((len(R), T), -1, dtype=np.int64)
                for i, (tk, pl, ln) in enumerate(zip(done["tokens"], plen, done["length"])):
                    resp[i, :ln - pl] = tk[pl:ln]
                seqs.append({"tokens": resp, "prompt": done["prompt"], "prob": done["rp"],
                             "sampler_prob": done["rq"], "reward": R})
        if (~term).any():
            stack.append(_take(child, ~term))
    bar.close()
    baseline = task.baseline
    results = {}
    for name, wname, _ in streams:
        results[name] = finish_stream(moments[name], baseline)
    return ExactResult.build(task, cost, results, grad_ad, states, seqs)
