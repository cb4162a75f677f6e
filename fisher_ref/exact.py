r"""The exact engine: every quantity of DESIGN §1 by enumerating every response.

It computes what :func:`fisher_ref.exact_reference.exact_reference` computes
— the same streams (``"policy"``; with a sampler ``"raw"``, ``"centered"``,
``"top{k}"``; see that module), every response-level expectation as a sum over
complete responses of probability times the response's own value, every
token-level one as a sum over states of reach times the state's value —
and nothing here assumes the identities of §1 that relate the two routes.

Speed without changing what is summed (the plain engine,
:func:`fisher_ref.exact_reference.exact_reference`, is the judge at 1e-10):

- everything a state computes (logits, ``j``, centers, scores) depends on the
  state only through its window of the last ``k`` tokens, so it is computed
  once per distinct window of a block and gathered;
- each open state carries its running score sum ``H`` and its score history;
  a complete response's ``h = H(parent) + xi(parent, a)`` is formed per
  response, so :math:`E[h^2]`, :math:`E[h^4]`, :math:`E[Ah]` stay sums of each
  response's own value;
- cross terms are the same finite sum over responses, grouped by parent: the
  responses ending at a block's children share the parent's history
  :math:`\xi_u` for ``u < depth``, so
  :math:`\sum_a w_a\,\xi_u\,\xi_t(a) = \xi_u \sum_a w_a\,\xi_t(a)`. This is
  only the distributive law on a finite sum over enumerated responses; it does
  not use that conditional score means vanish.
"""
from __future__ import annotations

import numpy as np

from .enumeration import DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, state_windows
from .exact_reference import (_autodiff_gradient, _check_support, _plan, _probs,
                              exact_reference, topk_center)
from .progress import Progress
from .results import ExactResult, Moments, finish_stream
from .rewards import evaluate_reward
from .sensitivities import sensitivities
from .token_fisher import mean_sensitivity, token_fisher, token_second_moment, uniform_token_fisher

__all__ = ["exact", "topk_center", "WINDOW_CACHE_BYTES"]

# Response-state rows gathered before one autodiff call (fewer calls, bounded memory).
_AUTODIFF_ROWS = 2 ** 16
# Bytes of per-window arrays kept between blocks (speed only; results do not depend on it).
WINDOW_CACHE_BYTES = 256 * 2 ** 20


def _softmax(z):
    """Row-wise softmax ``exp(z - max z) / sum`` of checked logits (``-inf`` gives 0)."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))  # (B, V)
    return e / e.sum(axis=-1, keepdims=True)


class _WindowCache:
    """Per-window arrays (probabilities, centered scores, token moments), computed
    once per distinct window of ``k`` tokens and reused by every state ending in it.

    Holds at most ``budget`` bytes: when a block's new windows would not fit, it
    is emptied first (memory stays bounded; only speed depends on the budget).
    """

    def __init__(self, task, streams, keep_states, budget=None):
        self.task, self.streams, self.keep = task, streams, keep_states
        V, P = task.model.vocab_size, task.model.num_params
        self.centers = list(dict.fromkeys(c for _, _, c in streams))
        per = 8 * (len(self.centers) * V * P + (2 * len(streams) + 6) * P + 2 * V)
        budget = WINDOW_CACHE_BYTES if budget is None else budget
        self.capacity = max(1, budget // per)
        self.base = (V + 1) ** np.arange(task.model.context, dtype=object)
        self.exact_keys = (V + 1) ** task.model.context < 2 ** 62
        self.clear()

    def clear(self):
        self.index, self.parts, self.n = {}, [], 0
        self.arrays = None

    def _keys(self, W):
        if self.exact_keys:
            return (W * self.base.astype(np.int64)).sum(axis=1).tolist()  # (B,)
        return [tuple(r) for r in W.tolist()]

    def rows(self, W):
        """Row of each window of ``W (B, k)`` in :attr:`arrays` (computing new ones)."""
        keys = self._keys(W)
        new = {}
        for i, key in enumerate(keys):
            if key not in self.index and key not in new:
                new[key] = i
        if new:
            if self.n + len(new) > self.capacity:
                self.clear()
                return self.rows(W) if len(set(keys)) <= self.capacity else self._uncached(W)
            for key in new:
                self.index[key] = self.n
                self.n += 1
            self.parts.append(self._compute(W[list(new.values())]))
            self.arrays = None
        if self.arrays is None:
            self.parts = [{k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}]
            self.arrays = self.parts[0]
        return self.arrays, np.array([self.index[k] for k in keys], dtype=np.int64)

    def _uncached(self, W):
        Wu, inv = np.unique(W, axis=0, return_inverse=True)
        return self._compute(Wu), inv.ravel()

    def _compute(self, Wu):
        """Arrays of distinct windows ``Wu (U, k)``."""
        task, theta = self.task, self.task.theta
        pu, qu = _probs(task, theta, Wu, softmax=_softmax)  # (U, V) each
        J = sensitivities(task.model, theta, Wu)  # (U, P, V)
        if not np.isfinite(J).all():
            raise ValueError("non-finite logit sensitivities (check the model's derivatives)")
        jbar = {"p": mean_sensitivity(pu, J), "q": mean_sensitivity(qu, J)}  # (U, P)
        dist = {"p": pu, "q": qu}
        out = {"p": pu, "q": qu}
        for c in self.centers:
            center = jbar[c] if isinstance(c, str) else topk_center(qu, J, c)  # (U, P)
            xi = J - center[:, :, None]  # (U, P, V): the score of every candidate token
            out[f"xiT{c}"] = np.ascontiguousarray(xi.transpose(0, 2, 1))  # (U, V, P)
            out[f"center{c}"] = center
        for s, (_, wname, c) in enumerate(self.streams):
            out[f"m{s}"] = token_second_moment(dist[wname], J, out[f"center{c}"])  # (U, P)
            out[f"cond{s}"] = np.einsum("uv,uvp->up", dist[wname], out[f"xiT{c}"])  # E[xi|s]
        if self.keep:
            out["token_fisher"] = token_fisher(pu, J)
            out["uniform"] = uniform_token_fisher(J)
            out["score_mean"] = np.einsum("uv,uvp->up", pu, out["xiTp"])
            if task.sampler is not None:
                out["sampler_token_fisher"] = token_fisher(qu, J)
                out["raw_score_mean"] = np.einsum("uv,uvp->up", qu, out["xiTp"])
        return out


def _roots(task, S, P, L):
    n = len(task.prompts)
    tokens = np.full((n, L + 1), -1, dtype=np.int64)
    for i, pr in enumerate(task.prompts):
        tokens[i, :len(pr)] = pr
    w = task.prompt_weights.astype(float)
    return {"prompt": np.arange(n), "tokens": tokens,
            "length": np.array([len(p) for p in task.prompts], dtype=np.int64), "depth": 0,
            "rp": w.copy(), "rq": w.copy(),
            "hist": np.zeros((S, n, task.max_len, P)),  # (S, n, T, P) scores so far
            "H": np.zeros((S, n, P)),  # running score sum
            "G": np.zeros((S, n, P))}  # running path sum of m


def _take(block, idx):
    """Rows ``idx`` (slice or index array) of a block."""
    out = {k: (v[idx] if isinstance(v, np.ndarray) and v.ndim and k not in ("hist", "H", "G")
               else v) for k, v in block.items()}
    for k in ("hist", "H", "G"):
        out[k] = block[k][:, idx]
    return out


def _flush_autodiff(task, pending):
    """:func:`_autodiff_gradient` of the pending responses in one call; empties ``pending``."""
    if not pending:
        return 0.0
    parts = [np.concatenate(a) for a in zip(*pending)]
    pending.clear()
    return _autodiff_gradient(task, task.theta, *parts)


def _responses(task, done, plen):
    """Response tokens ``(M, T)`` (-1 padded) and rewards ``(M,)`` of complete rows."""
    T = task.max_len
    M = done["tokens"].shape[0]
    n_resp = done["length"] - plen  # (M,)
    col = plen[:, None] + np.arange(T)[None, :]  # (M, T)
    resp = done["tokens"][np.arange(M)[:, None], np.minimum(col, done["tokens"].shape[1] - 1)]
    resp = np.where(np.arange(T)[None, :] < n_resp[:, None], resp, -1)  # (M, T)
    R = np.array([evaluate_reward(task.reward, task.prompts[pi], r[:k].tolist())
                  for pi, r, k in zip(done["prompt"], resp, n_resp)], dtype=float)
    return resp, R


def exact(task, *, topk=(), chunk=None, keep_states="auto", keep_sequences="auto",
          max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES, progress=True,
          reference=False):
    r"""Every quantity of DESIGN §1 for ``task``, exactly, in float64.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        topk: with a sampler, also center with only the top-``k`` tokens of ``mu``
            for each ``k`` here (what partial knowledge of ``mu`` costs).
        chunk: states per block (default: sized to about 256 MiB of work arrays).
        keep_states, keep_sequences: keep the per-state / per-response arrays
            (``"auto"``: when they fit in about 1 GiB).
        max_seconds, max_bytes: refuse (:class:`EnumerationTooLarge`) past these.
        progress: show a progress bar on stderr once the run exceeds 2 s.
        reference: run the plain engine
            (:func:`fisher_ref.exact_reference.exact_reference`) instead.

    Returns:
        :class:`fisher_ref.results.ExactResult`.

    Example:
        >>> from fisher_ref import load_config, exact
        >>> r = exact(load_config("default"))
        >>> bool(np.allclose(r.sequence_fisher, r.token_fisher_sum, rtol=1e-10, atol=0))
        True
    """
    if reference:
        return exact_reference(task, topk=topk, chunk=chunk, keep_states=keep_states,
                               keep_sequences=keep_sequences, max_seconds=max_seconds,
                               max_bytes=max_bytes, progress=progress)
    model, T = task.model, task.max_len
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
    cache = _WindowCache(task, streams, keep_states)
    pending, n_pending = [], 0  # complete responses awaiting one autodiff call
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
        arr, inv = cache.rows(W)  # per-window arrays, (B,) row of each state
        p, q = arr["p"][inv], arr["q"][inv]  # (B, V)
        if task.sampler is not None:
            _check_support(block, p, q)
        reach = {"p": block["rp"], "q": block["rq"]}
        xiT, ms = [], []
        for s, (name, wname, cname) in enumerate(streams):
            m = arr[f"m{s}"][inv]  # (B, P)
            moments[name].add_states(reach[wname], m, arr[f"cond{s}"][inv], depth)
            xiT.append(arr[f"xiT{cname}"])  # (U, V, P)
            ms.append(m)
        if keep_states:
            rec = {"tokens": block["tokens"][:, :L - 1].copy(), "prompt": block["prompt"],
                   "depth": np.full(n, depth), "reach": block["rp"], "probs": p}
            rec.update({k: arr[k][inv] for k in ("token_fisher", "uniform", "score_mean")})
            if task.sampler is not None:
                rec.update({"sampler_reach": block["rq"], "sampler_probs": q})
                rec.update({k: arr[k][inv] for k in ("sampler_token_fisher", "raw_score_mean")})
            states.append(rec)
        bar.update(n)
        # children: row b*V + a is state b followed by token a
        a_tok = np.tile(np.arange(V), n)  # (B*V,)
        term = (depth + 1 == T) | ((a_tok == 0) & model.eos)  # (B*V,)
        rp_c = (block["rp"][:, None] * p).ravel()  # (B*V,)
        rq_c = (block["rq"][:, None] * q).ravel()
        G = block["G"] + np.stack(ms)  # (S, B, P): path sums of m including this state

        def children(idx):
            par, tok = idx // V, idx % V  # (C,)
            tokens = block["tokens"][par]  # (C, L+1)
            tokens[np.arange(len(idx)), block["length"][par]] = tok
            rows = inv[par]
            xi_c = [x[rows, tok] for x in xiT]  # S arrays (C, P)
            return par, xi_c, {"prompt": block["prompt"][par], "tokens": tokens,
                               "length": block["length"][par] + 1, "depth": depth + 1,
                               "rp": rp_c[idx], "rq": rq_c[idx]}

        if term.any():
            idx = np.flatnonzero(term)
            par, xi_c, done = children(idx)
            plen = prompt_len_all[done["prompt"]]
            resp, R = _responses(task, done, plen)
            starts = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])  # parent groups
            pg = par[starts]  # (Pn,) parents with complete children
            for s, (name, wname, _) in enumerate(streams):
                w = done["rp" if wname == "p" else "rq"]  # (C,)
                h = block["H"][s, par] + xi_c[s]  # (C, P): each response's own h
                moments[name].add_responses_grouped(
                    w, R, h, done["rp"], starts, G[s, pg], block["hist"][s, pg, :depth],
                    xi_c[s], depth)
            pending.append((done["tokens"], done["length"], plen,
                            task.prompt_weights[done["prompt"]], R))
            n_pending += len(R)
            if n_pending * T >= _AUTODIFF_ROWS:
                grad_ad += _flush_autodiff(task, pending)
                n_pending = 0
            if keep_sequences:
                seqs.append({"tokens": resp, "prompt": done["prompt"], "prob": done["rp"],
                             "sampler_prob": done["rq"], "reward": R})
        if not term.all():
            idx = np.flatnonzero(~term)
            par, xi_c, child = children(idx)
            hist = block["hist"][:, par]  # (S, C, T, P)
            Hc = block["H"][:, par]  # (S, C, P)
            for s in range(S):
                hist[s, :, depth, :] = xi_c[s]
                Hc[s] += xi_c[s]
            child.update({"hist": hist, "H": Hc, "G": G[:, par]})
            stack.append(child)
    grad_ad += _flush_autodiff(task, pending)
    bar.close()
    results = {name: finish_stream(moments[name], task.baseline) for name, _, _ in streams}
    return ExactResult.build(task, cost, results, grad_ad, states, seqs)
